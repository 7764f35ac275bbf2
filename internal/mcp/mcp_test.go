package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcpv1alpha1 "istio.io/api/mcp/v1alpha1"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

const (
	vsType = "networking.istio.io/v1/VirtualService"
	drType = "networking.istio.io/v1/DestinationRule"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func vs(tb testing.TB, name string, hosts ...string) *Resource {
	tb.Helper()
	r, err := NewResource("default/"+name, &networking.VirtualService{Hosts: hosts}, map[string]string{"app": name}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// galley is a Server on a loopback port that can be stopped and restarted
// on the same address, as a galley pod restart looks to subscribers.
type galley struct {
	t    testing.TB
	addr string
	srv  *Server
	g    *grpc.Server
	done chan struct{}
	logs *testenv.SyncBuffer // the server's log, DEBUG included
}

// logLines are the lines of a log that contain all of subs.
func logLines(log *testenv.SyncBuffer, subs ...string) []string {
	var out []string
	for _, line := range strings.Split(log.String(), "\n") {
		if line != "" && !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(line, s) }) {
			out = append(out, line)
		}
	}
	return out
}

// testControlPlane is how test galleys name themselves in responses.
const testControlPlane = `{"Component":"flotilla-galley","ID":"galley-0"}`

// startGalley serves the collections on addr (a restart keeps its
// address) once initial, when given, is in the virtual services, as
// galley serves only its loaded configuration.
func startGalley(tb testing.TB, addr string, initial ...*Resource) *galley {
	tb.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &testenv.SyncBuffer{}
	srv, err := NewServer(ctx, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), noop.NewMeterProvider().Meter("test"), []string{vsType, drType})
	if err != nil {
		tb.Fatal(err)
	}
	if len(initial) > 0 {
		if _, err := srv.Update(vsType, initial, nil); err != nil {
			tb.Fatal(err)
		}
	}
	srv.Identify(&corev3.ControlPlane{Identifier: testControlPlane})
	g := grpc.NewServer()
	srv.Register(g)
	gl := &galley{t: tb, addr: lis.Addr().String(), srv: srv, g: g, done: make(chan struct{}), logs: logs}
	go func() {
		_ = g.Serve(lis)
		close(gl.done)
	}()
	stopped := false
	tb.Cleanup(func() {
		if !stopped {
			gl.stop()
		}
		cancel()
	})
	return gl
}

func (g *galley) stop() {
	g.g.Stop()
	<-g.done
}

func (g *galley) update(typeURL string, up []*Resource, del ...string) int {
	g.t.Helper()
	n, err := g.srv.Update(typeURL, up, del)
	if err != nil {
		g.t.Fatal(err)
	}
	return n
}

// recorder is a Handler that records every call.
type recorder struct {
	mu      sync.Mutex
	calls   []string // "type: +a +b -c"
	state   map[string]map[string]*Resource
	updated int
	fail    func(typeURL string, updated []*Resource) error
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{state: map[string]map[string]*Resource{}, changed: make(chan struct{}, 1000)}
}

func (r *recorder) Apply(typeURL string, updated []*Resource, removed []string) error {
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.changed <- struct{}{}
	}()
	if r.fail != nil {
		if err := r.fail(typeURL, updated); err != nil {
			r.calls = append(r.calls, typeURL+": rejected")
			return err
		}
	}
	call := typeURL + ":"
	if r.state[typeURL] == nil {
		r.state[typeURL] = map[string]*Resource{}
	}
	for _, u := range updated {
		call += " +" + u.Name
		r.state[typeURL][u.Name] = u
	}
	for _, name := range removed {
		call += " -" + name
		delete(r.state[typeURL], name)
	}
	r.updated += len(updated) + len(removed)
	r.calls = append(r.calls, call)
	return nil
}

func (r *recorder) names(typeURL string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for n := range r.state[typeURL] {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (r *recorder) get(typeURL, name string) *Resource {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state[typeURL][name]
}

// lastCall returns the last call for typeURL.
func (r *recorder) lastCall(typeURL string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.calls) - 1; i >= 0; i-- {
		if strings.HasPrefix(r.calls[i], typeURL+":") {
			return r.calls[i]
		}
	}
	return ""
}

func (r *recorder) changes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updated
}

// waitFor polls cond after each handler call, for up to 20 seconds.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-r.changed:
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s; calls: %v", what, r.calls)
		}
	}
}

func subscribe(t *testing.T, addr string, h Handler) *Client {
	t.Helper()
	return subscribeAs(t, addr, "discovery-0", h)
}

// subscribeAs is subscribe with node ID id.
func subscribeAs(t *testing.T, addr, id string, h Handler) *Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientOptions{
		Conn: conn, NodeID: id, Version: "1.2.3", TypeURLs: []string{vsType, drType}, Handler: h, Log: quiet(),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return c
}

