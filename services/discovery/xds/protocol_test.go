package xds_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// harness is the ADS server on 127.0.0.1 fed by a store the test edits.
type harness struct {
	srv     *xds.Server
	store   *model.Store
	last    *model.PushContext
	version uint64
	conn    *grpc.ClientConn
	reader  *sdkmetric.ManualReader
	addr    string
}

// counter reads a counter's total over its attributes.
func (h *harness) counter(name string) int64 {
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// pushes reads the proxy_pushes counter for a decision.
func (h *harness) pushes(decision string) int64 {
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "flotilla.discovery.proxy_pushes" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, ok := dp.Attributes.Value("decision"); ok && v.AsString() == decision {
					return dp.Value
				}
			}
		}
	}
	return 0
}

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	return newHarnessWith(tb, xds.Options{})
}

// newHarnessWith is newHarness with o (its log and meter are the test's).
func newHarnessWith(tb testing.TB, o xds.Options) *harness {
	tb.Helper()
	reader := sdkmetric.NewManualReader()
	o.Log, o.Meter = quiet(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	srv, err := xds.New(o)
	if err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer(xds.ServerOption())
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return &harness{srv: srv, store: model.NewStore(), conn: cc, reader: reader, addr: lis.Addr().String()}
}

func (h *harness) push() {
	h.version++
	pc, cs := h.store.Build(model.BuildOptions{}, h.last, h.version)
	h.last = pc
	h.srv.Push(context.Background(), pc, cs, time.Now())
}

func service(name string, port uint32) *registryv1.Service {
	return &registryv1.Service{
		Hostname: name + ".default.svc.cluster.local", Name: name, Namespace: "default",
		Ports:      []*registryv1.ServicePort{{Name: "http", Number: port, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Addresses: []string{"10.96.0.1"},
	}
}

func endpoints(name string, ips ...string) *registryv1.EndpointSet {
	es := &registryv1.EndpointSet{ServiceHostname: name + ".default.svc.cluster.local", ServiceNamespace: "default", Shard: "0"}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, &registryv1.Endpoint{Address: ip, Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 8080}}})
	}
	return es
}

func node(id string, md map[string]any) *corev3.Node {
	st, _ := structpb.NewStruct(md)
	return &corev3.Node{Id: id, Metadata: st}
}

// stream is a raw ADS stream of either protocol whose responses arrive on
// a channel, so a test can also show that nothing arrives.
type stream[Req any, Resp interface{ GetTypeUrl() string }] struct {
	st interface {
		Send(Req) error
		Recv() (Resp, error)
	}
	resp chan Resp
	err  chan error
	// close ends the stream from the client's side, as a proxy whose
	// connection broke.
	close context.CancelFunc
}

// sotw is a raw state-of-the-world stream, delta a raw incremental one.
type (
	sotw  = stream[*discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse]
	delta = stream[*discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse]
)

// open starts a stream with start (a method of the ADS client) and its
// reading of responses; the stream ends with the test.
func open[Req any, Resp interface{ GetTypeUrl() string }, S interface {
	Send(Req) error
	Recv() (Resp, error)
}](t *testing.T, start func(context.Context, ...grpc.CallOption) (S, error),
) *stream[Req, Resp] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &stream[Req, Resp]{st: st, resp: make(chan Resp, 64), err: make(chan error, 1), close: cancel}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				s.err <- err
				return
			}
			s.resp <- r
		}
	}()
	return s
}

func (h *harness) sotw(t *testing.T) *sotw {
	t.Helper()
	return open[*discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse](t, discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn).StreamAggregatedResources)
}

func (h *harness) delta(t *testing.T) *delta {
	t.Helper()
	return open[*discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse](t, discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn).DeltaAggregatedResources)
}

func (s *stream[Req, Resp]) send(t *testing.T, req Req) {
	t.Helper()
	if err := s.st.Send(req); err != nil {
		t.Fatal(err)
	}
}

func (s *stream[Req, Resp]) next(t *testing.T) Resp {
	t.Helper()
	select {
	case r := <-s.resp:
		return r
	case err := <-s.err:
		t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10s")
	}
	var none Resp
	return none
}

// nothing checks that the stream gets no response for d, and stays open.
func (s *stream[Req, Resp]) nothing(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case r := <-s.resp:
		t.Fatalf("unexpected %s response", r.GetTypeUrl())
	case err := <-s.err:
		t.Fatalf("the stream ended: %v", err)
	case <-time.After(d):
	}
}

// endsWith waits, reading past responses, for the server to end the
// stream with code and a message containing msg.
func (s *stream[Req, Resp]) endsWith(t *testing.T, code codes.Code, msg string) {
	t.Helper()
	for {
		select {
		case err := <-s.err:
			if grpcstatus.Code(err) != code || !strings.Contains(err.Error(), msg) {
				t.Fatalf("the stream ended with %v, want %s containing %q", err, code, msg)
			}
			return
		case <-s.resp:
		case <-time.After(10 * time.Second):
			t.Fatal("the stream was not ended")
		}
	}
}

// ended waits for the server to end the stream, and reports whether it
// ended it with an OK status (a graceful end, not an error).
func (s *stream[Req, Resp]) ended(t *testing.T) bool {
	t.Helper()
	select {
	case r := <-s.resp:
		t.Fatalf("unexpected %s response while waiting for the stream to end", r.GetTypeUrl())
	case err := <-s.err:
		return errors.Is(err, io.EOF)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s")
	}
	return false
}

func ack(r *discoveryv3.DiscoveryResponse, names ...string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce(), ResourceNames: names}
}