func TestASubscriberReceivesEveryResourceThenUpdatesAndDeletions(t *testing.T) {
	g := startGalley(t, "")
	g.update(vsType, []*Resource{vs(t, "reviews", "reviews"), vs(t, "ratings", "ratings")})
	rec := newRecorder()
	c := subscribe(t, g.addr, rec)
	rec.waitFor(t, "both VirtualServices", func() bool { return len(rec.names(vsType)) == 2 })
	if got := c.ControlPlane().GetIdentifier(); got != testControlPlane {
		t.Fatalf("the responses named the server %q, want %q", got, testControlPlane)
	}

	updated := vs(t, "reviews", "reviews", "reviews.prod")
	updated.Created = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	updated.Generation = 7
	g.update(vsType, []*Resource{updated})
	rec.waitFor(t, "the update", func() bool {
		r := rec.get(vsType, "default/reviews")
		var spec networking.VirtualService
		return r != nil && r.Body.UnmarshalTo(&spec) == nil && len(spec.GetHosts()) == 2
	})
	g.update(vsType, nil, "default/ratings")
	rec.waitFor(t, "the deletion", func() bool { return slices.Equal(rec.names(vsType), []string{"default/reviews"}) })

	got := rec.get(vsType, "default/reviews")
	if got.Labels["app"] != "reviews" || got.Version == "" || !got.Created.Equal(updated.Created) || got.Generation != 7 {
		t.Fatalf("resource metadata lost: %+v", got)
	}
}

// TestADebugClientListsTheSubscribersWithTheirVersions: the Subscribers
// debug type, asked on the MCP port, names each subscriber with the
// version its node metadata gives, and the server as its responses do.
func TestADebugClientListsTheSubscribersWithTheirVersions(t *testing.T) {
	g := startGalley(t, "")
	rec := newRecorder()
	subscribe(t, g.addr, rec)
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var subs []debugapi.Subscriber
	var resp *discoveryv3.DiscoveryResponse
	rec.waitFor(t, "the subscriber listed", func() bool {
		if resp, err = debugapi.Fetch(t.Context(), conn, debugapi.Subscribers); err != nil {
			t.Fatal(err)
		}
		subs, err = debugapi.SubscribersOf(resp)
		return err == nil && len(subs) == 1
	})
	if s := subs[0]; s.ID != "discovery-0" || s.Version != "1.2.3" || s.Identity != "plaintext" || s.ConnectedAt.IsZero() {
		t.Fatalf("subscriber %+v", s)
	}
	if got := resp.GetControlPlane().GetIdentifier(); got != testControlPlane {
		t.Fatalf("answered as %q", got)
	}
}

// TestGalleyListsWhatEachSubscriberHasNotAnsweredOrHasRejected: of its
// subscribers, galley's debug answer says which collection's latest
// response each has left unanswered (since when) or rejected (why); one
// that applied everything shows neither.
func TestGalleyListsWhatEachSubscriberHasNotAnsweredOrHasRejected(t *testing.T) {
	g := startGalley(t, "", vs(t, "reviews", "reviews"))
	subscribeAs(t, g.addr, "current", newRecorder())
	rejecting := newRecorder()
	rejecting.fail = func(typeURL string, _ []*Resource) error {
		if typeURL == vsType {
			return errors.New("cannot apply a VirtualService")
		}
		return nil
	}
	subscribeAs(t, g.addr, "rejecting", rejecting)
	// A subscriber that reads a response and never answers it.
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "holding"}, TypeUrl: vsType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}

	var subs map[string]debugapi.Subscriber
	xdstest.Eventually(t, "each subscriber's state", func() bool {
		subs = subscribersByID(t, conn)
		// Each answer reaches galley on its own stream, in no set order:
		// the rejecting subscriber's acknowledgements may come after its
		// rejection.
		return len(subs) == 3 && len(subs["rejecting"].Rejected) == 1 && len(subs["rejecting"].Unanswered) == 0 &&
			len(subs["current"].Unanswered) == 0
	})
	if s := subs["current"]; len(s.Unanswered) != 0 || len(s.Rejected) != 0 {
		t.Errorf("a subscriber that applied everything: %+v", s)
	}
	if s := subs["rejecting"]; !strings.Contains(s.Rejected[vsType], "cannot apply a VirtualService") || len(s.Unanswered) != 0 {
		t.Errorf("a subscriber that rejected the virtual services: %+v", s)
	}
	if s := subs["holding"]; s.Unanswered[vsType].IsZero() || time.Since(s.Unanswered[vsType]) > time.Minute || len(s.Rejected) != 0 {
		t.Errorf("a subscriber that never answered: %+v", s)
	}
	// Applying the next response clears a rejection.
	rejecting.mu.Lock()
	rejecting.fail = nil
	rejecting.mu.Unlock()
	g.update(vsType, []*Resource{vs(t, "reviews", "reviews", "reviews.v2")})
	xdstest.Eventually(t, "the rejection cleared", func() bool {
		s, ok := subscribersByID(t, conn)["rejecting"]
		return ok && len(s.Rejected) == 0 && len(s.Unanswered) == 0
	})
}

// subscribersByID asks the server on conn for its subscribers.
func subscribersByID(t *testing.T, conn grpc.ClientConnInterface) map[string]debugapi.Subscriber {
	t.Helper()
	resp, err := debugapi.Fetch(t.Context(), conn, debugapi.Subscribers)
	if err != nil {
		t.Fatal(err)
	}
	list, err := debugapi.SubscribersOf(resp)
	if err != nil {
		t.Fatal(err)
	}
	subs := map[string]debugapi.Subscriber{}
	for _, s := range list {
		subs[s.ID] = s
	}
	return subs
}

func TestUnchangedContentIsNotSentAgain(t *testing.T) {
	g := startGalley(t, "")
	if n := g.update(vsType, []*Resource{vs(t, "a", "a"), vs(t, "b", "b")}); n != 2 {
		t.Fatalf("first update changed %d", n)
	}
	if n := g.update(vsType, []*Resource{vs(t, "a", "a")}); n != 0 {
		t.Fatalf("same content changed %d", n)
	}
	if n := g.update(vsType, []*Resource{vs(t, "a", "a"), vs(t, "b", "b")}); n != 0 {
		t.Fatalf("the same world again changed %d", n)
	}
	if n := g.update(vsType, nil, "default/b", "default/never-published"); n != 1 {
		t.Fatalf("deleting b (and an unknown name) changed %d", n)
	}
	if _, err := g.srv.Update("nope/v1/Thing", nil, nil); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("unknown type: %v", err)
	}
}

func TestAfterAGalleyRestartTheSubscriberReceivesOnlyTheDifference(t *testing.T) {
	world := func(t *testing.T) []*Resource {
		t.Helper()
		var out []*Resource
		for i := range 50 {
			out = append(out, vs(t, fmt.Sprintf("svc-%02d", i), fmt.Sprintf("svc-%02d", i)))
		}
		return out
	}
	g := startGalley(t, "")
	g.update(vsType, world(t))
	rec := newRecorder()
	subscribe(t, g.addr, rec)
	rec.waitFor(t, "the world", func() bool { return len(rec.names(vsType)) == 50 })
	// And the (empty) DestinationRule collection's first response, or the
	// count of calls below would race with it.
	rec.waitFor(t, "both collections", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.calls) >= 2
	})
	before := rec.changes()

	// Same world after a restart: nothing to send.
	g.stop()
	g2 := startGalley(t, g.addr, world(t)...)
	rec.waitFor(t, "the resubscription", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.calls) >= 4 // one call per collection on the first subscription, then one empty resync per collection
	})
	if got := rec.changes() - before; got != 0 {
		t.Fatalf("a restart with the same world sent %d changes, want 0", got)
	}

	// One resource changed and one removed while the subscriber was away.
	g2.stop()
	w := world(t)
	w[7] = vs(t, "svc-07", "svc-07", "svc-07.changed")
	startGalley(t, g.addr, w[:49]...)
	rec.waitFor(t, "the difference", func() bool { return rec.changes()-before == 2 })
	last := rec.lastCall(vsType)
	if last != vsType+": +default/svc-07 -default/svc-49" && last != vsType+": -default/svc-49 +default/svc-07" {
		t.Fatalf("last change %q, want only svc-07 updated and svc-49 removed", last)
	}
}

func TestARejectedResponseIsNotResentUntilSomethingChanges(t *testing.T) {
	g := startGalley(t, "")
	g.update(vsType, []*Resource{vs(t, "bad", "bad")})
	rec := newRecorder()
	rec.fail = func(typeURL string, updated []*Resource) error {
		for _, u := range updated {
			if u.Name == "default/bad" {
				return errors.New("cannot use default/bad")
			}
		}
		return nil
	}
	c := subscribe(t, g.addr, rec)
	rec.waitFor(t, "the rejection", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.Contains(rec.calls, vsType+": rejected")
	})
	// A resend loop would call the handler thousands of times a second.
	time.Sleep(300 * time.Millisecond)
	rec.mu.Lock()
	rejections := 0
	for _, c := range rec.calls {
		if c == vsType+": rejected" {
			rejections++
		}
	}
	rec.mu.Unlock()
	if rejections != 1 {
		t.Fatalf("the rejected response was sent %d times, want once", rejections)
	}
	if len(c.Versions(vsType)) != 0 {
		t.Fatalf("the client holds versions of a rejected response: %v", c.Versions(vsType))
	}
	// A fix goes through.
	g.update(vsType, []*Resource{vs(t, "good", "good")}, "default/bad")
	rec.waitFor(t, "the fix", func() bool { return slices.Equal(rec.names(vsType), []string{"default/good"}) })
}

// sotwClient is a raw state-of-the-world ADS client, as Istio's MCP sinks are.
type sotwClient struct {
	t  *testing.T
	st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func dialSotw(t *testing.T, addr string) *sotwClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &sotwClient{t: t, st: st}
}