// nack rejects r with msg, keeping the version kept, as Envoy does.
func nack(r *discoveryv3.DiscoveryResponse, kept, msg string) *discoveryv3.DiscoveryRequest {
	req := ack(r)
	req.VersionInfo = kept
	req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: msg}
	return req
}

const sidecarID = "sidecar~10.1.0.9~app-1.default~default.svc.cluster.local"

func TestBadNodesGetAnInvalidArgumentWithTheReason(t *testing.T) {
	h := newHarness(t)
	cases := map[string]*corev3.Node{
		"no node":           nil,
		"garbage id":        {Id: "not-an-istio-node"},
		"labels not a map":  node(sidecarID, map[string]any{"LABELS": 7.0}),
		"unknown generator": node(sidecarID, map[string]any{"GENERATOR": "xyz"}),
	}
	for name, n := range cases {
		t.Run(name, func(t *testing.T) {
			s := h.sotw(t)
			s.send(t, &discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType})
			select {
			case err := <-s.err:
				if grpcstatus.Code(err) != codes.InvalidArgument || grpcstatus.Convert(err).Message() == "" {
					t.Fatalf("error %v, want InvalidArgument with a reason", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the stream stayed open")
			}
		})
	}
	// The server is still fine for a good node.
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	if r := s.next(t); len(r.GetResources()) == 0 {
		t.Fatal("no clusters for a good node")
	}
}

func TestOversizedRequestsAreRefused(t *testing.T) {
	h := newHarness(t)
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{strings.Repeat("x", 5000)}})
	select {
	case err := <-s.err:
		if grpcstatus.Code(err) != codes.InvalidArgument {
			t.Fatalf("error %v, want InvalidArgument", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a 5000-byte resource name was accepted")
	}
}

func TestARejectedVersionIsNotSentAgainUntilTheConfigChanges(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	r := s.next(t)
	s.send(t, nack(r, "", "test says no"))
	// A push with the same content for this proxy sends nothing.
	h.store.PutService(service("a", 80))
	h.push()
	s.nothing(t, 300*time.Millisecond)
	st := h.srv.Status()
	if len(st) != 1 || st[0].Types[0].Status != debugapi.Nacked || st[0].Types[0].Nack != "test says no" {
		t.Fatalf("status after a NACK: %+v", st)
	}
	// A change is sent.
	h.store.PutService(service("b", 80))
	h.push()
	r2 := s.next(t)
	if r2.GetVersionInfo() == r.GetVersionInfo() || len(r2.GetResources()) <= len(r.GetResources()) {
		t.Fatalf("after a change: version %s (was %s), %d clusters (was %d)", r2.GetVersionInfo(), r.GetVersionInfo(), len(r2.GetResources()), len(r.GetResources()))
	}
	s.send(t, ack(r2))
	xdstest.Eventually(t, "the proxy to show as synced", func() bool { return h.srv.Status()[0].Types[0].Status == debugapi.Synced })
}

func TestAFullPushGoesOutClustersEndpointsListenersRoutes(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.push()
	s := h.sotw(t)
	n := node(sidecarID, nil)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType})
	s.send(t, ack(s.next(t)))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"outbound|80||a.default.svc.cluster.local"}})
	s.send(t, ack(s.next(t), "outbound|80||a.default.svc.cluster.local"))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType})
	s.send(t, ack(s.next(t)))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{"80"}})
	s.send(t, ack(s.next(t), "80"))
	// A change to every type (a new HTTP service on the same port, a new
	// TCP service, a's endpoints): they arrive in order. Types whose
	// content did not change for the proxy would not be sent at all.
	h.store.PutService(service("b", 80))
	tcp := service("db", 5432)
	tcp.Ports[0].Protocol = registryv1.Protocol_PROTOCOL_TCP
	tcp.Addresses = []string{"10.96.0.9"}
	h.store.PutService(tcp)
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1", "10.1.1.4"))
	h.push()
	var order []string
	for range 4 {
		r := s.next(t)
		order = append(order, r.GetTypeUrl())
	}
	want := []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("push order %v, want %v", order, want)
		}
	}
}

func TestAnEndpointChangeGoesOnlyToProxiesWatchingThatCluster(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.store.PutEndpointSet(endpoints("b", "10.1.1.2"))
	h.push()
	watch := func(cluster, id string) *sotw {
		s := h.sotw(t)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: node(id, nil), TypeUrl: resourcev3.ClusterType})
		s.send(t, ack(s.next(t)))
		s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}})
		s.send(t, ack(s.next(t), cluster))
		return s
	}
	sa := watch("outbound|80||a.default.svc.cluster.local", "sidecar~10.1.0.9~x-1.default~default.svc.cluster.local")
	sb := watch("outbound|80||b.default.svc.cluster.local", "sidecar~10.1.0.10~y-1.default~default.svc.cluster.local")
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1", "10.1.1.3"))
	h.push()
	r := sa.next(t)
	if r.GetTypeUrl() != resourcev3.EndpointType {
		t.Fatalf("the watcher of a got %s, want EDS only", r.GetTypeUrl())
	}
	sa.nothing(t, 200*time.Millisecond)
	sb.nothing(t, 200*time.Millisecond)
}

// TestAPeerOfAProxysServiceScaledIsAnEndpointsOnlyPushAndItsOwnEndpointAFullOne:
// a sidecar that serves a (its address is one of a's endpoints) gets a
// peer added to a as a's load assignment alone; its own endpoint going
// changes its inbound, so that one is pushed fully (clusters first).
func TestAPeerOfAProxysServiceScaledIsAnEndpointsOnlyPushAndItsOwnEndpointAFullOne(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.store.PutEndpointSet(endpoints("b", "10.1.2.1"))
	h.push()
	const ca, cb = "outbound|80||a.default.svc.cluster.local", "outbound|80||b.default.svc.cluster.local"
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node("sidecar~10.1.1.1~a-1.default~default.svc.cluster.local", nil), TypeUrl: resourcev3.ClusterType})
	clusters := s.next(t)
	s.send(t, ack(clusters))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{ca, cb}})
	s.send(t, ack(s.next(t), ca, cb))
	inbound := func(r *discoveryv3.DiscoveryResponse) int {
		n := 0
		for _, a := range r.GetResources() {
			var c clusterv3.Cluster
			if err := a.UnmarshalTo(&c); err == nil && strings.HasPrefix(c.GetName(), "inbound|") {
				n++
			}
		}
		return n
	}
	if inbound(clusters) == 0 {
		t.Fatal("the proxy serving a has no inbound cluster")
	}

	h.store.PutEndpointSet(endpoints("a", "10.1.1.1", "10.1.1.2"))
	h.push()
	r := s.next(t)
	var la endpointv3.ClusterLoadAssignment
	if r.GetTypeUrl() != resourcev3.EndpointType || len(r.GetResources()) != 1 || r.GetResources()[0].UnmarshalTo(&la) != nil || la.GetClusterName() != ca {
		t.Fatalf("a peer added: got %d resources of %s (%q), want a's load assignment alone", len(r.GetResources()), r.GetTypeUrl(), la.GetClusterName())
	}
	s.send(t, ack(r, ca, cb))
	s.nothing(t, 200*time.Millisecond)

	h.store.PutEndpointSet(endpoints("a", "10.1.1.2"))
	h.push()
	r = s.next(t)
	if r.GetTypeUrl() != resourcev3.ClusterType || inbound(r) != 0 {
		t.Fatalf("its own endpoint gone: got %s with %d inbound clusters, want the clusters without its inbound", r.GetTypeUrl(), inbound(r))
	}
}

func names(r *discoveryv3.DeltaDiscoveryResponse) map[string]string {
	out := map[string]string{}
	for _, res := range r.GetResources() {
		out[res.GetName()] = res.GetVersion()
	}
	return out
}

func TestDeltaSendsOnlyDifferencesAndResumes(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.push()
	d := h.delta(t)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	first := d.next(t)
	held := names(first)
	if _, ok := held["outbound|80||a.default.svc.cluster.local"]; !ok || len(held) < 4 {
		t.Fatalf("first delta response: %v", held)
	}
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: first.GetNonce()})

	// One service changes: only its cluster is sent.
	changed := service("b", 80)
	changed.Ports[0].Protocol = registryv1.Protocol_PROTOCOL_GRPC
	h.store.PutService(changed)
	h.push()
	r := d.next(t)
	if got := names(r); len(got) != 1 || got["outbound|80||b.default.svc.cluster.local"] == "" {
		t.Fatalf("after changing b: %v, want only b's cluster", got)
	}
	held["outbound|80||b.default.svc.cluster.local"] = names(r)["outbound|80||b.default.svc.cluster.local"]
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.GetNonce()})

	// A NACK is not answered with the same resources again.
	h.store.Delete("registry.flotilla.io/v1/Service", "default/a.default.svc.cluster.local")
	h.push()
	r = d.next(t)
	if len(r.GetResources()) != 0 || len(r.GetRemovedResources()) != 1 || r.GetRemovedResources()[0] != "outbound|80||a.default.svc.cluster.local" {
		t.Fatalf("after deleting a: resources %v removed %v", names(r), r.GetRemovedResources())
	}
	delete(held, "outbound|80||a.default.svc.cluster.local")
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{
		TypeUrl: resourcev3.ClusterType, ResponseNonce: r.GetNonce(),
		ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: "no"},
	})
	h.store.PutService(service("b", 80)) // content changes back and forth is a change; same content is not
	h.store.PutService(changed)
	h.push()
	d.nothing(t, 300*time.Millisecond)

	// Reconnecting with what it holds, the proxy gets nothing it has.
	d2 := h.delta(t)
	d2.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, InitialResourceVersions: held})
	r = d2.next(t)
	if len(r.GetResources()) != 0 || len(r.GetRemovedResources()) != 0 {
		t.Fatalf("resume with current versions: resources %v removed %v", names(r), r.GetRemovedResources())
	}
	// With a stale version of one and a resource that no longer exists, it
	// gets that one and the removal.
	held["outbound|80||b.default.svc.cluster.local"] = "stale"
	held["outbound|80||gone.default.svc.cluster.local"] = "x"
	d3 := h.delta(t)
	d3.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, InitialResourceVersions: held})
	r = d3.next(t)
	if got := names(r); len(got) != 1 || got["outbound|80||b.default.svc.cluster.local"] == "" ||
		len(r.GetRemovedResources()) != 1 || r.GetRemovedResources()[0] != "outbound|80||gone.default.svc.cluster.local" {
		t.Fatalf("resume with a stale and a gone resource: resources %v removed %v", got, r.GetRemovedResources())
	}
}