// dialDelta opens a raw delta stream to addr (over a connection with
// opts), closed when the test ends.
func dialDelta(t *testing.T, addr string, opts ...grpc.DialOption) discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (c *sotwClient) send(req *discoveryv3.DiscoveryRequest) {
	c.t.Helper()
	if err := c.st.Send(req); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next response's resource names.
func (c *sotwClient) recv() (*discoveryv3.DiscoveryResponse, []string) {
	c.t.Helper()
	resp, err := c.st.Recv()
	if err != nil {
		c.t.Fatal(err)
	}
	var names []string
	for _, a := range resp.GetResources() {
		var m mcpv1alpha1.Resource
		if err := proto.Unmarshal(a.GetValue(), &m); err != nil {
			c.t.Fatal(err)
		}
		names = append(names, m.GetMetadata().GetName())
	}
	return resp, names
}

func TestStateOfTheWorldSubscribersGetTheFullCollectionEveryTime(t *testing.T) {
	g := startGalley(t, "")
	g.update(vsType, []*Resource{vs(t, "a", "a"), vs(t, "b", "b")})
	c := dialSotw(t, g.addr)
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "istiod-sink"}, TypeUrl: vsType})
	resp, names := c.recv()
	if fmt.Sprint(names) != "[default/a default/b]" || resp.GetVersionInfo() == "" || resp.GetControlPlane().GetIdentifier() != testControlPlane {
		t.Fatalf("first response %v version %q from %q", names, resp.GetVersionInfo(), resp.GetControlPlane().GetIdentifier())
	}
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: vsType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})

	g.update(vsType, []*Resource{vs(t, "b", "b", "b2")})
	resp2, names := c.recv()
	if fmt.Sprint(names) != "[default/a default/b]" {
		t.Fatalf("after updating b the response holds %v, want the full state", names)
	}
	if resp2.GetVersionInfo() == resp.GetVersionInfo() {
		t.Fatal("version did not change")
	}
	// Reject it: the same state must not come back in a loop.
	c.send(&discoveryv3.DiscoveryRequest{
		TypeUrl: vsType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp2.GetNonce(),
		ErrorDetail: &status.Status{Message: "no"},
	})
	g.update(vsType, nil, "default/a")
	_, names = c.recv()
	if fmt.Sprint(names) != "[default/b]" {
		t.Fatalf("after a rejection and a change, got %v, want [default/b]", names)
	}
}

func TestAFreshStateOfTheWorldSubscriberWhoRejectsIsNotFlooded(t *testing.T) {
	g := startGalley(t, "")
	g.update(vsType, []*Resource{vs(t, "a", "a")})
	c := dialSotw(t, g.addr)
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sink"}, TypeUrl: vsType})
	resp, _ := c.recv()
	// It rejects its very first response: its version is still "".
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: vsType, ResponseNonce: resp.GetNonce(), ErrorDetail: &status.Status{Message: "no"}})
	got := make(chan []string, 1)
	go func() {
		_, names := c.recv()
		got <- names
	}()
	select {
	case names := <-got:
		t.Fatalf("the rejected state was sent again (%v) with nothing changed", names)
	case <-time.After(300 * time.Millisecond):
	}
	g.update(vsType, []*Resource{vs(t, "a", "a", "fixed")})
	select {
	case names := <-got:
		if fmt.Sprint(names) != "[default/a]" {
			t.Fatalf("got %v", names)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no response after a change")
	}
}

func TestManyCollectionsOnOneStateOfTheWorldStreamDoNotDeadlock(t *testing.T) {
	// go-control-plane's ADS loop buffers fewer responses than we have
	// collections; subscribing to all at once must still answer every one.
	var types []string
	for i := range 16 {
		types = append(types, fmt.Sprintf("test.flotilla.io/v1/Kind%02d", i))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := NewServer(ctx, quiet(), noop.NewMeterProvider().Meter("t"), types)
	if err != nil {
		t.Fatal(err)
	}
	for _, ty := range types {
		if _, err := srv.Update(ty, []*Resource{vs(t, "x", "x")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	g := grpc.NewServer()
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	c := dialSotw(t, lis.Addr().String())
	for _, ty := range types {
		c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: ty})
	}
	seen := map[string]bool{}
	for len(seen) < len(types) {
		resp, _ := c.recv()
		seen[resp.GetTypeUrl()] = true
	}
}

func TestEqualContentEncodesEquallyWhateverTheMapOrder(t *testing.T) {
	labels := map[string]string{}
	for i := range 50 {
		labels[fmt.Sprintf("label-%02d", i)] = "v"
	}
	var first []byte
	for range 20 {
		r, err := NewResource("ns/a", &networking.WorkloadEntry{Address: "10.0.0.1", Labels: labels}, labels, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := marshal(r.toProto())
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = b
		} else if string(b) != string(first) {
			t.Fatal("the same content encoded differently")
		}
	}
}

func TestASubscriberCannotSubscribeToMoreNamesThanTheLimitRequestByRequest(t *testing.T) {
	g := startGalley(t, "")
	st := dialDelta(t, g.addr)
	names := func(from, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("default/vs-%06d", from+i)
		}
		return out
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "greedy"}, TypeUrl: vsType, ResourceNamesSubscribe: names(0, 6_000)}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: drType, ResourceNamesSubscribe: names(6_000, 4_001)}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			if grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than 10000 names") {
				t.Fatalf("the stream ended with %v, want ResourceExhausted naming the limit", err)
			}
			return
		}
	}
}

// TestASubscriptionIsBoundedByBytesAndUnknownUnsubscribesBuyNothing: a
// delta stream that subscribes names and unsubscribes as many it never
// subscribed holds no more than the limit (the old count subtracted
// them), and one that subscribes fewer names than the limit but of more
// than a mebibyte together is refused.
func TestASubscriptionIsBoundedByBytesAndUnknownUnsubscribesBuyNothing(t *testing.T) {
	g := startGalley(t, "")
	names := func(prefix string, from, n, size int) []string {
		out := make([]string, n)
		for i := range out {
			name := fmt.Sprintf("%s-%06d", prefix, from+i)
			out[i] = name + strings.Repeat("x", max(0, size-len(name)))
		}
		return out
	}
	refused := func(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) error {
		for {
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
	}
	st := dialDelta(t, g.addr)
	for i := range 6 {
		req := &discoveryv3.DeltaDiscoveryRequest{
			Node: &corev3.Node{Id: "credit"}, TypeUrl: vsType,
			ResourceNamesSubscribe:   names("default/vs", i*2_000, 2_000, 0),
			ResourceNamesUnsubscribe: names("default/unknown", i*2_000, 2_000, 0),
		}
		if err := st.Send(req); err != nil {
			break // refused already
		}
	}
	if err := refused(st); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream subscribing 12000 names while unsubscribing 12000 unknown ones ended with %v, want ResourceExhausted", err)
	}
	st = dialDelta(t, g.addr)
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{
		Node: &corev3.Node{Id: "long"}, TypeUrl: vsType, ResourceNamesSubscribe: names("default/vs", 0, 1_100, 1_000),
	}); err != nil {
		t.Fatal(err)
	}
	if err := refused(st); grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "bytes of names") {
		t.Fatalf("a stream subscribing 1100 names of 1000 bytes ended with %v, want ResourceExhausted", err)
	}
	// A subscriber within the bounds is served.
	c := dialSotw(t, g.addr)
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "ok"}, TypeUrl: vsType, ResourceNames: names("default/vs", 0, 9_000, 0)})
	c.recv()
}

// TestAStreamAsksForAtMostSixtyFourCollectionsNotPublished: each
// collection asked for is state the stream holds; the type URLs are the
// subscriber's to make up.
func TestAStreamAsksForAtMostSixtyFourCollectionsNotPublished(t *testing.T) {
	g := startGalley(t, "")
	st := dialDelta(t, g.addr)
	for i := range maxUnpublishedTypes + 1 {
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "typo"}, TypeUrl: fmt.Sprintf("made.up/Kind%d", i)}); err != nil {
			break
		}
	}
	for {
		if _, err := st.Recv(); err != nil {
			if grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "collections not published") {
				t.Fatalf("the stream ended with %v, want ResourceExhausted", err)
			}
			return
		}
	}
}

// FuzzSubscriberRequests sends what the fuzzer makes of a delta and a
// state-of-the-world MCP request, three times each, on real streams:
// galley answers or ends the stream with a status, never fails, and a
// well-behaved subscriber is served afterwards.
func FuzzSubscriberRequests(f *testing.F) {
	seed := func(m proto.Message) []byte {
		b, _ := proto.Marshal(m)
		return b
	}
	f.Add(seed(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: vsType, ResourceNamesSubscribe: []string{"*"}}), seed(&discoveryv3.DiscoveryRequest{TypeUrl: drType}))
	f.Add(seed(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "nope", ResponseNonce: "7", ErrorDetail: &status.Status{Message: "no"}}),
		seed(&discoveryv3.DiscoveryRequest{TypeUrl: vsType, ResourceNames: []string{"", "*", "a/b"}, VersionInfo: "x"}))
	f.Add([]byte{0xff}, []byte{0x0a, 0x80})
	g := startGalley(f, "", vs(f, "r", "reviews"))
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	f.Fuzz(func(t *testing.T, deltaBytes, sotwBytes []byte) {
		node := &corev3.Node{Id: "fuzz"}
		var dreq discoveryv3.DeltaDiscoveryRequest
		if proto.Unmarshal(deltaBytes, &dreq) == nil {
			dreq.Node = node
			xdstest.SendAndDrain(func(ctx context.Context) (discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, error) {
				return ads.DeltaAggregatedResources(ctx)
			}, &dreq, 3)
		}
		var sreq discoveryv3.DiscoveryRequest
		if proto.Unmarshal(sotwBytes, &sreq) == nil {
			sreq.Node = node
			xdstest.SendAndDrain(func(ctx context.Context) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
				return ads.StreamAggregatedResources(ctx)
			}, &sreq, 3)
		}
		c := dialSotw(t, g.addr)
		c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "ok"}, TypeUrl: vsType})
		if _, names := c.recv(); len(names) != 1 {
			t.Fatalf("a well-behaved subscriber got %v after the fuzzed streams", names)
		}
	})
}