func TestAResourceEnvoyWouldRejectIsNeverSentAndTheRestIs(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("good", 80))
	h.store.PutService(service("bad", 80))
	var drKind istio.Kind
	for _, k := range istio.Kinds() {
		if k.Kind == "DestinationRule" {
			drKind = k
		}
	}
	// As if it had bypassed validation: a negative outlier interval.
	h.store.PutObject(&istio.Object{Kind: drKind, Meta: istio.Meta{Name: "bad", Namespace: "default"}, Spec: &networking.DestinationRule{
		Host:          "bad",
		TrafficPolicy: &networking.TrafficPolicy{OutlierDetection: &networking.OutlierDetection{Interval: durationpb.New(-5 * time.Second)}},
	}})
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	r := s.next(t)
	var names []string
	for _, a := range r.GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("sent an invalid cluster %s: %v", c.GetName(), err)
		}
		names = append(names, c.GetName())
	}
	if !slices.Contains(names, "outbound|80||good.default.svc.cluster.local") || slices.Contains(names, "outbound|80||bad.default.svc.cluster.local") {
		t.Fatalf("clusters sent: %v", names)
	}
	s.send(t, ack(r))
	xdstest.Eventually(t, "the drop to be reported", func() bool {
		st := h.srv.Status()
		return len(st) == 1 && len(st[0].Problems) > 0 && strings.Contains(st[0].Problems[0], "outbound|80||bad.default.svc.cluster.local dropped")
	})
}

// watchHost is a proxyless client watching host's listener and route on
// port 80, both ACKed.
func (h *harness) watchHost(t *testing.T, host, id string) *sotw {
	t.Helper()
	s := h.sotw(t)
	l := host + ".default.svc.cluster.local:80"
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(id, map[string]any{"GENERATOR": "grpc"}), TypeUrl: resourcev3.ListenerType, ResourceNames: []string{l}})
	s.send(t, ack(s.next(t), l))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{l}})
	s.send(t, ack(s.next(t), l))
	return s
}

func TestAVirtualServiceChangeGoesOnlyToClientsWatchingItsHosts(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.push()
	kinds := map[string]istio.Kind{}
	for _, k := range istio.Kinds() {
		kinds[k.Kind] = k
	}
	sa := h.watchHost(t, "a", "sidecar~10.1.0.9~x-1.default~default.svc.cluster.local")
	sb := h.watchHost(t, "b", "sidecar~10.1.0.10~y-1.default~default.svc.cluster.local")
	xdstest.Eventually(t, "both synced", func() bool {
		st := h.srv.Status()
		return len(st) == 2 && st[0].Types[1].Status == debugapi.Synced && st[1].Types[1].Status == debugapi.Synced
	})
	skippedBefore := h.pushes("skipped")
	h.store.PutObject(&istio.Object{Kind: kinds["VirtualService"], Meta: istio.Meta{Name: "a", Namespace: "default"}, Spec: &networking.VirtualService{
		Hosts: []string{"a"},
		Http:  []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a"}}}, Timeout: durationpb.New(3 * time.Second)}},
	}})
	h.push()
	if r := sa.next(t); r.GetTypeUrl() != resourcev3.RouteType {
		t.Fatalf("a's watcher got %s, want its routes", r.GetTypeUrl())
	}
	sb.nothing(t, 300*time.Millisecond)
	if got := h.pushes("skipped") - skippedBefore; got != 1 {
		t.Fatalf("%d proxies skipped the change, want b's watcher alone", got)
	}
}

// TestStatusCanBeReadWhilePushing runs under -race in make test: the debug
// endpoints read what streams are writing.
func TestStatusCanBeReadWhilePushing(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.next(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			_ = h.srv.Status()
		}
	}()
	for i := range 20 {
		h.store.PutService(service(fmt.Sprintf("s%d", i), 80))
		h.push()
	}
	<-done
	for range 20 { // pushes coalesce: at most 20 responses
		r := s.next(t)
		s.send(t, ack(r))
		if len(r.GetResources()) == 24 {
			return // caught up: 21 services, the black hole and the two passthroughs
		}
	}
	t.Fatal("the proxy never received the last push")
}

func TestAProxyThatReadsNothingIsClosedAfterTheSendTimeoutAndDelaysNoOne(t *testing.T) {
	h := newHarnessWith(t, xds.Options{SendTimeout: 500 * time.Millisecond, Concurrency: 1})
	for i := range 600 {
		h.store.PutService(service(fmt.Sprintf("svc-%03d", i), 8080))
	}
	h.push()

	// A sidecar with a 64 KiB window asks for every cluster (far more) and
	// reads nothing.
	cc, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stuck, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Send(&discoveryv3.DiscoveryRequest{Node: node("sidecar~10.0.0.1~stuck.default~default.svc.cluster.local", nil), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	// Meanwhile, with the one translation slot there is, another proxy is
	// answered.
	healthy := h.sotw(t)
	healthy.send(t, &discoveryv3.DiscoveryRequest{Node: node("sidecar~10.0.0.2~ok.default~default.svc.cluster.local", nil), TypeUrl: resourcev3.ClusterType})
	if r := healthy.next(t); len(r.GetResources()) < 600 {
		t.Fatalf("the healthy proxy got %d clusters", len(r.GetResources()))
	}
	// The first response fits gRPC's write quota whole; the next one waits
	// for the proxy to read.
	h.store.PutService(service("svc-new", 8080))
	h.push()
	if r := healthy.next(t); len(r.GetResources()) < 601 {
		t.Fatalf("the healthy proxy got %d clusters after the change", len(r.GetResources()))
	}
	xdstest.Eventually(t, "the stuck stream closed", func() bool { return h.counter("flotilla.discovery.send_timeouts") == 1 })
	for {
		if _, err := stuck.Recv(); err != nil {
			if grpcstatus.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "closing its stream") {
				t.Fatalf("the stuck proxy's stream ended with %v, want DeadlineExceeded and the reason", err)
			}
			break
		}
	}
	if n := len(h.srv.Conns()); n != 1 {
		t.Fatalf("%d proxies still connected, want the healthy one", n)
	}
}

func TestADeltaStreamCannotSubscribeToMoreNamesThanTheLimitRequestByRequest(t *testing.T) {
	h := newHarness(t)
	h.push()
	d := h.delta(t)
	names := func(from int) []string {
		out := make([]string, 50_000)
		for i := range out {
			out[i] = fmt.Sprintf("c%06d", from+i) // short: the count, not the bytes, is over
		}
		return out
	}
	n := node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", nil)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names(0)})
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names(50_000)})
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names(100_000)[:10]})
	d.endsWith(t, codes.InvalidArgument, "subscribes to 100010 resource names")
}

// TestADeltaStreamCannotSubscribeToMoreThanFourMebibytesOfNames: names of
// 1,000 bytes, 2,000 to a request, well under the count limit: the stream
// is ended once they pass 4 MiB together (99,000 such names once took
// discovery's memory from 80 to 691 MiB).
func TestADeltaStreamCannotSubscribeToMoreThanFourMebibytesOfNames(t *testing.T) {
	h := newHarness(t)
	h.push()
	d := h.delta(t)
	names := func(from int) []string {
		out := make([]string, 2_000)
		for i := range out {
			name := fmt.Sprintf("outbound|80||svc-%06d.default.svc.cluster.local", from+i)
			out[i] = name + strings.Repeat("x", 1_000-len(name))
		}
		return out
	}
	n := node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", nil)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names(0)})
	for i := 1; i < 3; i++ {
		d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names(i * 2_000)})
	}
	d.endsWith(t, codes.InvalidArgument, "bytes of resource names, more than 4194304")
}

// FuzzStreamRequests sends what the fuzzer makes of a state-of-the-world
// and a delta request (with a node that parses, so they reach the
// handlers), three times each, on real streams: the server answers, or
// ends the stream with a status, and never fails; a well-behaved proxy is
// served afterwards.
func FuzzStreamRequests(f *testing.F) {
	seed := func(m proto.Message) []byte {
		b, _ := proto.Marshal(m)
		return b
	}
	f.Add(seed(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}), seed(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType}))
	f.Add(seed(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{"a", "", "*"}, ResponseNonce: "1"}),
		seed(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesUnsubscribe: []string{"*"}, InitialResourceVersions: map[string]string{"x": "y"}}))
	f.Add([]byte{0xff, 0x01}, []byte{})
	h := newHarness(f)
	h.store.PutService(service("reviews", 9080))
	h.push()
	f.Fuzz(func(t *testing.T, sotwBytes, deltaBytes []byte) {
		n := node("sidecar~10.0.0.1~fuzz.default~default.svc.cluster.local", nil)
		ads := discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn)
		var sreq discoveryv3.DiscoveryRequest
		if proto.Unmarshal(sotwBytes, &sreq) == nil {
			sreq.Node = n
			xdstest.SendAndDrain(func(ctx context.Context) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
				return ads.StreamAggregatedResources(ctx)
			}, &sreq, 3)
		}
		var dreq discoveryv3.DeltaDiscoveryRequest
		if proto.Unmarshal(deltaBytes, &dreq) == nil {
			dreq.Node = n
			xdstest.SendAndDrain(func(ctx context.Context) (discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, error) {
				return ads.DeltaAggregatedResources(ctx)
			}, &dreq, 3)
		}
		ok := h.sotw(t)
		ok.send(t, &discoveryv3.DiscoveryRequest{Node: node("sidecar~10.0.0.2~ok.default~default.svc.cluster.local", nil), TypeUrl: resourcev3.ClusterType})
		if r := ok.next(t); len(r.GetResources()) == 0 {
			t.Fatal("a well-behaved proxy got no clusters after the fuzzed streams")
		}
	})
}

// TestAServiceEntryWhoseEndpointsAloneChangedIsAnEndpointsOnlyPush:
// galley publishes a ServiceEntry beside the registry service and
// endpoints it derives from it; an edit of one endpoint address changes
// the object and the endpoints, not the service, and is pushed as EDS
// alone (as Istio's ServiceEntry controller pushes it), to the proxy
// watching that cluster. The object's new version is still tracked.
func TestAServiceEntryWhoseEndpointsAloneChangedIsAnEndpointsOnlyPush(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	k, _ := istio.ByName("ServiceEntry")
	se := func(generation int64, addr string) *istio.Object {
		return &istio.Object{Kind: k, Meta: istio.Meta{Name: "a", Namespace: "default", Generation: generation}, Spec: &networking.ServiceEntry{
			Hosts: []string{"a.default.svc.cluster.local"}, Resolution: networking.ServiceEntry_STATIC,
			Ports:     []*networking.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}},
			Endpoints: []*networking.WorkloadEntry{{Address: addr}},
		}}
	}
	h.store.PutObject(se(1, "10.1.1.1"))
	h.store.PutService(service("a", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.push()
	s := h.sotw(t)
	const cluster = "outbound|80||a.default.svc.cluster.local"
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.send(t, ack(s.next(t)))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}})
	s.send(t, ack(s.next(t), cluster))
	full, eds := h.pushes("full"), h.pushes("eds")

	h.store.PutObject(se(2, "10.1.1.7"))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.7"))
	h.push()
	r := s.next(t)
	if r.GetTypeUrl() != resourcev3.EndpointType {
		t.Fatalf("got %s, want the endpoints only", r.GetTypeUrl())
	}
	s.send(t, ack(r, cluster))
	if gotFull, gotEDS := h.pushes("full")-full, h.pushes("eds")-eds; gotFull != 0 || gotEDS != 1 {
		t.Fatalf("%d full and %d endpoints-only pushes, want 0 and 1", gotFull, gotEDS)
	}
	xdstest.Eventually(t, "generation 2 held", func() bool {
		d := distribution(t, h.conn, "ServiceEntry/default/a")
		push, ok, _ := d.Required(debugapi.Want{Version: "2"})
		return ok && len(d.Proxies) == 1 && d.Proxies[0].Push >= push
	})
}