// TestSubscribersThatNeverReadDelayNoOtherSubscriber: galley's number of
// collections, five delta subscribers that ask for all of them and never
// read (64 KiB windows, far less than a collection), and a healthy
// subscriber that gets every one of ten edits.
func TestSubscribersThatNeverReadDelayNoOtherSubscriber(t *testing.T) {
	var types []string
	for i := range 20 {
		types = append(types, fmt.Sprintf("test.flotilla.io/Kind%02d", i))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(t.Context(), quiet(), noop.NewMeterProvider().Meter("test"), types)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("h", 200)
	hosts := make([]string, 500)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("%s-%03d.example.com", big, i)
	}
	for _, typ := range types {
		if _, err := srv.Update(typ, []*Resource{vs(t, "big", hosts...)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	for i := range 5 {
		st := dialDelta(t, lis.Addr().String(), grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		for _, typ := range types {
			if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: fmt.Sprintf("stuck-%d", i)}, TypeUrl: typ, ResourceNamesSubscribe: []string{"*"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := newRecorder()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := NewClient(ClientOptions{Conn: conn, NodeID: "healthy", TypeURLs: types, Handler: rec, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	rec.waitFor(t, "the first state", func() bool { return rec.get(types[0], "default/big") != nil })
	for i := range 10 {
		name := fmt.Sprintf("edit-%d", i)
		for _, typ := range types {
			if _, err := srv.Update(typ, []*Resource{vs(t, name, "reviews")}, nil); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		rec.waitFor(t, name, func() bool { return rec.get(types[len(types)-1], "default/"+name) != nil })
		t.Logf("edit %d reached the healthy subscriber in %s", i, time.Since(start).Round(time.Millisecond))
	}
}

// TestACollectionNotPublishedIsAnEmptyOneNotAClosedStream: Istio's pilot
// asks its config source for kinds galley does not publish; it gets an
// empty collection on the same stream (state of the world and delta), and
// the published ones as usual, every resource typed as Istio's MCP
// Resource.
func TestACollectionNotPublishedIsAnEmptyOneNotAClosedStream(t *testing.T) {
	g := startGalley(t, "", vs(t, "r", "reviews"))
	c := dialSotw(t, g.addr)
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "pilot"}, TypeUrl: "networking.istio.io/v1alpha3/EnvoyFilter"})
	resp, names := c.recv()
	if len(names) != 0 || resp.GetTypeUrl() != "networking.istio.io/v1alpha3/EnvoyFilter" {
		t.Fatalf("an unknown collection: %v %v, want it empty", resp, names)
	}
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: "networking.istio.io/v1alpha3/EnvoyFilter", VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: vsType})
	resp, names = c.recv()
	if resp.GetTypeUrl() != vsType || len(names) != 1 || resp.GetResources()[0].GetTypeUrl() != ResourceTypeURL {
		t.Fatalf("after it, the virtual services: %v (%v), want one typed %s", names, resp.GetResources(), ResourceTypeURL)
	}

	d := dialDelta(t, g.addr)
	if err := d.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "pilot"}, TypeUrl: "telemetry.istio.io/v1alpha1/Telemetry"}); err != nil {
		t.Fatal(err)
	}
	dr, err := d.Recv()
	if err != nil || dr.GetTypeUrl() != "telemetry.istio.io/v1alpha1/Telemetry" || len(dr.GetResources()) != 0 {
		t.Fatalf("delta, an unknown collection: %v, %v", dr, err)
	}
	if err := d.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: vsType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	dr, err = d.Recv()
	if err != nil || dr.GetTypeUrl() != vsType || len(dr.GetResources()) != 1 || dr.GetResources()[0].GetResource().GetTypeUrl() != ResourceTypeURL {
		t.Fatalf("delta, then the virtual services: %v, %v", dr, err)
	}
}

// TestAStreamSubscribesToNoMoreCollectionsThanAStuckSubscriberCanHold: a
// server may publish more collections than go-control-plane's delta
// channel holds responses, but one stream may subscribe to that many at
// most: the next is refused with ResourceExhausted.
func TestAStreamSubscribesToNoMoreCollectionsThanAStuckSubscriberCanHold(t *testing.T) {
	types := make([]string, MaxCollections+1)
	for i := range types {
		types[i] = fmt.Sprintf("test.flotilla.io/Kind%02d", i)
	}
	srv, err := NewServer(t.Context(), quiet(), noop.NewMeterProvider().Meter("test"), types)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	st := dialDelta(t, lis.Addr().String())
	for _, ty := range types {
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "greedy"}, TypeUrl: ty, ResourceNamesSubscribe: []string{"*"}}); err != nil {
			break
		}
	}
	got := 0
	for {
		if _, err := st.Recv(); err != nil {
			if grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "collections on one stream") {
				t.Fatalf("the stream ended with %v, want ResourceExhausted", err)
			}
			break
		}
		got++
	}
	if got > MaxCollections {
		t.Errorf("%d collections answered before the refusal, want at most %d", got, MaxCollections)
	}
}