// TestAnEndpointChangeSendsAStateOfTheWorldProxyOnlyTheLoadAssignmentsThatChanged:
// load assignments need not all be in every state-of-the-world response
// (only listeners and clusters must), so an endpoints-only push sends
// the changed ones, as Istio's incremental EDS does. The response's
// version is still that of everything the proxy then holds: a new stream
// asking for the same clusters gets the same version, in full.
func TestAnEndpointChangeSendsAStateOfTheWorldProxyOnlyTheLoadAssignmentsThatChanged(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.store.PutEndpointSet(endpoints("b", "10.1.2.1"))
	h.push()
	const ca, cb = "outbound|80||a.default.svc.cluster.local", "outbound|80||b.default.svc.cluster.local"
	subscribe := func() (*sotw, *discoveryv3.DiscoveryResponse) {
		s := h.sotw(t)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
		s.send(t, ack(s.next(t)))
		s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{ca, cb}})
		r := s.next(t)
		s.send(t, ack(r, ca, cb))
		return s, r
	}
	s, first := subscribe()
	if len(first.GetResources()) != 2 {
		t.Fatalf("the first response holds %d load assignments, want both", len(first.GetResources()))
	}

	h.store.PutEndpointSet(endpoints("a", "10.1.1.7"))
	h.push()
	r := s.next(t)
	if r.GetTypeUrl() != resourcev3.EndpointType {
		t.Fatalf("got %s, want the endpoints only", r.GetTypeUrl())
	}
	if len(r.GetResources()) != 1 {
		t.Fatalf("the endpoints-only push holds %d load assignments, want a's alone", len(r.GetResources()))
	}
	var la endpointv3.ClusterLoadAssignment
	if err := r.GetResources()[0].UnmarshalTo(&la); err != nil || la.GetClusterName() != ca {
		t.Fatalf("sent %q (%v), want %s", la.GetClusterName(), err, ca)
	}
	if r.GetVersionInfo() == first.GetVersionInfo() {
		t.Fatal("the version did not change")
	}
	s.send(t, ack(r, ca, cb))

	_, fresh := subscribe()
	if len(fresh.GetResources()) != 2 || fresh.GetVersionInfo() != r.GetVersionInfo() {
		t.Fatalf("a new stream got %d load assignments at version %s, want 2 at %s (what the first stream holds)",
			len(fresh.GetResources()), fresh.GetVersionInfo(), r.GetVersionInfo())
	}
}

// TestProxiesWatchingTheSameLoadAssignmentsEachGetTheOnesEachChangeChanged:
// which of a set of names a change concerns is worked out once for every
// stream watching that set, and anew for each change.
func TestProxiesWatchingTheSameLoadAssignmentsEachGetTheOnesEachChangeChanged(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.store.PutEndpointSet(endpoints("b", "10.1.2.1"))
	h.push()
	const ca, cb = "outbound|80||a.default.svc.cluster.local", "outbound|80||b.default.svc.cluster.local"
	var streams []*sotw
	for _, id := range []string{"sidecar~10.1.0.9~x-1.default~default.svc.cluster.local", "sidecar~10.1.0.10~y-1.default~default.svc.cluster.local"} {
		s := h.sotw(t)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: node(id, nil), TypeUrl: resourcev3.ClusterType})
		s.send(t, ack(s.next(t)))
		s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{ca, cb}})
		s.send(t, ack(s.next(t), ca, cb))
		streams = append(streams, s)
	}
	for _, change := range []struct{ svc, addr, cluster string }{{"a", "10.1.1.7", ca}, {"b", "10.1.2.7", cb}} {
		h.store.PutEndpointSet(endpoints(change.svc, change.addr))
		h.push()
		for i, s := range streams {
			r := s.next(t)
			var la endpointv3.ClusterLoadAssignment
			if r.GetTypeUrl() != resourcev3.EndpointType || len(r.GetResources()) != 1 {
				t.Fatalf("%s moved: proxy %d got %d resources of %s, want one load assignment", change.svc, i, len(r.GetResources()), r.GetTypeUrl())
			}
			if err := r.GetResources()[0].UnmarshalTo(&la); err != nil || la.GetClusterName() != change.cluster {
				t.Fatalf("%s moved: proxy %d got %q (%v), want %s", change.svc, i, la.GetClusterName(), err, change.cluster)
			}
			s.send(t, ack(r, ca, cb))
		}
	}
}

// TestAStateOfTheWorldProxyReconnectingWithTheVersionItHoldsIsSentNothingNew:
// versions are content hashes, the same on every replica, so a proxy
// whose connection ended (its age, a replica gone) and that asks again
// naming the version it holds gets no response until something changes;
// one naming another version gets everything.
func TestAStateOfTheWorldProxyReconnectingWithTheVersionItHoldsIsSentNothingNew(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	held := s.next(t)
	s.send(t, ack(held))

	resumed := h.sotw(t)
	resumed.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, VersionInfo: held.GetVersionInfo()})
	resumed.nothing(t, 300*time.Millisecond)
	stale := h.sotw(t)
	stale.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, VersionInfo: "stale"})
	if r := stale.next(t); r.GetVersionInfo() != held.GetVersionInfo() || len(r.GetResources()) != len(held.GetResources()) {
		t.Fatalf("a proxy naming another version got version %s with %d clusters, want %s with %d", r.GetVersionInfo(), len(r.GetResources()),
			held.GetVersionInfo(), len(held.GetResources()))
	}

	h.store.PutService(service("b", 80))
	h.push()
	r := resumed.next(t)
	if r.GetVersionInfo() == held.GetVersionInfo() || len(r.GetResources()) != len(held.GetResources())+1 {
		t.Fatalf("after a change the resumed stream got version %s with %d clusters, want a new version with %d", r.GetVersionInfo(),
			len(r.GetResources()), len(held.GetResources())+1)
	}
}

// TestAProxyResumingWithTheVersionItHoldsIsSyncedAndHoldsTheLatestPush:
// a proxy reconnecting (its replica paused, killed or past its connection
// age) naming what it holds is sent nothing, and the replica's sync
// status and distribution count it as holding that and the latest push,
// in either protocol — not as sent nothing and holding push 0 until the
// next change.
func TestAProxyResumingWithTheVersionItHoldsIsSyncedAndHoldsTheLatestPush(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	h.store.PutService(service("a", 80))
	h.push()
	h.store.PutService(service("b", 80))
	h.push()
	const key = "VirtualService/default/none"
	latest := distribution(t, h.conn, key).Push
	if latest < 2 {
		t.Fatalf("the replica is at push %d, want at least 2", latest)
	}
	synced := func(what string, resources int) {
		t.Helper()
		var st []debugapi.ProxySync
		xdstest.Eventually(t, what+": one proxy, synced, holding the latest push", func() bool {
			st = h.srv.Status()
			d := distribution(t, h.conn, key)
			return len(st) == 1 && len(st[0].Types) == 1 && st[0].Types[0].Status == debugapi.Synced &&
				len(d.Proxies) == 1 && d.Proxies[0].Push == latest
		})
		if ts := st[0].Types[0]; ts.Resources != resources || ts.AckedVersion != ts.SentVersion && !st[0].Delta {
			t.Fatalf("%s: %+v, want %d resources, the version acknowledged the one sent", what, ts, resources)
		}
	}
	gone := func(close context.CancelFunc) {
		t.Helper()
		close()
		xdstest.Eventually(t, "the broken stream to go", func() bool { return len(h.srv.Status()) == 0 })
	}

	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	held := s.next(t)
	s.send(t, ack(held))
	synced("state of the world", len(held.GetResources()))
	gone(s.close)
	resumed := h.sotw(t)
	resumed.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, VersionInfo: held.GetVersionInfo()})
	resumed.nothing(t, 300*time.Millisecond)
	synced("state of the world, resumed", len(held.GetResources()))
	gone(resumed.close)

	d := h.delta(t)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	first := d.next(t)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: first.GetNonce()})
	synced("delta", len(first.GetResources()))
	gone(d.close)
	d2 := h.delta(t)
	d2.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType, InitialResourceVersions: names(first)})
	r := d2.next(t)
	if len(r.GetResources())+len(r.GetRemovedResources()) != 0 {
		t.Fatalf("a delta resume with what it holds got %d resources and %d removals", len(r.GetResources()), len(r.GetRemovedResources()))
	}
	d2.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.GetNonce()})
	synced("delta, resumed", len(first.GetResources()))
}

// TestAStreamPastItsConnectionAgeEndsOnceItsProxyHasAnsweredEverythingItWasSent:
// a stream ends at its age only when nothing is in flight, so the proxy
// reconnects holding what it was last sent, never cut off in the middle
// of a push.
func TestAStreamPastItsConnectionAgeEndsOnceItsProxyHasAnsweredEverythingItWasSent(t *testing.T) {
	const age = 200 * time.Millisecond
	h := newHarnessWith(t, xds.Options{ConnectionAge: age, ConnectionAgeGrace: time.Hour})
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	first := s.next(t)
	s.nothing(t, 5*age) // past its age, the response unanswered

	h.store.PutService(service("b", 80))
	h.push()
	second := s.next(t)
	s.send(t, ack(first))
	s.nothing(t, 5*age) // the second response unanswered
	s.send(t, ack(second))
	if !s.ended(t) {
		t.Fatal("the stream ended with an error, want an OK status")
	}
}

func TestAStreamPastItsConnectionAgeEndsAtTheGraceWhenItsProxyNeverAnswers(t *testing.T) {
	h := newHarnessWith(t, xds.Options{ConnectionAge: 100 * time.Millisecond, ConnectionAgeGrace: 300 * time.Millisecond})
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	_ = s.next(t) // never acknowledged
	if !s.ended(t) {
		t.Fatal("the stream ended with an error, want an OK status")
	}
	if n := h.srv.Conns(); len(n) != 0 {
		t.Fatalf("%d proxies still connected", len(n))
	}
}

func TestAStreamWithoutAConnectionAgeStaysOpen(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.send(t, ack(s.next(t)))
	s.nothing(t, time.Second)
}

// proxyConfigType is Istio's PCDS, which Istio's agent may ask for and
// discovery does not serve.
const proxyConfigType = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"