// TestIstiosMeshConfigCollectionCarriesTheMeshConfigItself: Istio's pilot
// asks an MCP config source for "core/v1alpha1/MeshConfig" and reads the
// first resource's bytes as a MeshConfig (adsc); galley's raw alias of
// its mesh collection answers that, in state of the world and delta, and
// follows its updates, while the mesh collection itself keeps MCP
// Resources.
func TestIstiosMeshConfigCollectionCarriesTheMeshConfigItself(t *testing.T) {
	const meshType, istioType = "mesh.istio.io/v1alpha1/MeshConfig", "core/v1alpha1/MeshConfig"
	srv, err := NewServer(t.Context(), quiet(), noop.NewMeterProvider().Meter("test"), []string{meshType})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Alias(istioType, meshType, true); err != nil {
		t.Fatal(err)
	}
	if err := srv.Alias(istioType, meshType, true); err == nil {
		t.Fatal("the same alias twice was accepted")
	}
	if err := srv.Alias("core/v1alpha1/Other", "mesh.istio.io/v1alpha1/Nothing", true); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("an alias of an unknown collection: %v", err)
	}
	mesh := func(domain string) *Resource {
		r, err := NewResource("mesh", &meshv1alpha1.MeshConfig{TrustDomain: domain}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if _, err := srv.Update(meshType, []*Resource{mesh("one.example")}, nil); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	asIstioReadsIt := func(a *anypb.Any) string {
		t.Helper()
		m := &meshv1alpha1.MeshConfig{}
		if err := proto.Unmarshal(a.GetValue(), m); err != nil {
			t.Fatal(err)
		}
		return m.GetTrustDomain()
	}
	c := dialSotw(t, lis.Addr().String())
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "pilot"}, TypeUrl: istioType})
	resp, _ := c.recv()
	if len(resp.GetResources()) != 1 || asIstioReadsIt(resp.GetResources()[0]) != "one.example" ||
		resp.GetResources()[0].GetTypeUrl() != "type.googleapis.com/istio.mesh.v1alpha1.MeshConfig" {
		t.Fatalf("the Istio collection: %v", resp.GetResources())
	}
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: istioType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	if _, err := srv.Update(meshType, []*Resource{mesh("two.example")}, nil); err != nil {
		t.Fatal(err)
	}
	resp, _ = c.recv()
	if len(resp.GetResources()) != 1 || asIstioReadsIt(resp.GetResources()[0]) != "two.example" {
		t.Fatalf("after an update, the Istio collection: %v", resp.GetResources())
	}
	c.send(&discoveryv3.DiscoveryRequest{TypeUrl: meshType})
	resp, _ = c.recv()
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetTypeUrl() != ResourceTypeURL {
		t.Fatalf("the mesh collection itself: %v", resp.GetResources())
	}

	d := dialDelta(t, lis.Addr().String())
	if err := d.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "pilot"}, TypeUrl: istioType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	dr, err := d.Recv()
	if err != nil || len(dr.GetResources()) != 1 || asIstioReadsIt(dr.GetResources()[0].GetResource()) != "two.example" ||
		dr.GetResources()[0].GetResource().GetTypeUrl() != "type.googleapis.com/istio.mesh.v1alpha1.MeshConfig" {
		t.Fatalf("delta, the Istio collection: %v, %v", dr, err)
	}
}

// TestARestrictedCollectionIsRefusedToEveryOtherIdentity: a subscriber
// whose identity the restriction does not allow (here a plaintext one)
// has its stream ended with PermissionDenied when it asks for the
// collection, and is served the others on a new stream.
func TestARestrictedCollectionIsRefusedToEveryOtherIdentity(t *testing.T) {
	g := startGalley(t, "", vs(t, "r", "reviews"))
	g.srv.Restrict(drType, func(id string) bool { return id == "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery" })
	st := dialDelta(t, g.addr)
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "nosy"}, TypeUrl: drType}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			if grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not served to plaintext") {
				t.Fatalf("the stream ended with %v, want PermissionDenied", err)
			}
			break
		}
	}
	c := dialSotw(t, g.addr)
	c.send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "ok"}, TypeUrl: vsType})
	if _, names := c.recv(); len(names) != 1 {
		t.Fatalf("an unrestricted collection: %v", names)
	}
}

// TestASubscriberMeasuresItsLagFromWhenGalleyPublishedEachChange: each
// resource of a delta response says when the server published it; the
// client records its lag for changes it receives live, not for the
// resync that opens a subscription, and says whether it is subscribed;
// the published time changes no version (a second server publishing the
// same content later gives the same versions).
func TestASubscriberMeasuresItsLagFromWhenGalleyPublishedEachChange(t *testing.T) {
	before := time.Now()
	g := startGalley(t, "", vs(t, "reviews", "reviews"))
	var mu sync.Mutex
	published := map[string]time.Time{}
	applied := make(chan struct{}, 16)
	reader := sdkmetric.NewManualReader()
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := NewClient(ClientOptions{
		Conn: conn, NodeID: "discovery-0", TypeURLs: []string{vsType}, Log: quiet(),
		Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"),
		Handler: HandlerFunc(func(_ string, updated []*Resource, _ []string) error {
			mu.Lock()
			for _, r := range updated {
				published[r.Name] = r.Published
			}
			mu.Unlock()
			applied <- struct{}{}
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	publishedOf := func() time.Time {
		t.Helper()
		select {
		case <-applied:
		case <-time.After(20 * time.Second):
			t.Fatal("nothing applied")
		}
		mu.Lock()
		defer mu.Unlock()
		return published["default/reviews"]
	}
	// metric is the client's metric of that name, collected now.
	metric := func(name string) metricdata.Aggregation {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == name {
					return m.Data
				}
			}
		}
		return nil
	}
	subscribed := func() int64 {
		t.Helper()
		if g, ok := metric("flotilla.mcp.client.subscribed").(metricdata.Gauge[int64]); ok && len(g.DataPoints) == 1 {
			return g.DataPoints[0].Value
		}
		t.Fatal("no flotilla.mcp.client.subscribed")
		return -1
	}
	lags := func() (n uint64) {
		t.Helper()
		h, _ := metric("flotilla.mcp.client.lag").(metricdata.Histogram[float64])
		for _, dp := range h.DataPoints {
			if v, _ := dp.Attributes.Value("type_url"); v.AsString() != vsType {
				t.Errorf("lag recorded for %v", dp.Attributes)
			}
			n += dp.Count
		}
		return n
	}

	first := publishedOf()
	if first.Before(before) || first.After(time.Now()) {
		t.Fatalf("published %v, want between the server's start (%v) and now", first, before)
	}
	if n := lags(); n != 0 {
		t.Fatalf("%d lags recorded for the subscription's resync, want none", n)
	}
	g.update(vsType, []*Resource{vs(t, "reviews", "reviews", "reviews.v2")})
	if again := publishedOf(); !again.After(first) {
		t.Fatalf("the change says it was published at %v, not after the first version (%v)", again, first)
	}
	// The lag is recorded once the handler has returned.
	xdstest.Eventually(t, "one lag recorded for one live change", func() bool { return lags() == 1 })
	if s := subscribed(); s != 1 {
		t.Fatalf("subscribed %d while galley answers, want 1", s)
	}
	g.stop()
	xdstest.Eventually(t, "subscribed 0 once galley is gone", func() bool { return subscribed() == 0 })

	g2 := startGalley(t, "", vs(t, "reviews", "reviews", "reviews.v2"))
	other := subscribe(t, g2.addr, newRecorder())
	xdstest.Eventually(t, "the second server's version", func() bool { return len(other.Versions(vsType)) == 1 })
	if a, b := c.Versions(vsType), other.Versions(vsType); a["default/reviews"] != b["default/reviews"] {
		t.Fatalf("the same content published at another time has version %v, and %v", b, a)
	}
}

// A subscriber that reads once and goes (a flotilla command) is logged at
// DEBUG; one that stays (a discovery replica) at INFO, when it has stayed
// a second, and so is its end.
func TestACommandThatReadsOnceIsLoggedAtDebugAReplicaThatStaysAtInfo(t *testing.T) {
	g := startGalley(t, "", vs(t, "reviews", "reviews"))
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rec := newRecorder()
	c, err := NewClient(ClientOptions{Conn: conn, NodeID: "flotilla-wait~laptop", TypeURLs: []string{vsType}, Handler: rec, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	rec.waitFor(t, "the VirtualService", func() bool { return len(rec.names(vsType)) == 1 })
	cancel()
	<-done
	waitLog := func(what string, subs ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for len(logLines(g.logs, subs...)) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no log line of %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitLog("the command's end", "level=DEBUG", "subscriber disconnected", "flotilla-wait~laptop")

	stays := newRecorder()
	subscribeAs(t, g.addr, "discovery~r1", stays)
	waitLog("the replica at INFO", "level=INFO", "subscriber connected", "discovery~r1")
	time.Sleep(announceAfter) // the command's announcement, were it to come
	if got := logLines(g.logs, "level=INFO", "flotilla-wait"); len(got) != 0 {
		t.Fatalf("the command at INFO: %q", got)
	}
	if got := logLines(g.logs, "level=DEBUG", "subscriber connected", "flotilla-wait~laptop"); len(got) != 1 {
		t.Fatalf("the command's connection at DEBUG: %q", got)
	}
}