// TestATypeNotServedIsAnsweredEmptyOnceAndItsAcknowledgementLetBe: Istio's
// agent waits for an answer to each type it asks for; discovery answers a type it does not serve with an empty
// response, as istiod does, on either protocol; the acknowledgement gets
// nothing more, and the stream goes on serving what it does serve.
func TestATypeNotServedIsAnsweredEmptyOnceAndItsAcknowledgementLetBe(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("reviews", 9080))
	h.push()
	n := node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", nil)

	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: n, TypeUrl: proxyConfigType})
	r := s.next(t)
	if r.GetTypeUrl() != proxyConfigType || len(r.GetResources()) != 0 || r.GetNonce() == "" {
		t.Fatalf("state of the world: got %s with %d resources, nonce %q; want an empty %s", r.GetTypeUrl(), len(r.GetResources()), r.GetNonce(), proxyConfigType)
	}
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: proxyConfigType, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})
	s.nothing(t, 300*time.Millisecond)
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	if r := s.next(t); r.GetTypeUrl() != resourcev3.ClusterType || len(r.GetResources()) == 0 {
		t.Fatalf("after it, clusters: got %s with %d resources", r.GetTypeUrl(), len(r.GetResources()))
	}

	d := h.delta(t)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: n, TypeUrl: proxyConfigType})
	dr := d.next(t)
	if dr.GetTypeUrl() != proxyConfigType || len(dr.GetResources()) != 0 || len(dr.GetRemovedResources()) != 0 || dr.GetNonce() == "" {
		t.Fatalf("delta: got %s with %d resources, %d removed, nonce %q; want an empty %s", dr.GetTypeUrl(), len(dr.GetResources()), len(dr.GetRemovedResources()), dr.GetNonce(), proxyConfigType)
	}
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: proxyConfigType, ResponseNonce: dr.GetNonce()})
	d.nothing(t, 300*time.Millisecond)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	if r := d.next(t); r.GetTypeUrl() != resourcev3.ClusterType || len(r.GetResources()) == 0 {
		t.Fatalf("after it, clusters: got %s with %d resources", r.GetTypeUrl(), len(r.GetResources()))
	}
}

// TestAPeerAskingForManyTypesNotServedGetsEachAnsweredAndNamesNoMetric:
// each type URL the peer makes up costs one empty answer (past the burst
// of requests that bring nothing new, paced) and no metric series of its
// own.
func TestAPeerAskingForManyTypesNotServedGetsEachAnsweredAndNamesNoMetric(t *testing.T) {
	h := newHarness(t)
	h.push()
	s := h.sotw(t)
	n := node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", nil)
	const asked = 150 // past the burst (100) of requests that bring nothing new
	for i := range asked {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: fmt.Sprintf("type.googleapis.com/made.up.T%d", i)}
		if i == 0 {
			req.Node = n
		}
		s.send(t, req)
	}
	for i := range asked {
		if r := s.next(t); r.GetTypeUrl() != fmt.Sprintf("type.googleapis.com/made.up.T%d", i) || len(r.GetResources()) != 0 {
			t.Fatalf("answer %d: %s with %d resources", i, r.GetTypeUrl(), len(r.GetResources()))
		}
	}
	rm := metricdata.ResourceMetrics{}
	if err := h.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			series++
			if strings.Contains(fmt.Sprint(m.Data), "made.up") {
				t.Errorf("metric %s has a series named by a type the peer made up", m.Name)
			}
		}
	}
	if series == 0 {
		t.Error("no metrics were read")
	}
}

// TestAnAgentThatCapturesDNSGetsItsNameTableAndANewOneWhenAHostComes:
// Istio's agent asks for the name table (NDS) when it answers its pod's
// DNS; it gets one unnamed NameTable, on either protocol, with the hosts
// the proxy sees — a ServiceEntry host at the address allocated to it —
// and a new table when a service is added.
func TestAnAgentThatCapturesDNSGetsItsNameTableAndANewOneWhenAHostComes(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("reviews", 9080))
	h.store.PutService(&registryv1.Service{
		Hostname: "pg.example.com", Name: "pg", Namespace: "default", SourceKind: registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY,
		Resolution: registryv1.Resolution_RESOLUTION_DNS, AutoAllocatedAddresses: []string{"240.240.0.1", "2001:2::1"},
		Ports: []*registryv1.ServicePort{{Name: "tcp", Number: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP}},
	})
	h.push()
	n := node("sidecar~10.0.0.1~a.default~default.svc.cluster.local", map[string]any{"DNS_CAPTURE": "true"})
	table := func(t *testing.T, res []*anypb.Any) map[string][]string {
		t.Helper()
		if len(res) != 1 {
			t.Fatalf("%d resources, want the one name table", len(res))
		}
		nt := &ndsv1.NameTable{}
		if err := res[0].UnmarshalTo(nt); err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for host, info := range nt.GetTable() {
			out[host] = info.GetIps()
		}
		return out
	}
	want := map[string][]string{"reviews.default.svc.cluster.local": {"10.96.0.1"}, "pg.example.com": {"240.240.0.1"}}

	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: n, TypeUrl: xdstype.NameTableType})
	r := s.next(t)
	if got := table(t, r.GetResources()); r.GetTypeUrl() != xdstype.NameTableType || !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("state of the world: %s %v, want %v", r.GetTypeUrl(), got, want)
	}
	s.send(t, ack(r))

	d := h.delta(t)
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{Node: n, TypeUrl: xdstype.NameTableType})
	dr := d.next(t)
	var dres []*anypb.Any
	for _, res := range dr.GetResources() {
		dres = append(dres, res.GetResource())
	}
	if got := table(t, dres); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("delta: %v, want %v", got, want)
	}
	d.send(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.NameTableType, ResponseNonce: dr.GetNonce()})

	h.store.PutService(service("ratings", 9080))
	h.push()
	r = s.next(t)
	if got := table(t, r.GetResources()); len(got) != 3 || got["ratings.default.svc.cluster.local"] == nil {
		t.Fatalf("after a service was added: %v", got)
	}
	dr = d.next(t)
	if len(dr.GetResources()) != 1 || dr.GetTypeUrl() != xdstype.NameTableType {
		t.Fatalf("delta after a service was added: %s with %d resources", dr.GetTypeUrl(), len(dr.GetResources()))
	}
}
