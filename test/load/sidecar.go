package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
)

// This file is the sidecar mode's clients: raw ADS streams that ask and
// acknowledge as Envoy does, many in one process. Envoy's order on ADS:
// CDS and LDS first (wildcard); for the EDS clusters a CDS response
// holds, an EDS request naming them, then the CDS ACK; for the route
// names the listeners' HTTP connection managers give, an RDS request,
// then the LDS ACK. Every response is decoded in full, as Envoy must, so
// the clients' own cost is real (and reported apart, as their process's
// CPU). A client's node is the one the agent's bootstrap writes. When its
// stream ends (a GOAWAY at the server's connection age, a replica gone),
// a client connects again, to a server picked at random from the current
// list as a Service's virtual IP would, and resumes as Envoy does: every
// subscription asked for again at once, with the versions it holds
// (state of the world) or their initial_resource_versions (delta).

// Short names of the four types, in the order the report gives them.
var sidecarTypes = []string{resourcev3.ClusterType, resourcev3.ListenerType, resourcev3.EndpointType, resourcev3.RouteType}

// ShortType is "cds", "lds", "eds" or "rds".
func ShortType(t string) string {
	switch t {
	case resourcev3.ClusterType:
		return "cds"
	case resourcev3.ListenerType:
		return "lds"
	case resourcev3.EndpointType:
		return "eds"
	case resourcev3.RouteType:
		return "rds"
	}
	return t
}

func longType(short string) (string, bool) {
	for _, t := range sidecarTypes {
		if ShortType(t) == short {
			return t, true
		}
	}
	return "", false
}

// SidecarClientOptions configures the sidecar clients' process.
type SidecarClientOptions struct {
	// XDS is discovery's xDS addresses, comma-separated (POST /servers
	// changes them).
	XDS string
	N   int
	// First is the mesh's index of this process's first client: its
	// clients are First … First+N-1 (Workload's argument), so that
	// several processes share one mesh's clients.
	First int
	// Delta makes the clients use incremental xDS (Istio's default).
	Delta bool
	// Status is the loopback address the process reports on (/synced,
	// /acks, /nack).
	Status string
	// Workload says who client i is.
	Workload func(i int) bootstrap.Node
	// Log receives what goes wrong (one line per client and kind).
	Log io.Writer
	// Ramp starts client i at i/N of it (all at once when zero).
	Ramp time.Duration
	// Observe, when set, sees every response client i applied, on the
	// client's goroutine before its ACK (state of the world only, not
	// with Delta). A CDS or LDS response is the whole of its type; an
	// EDS or RDS response may hold only the resources that changed, the
	// client keeping the others (as Istio sends them, and as the xDS
	// protocol allows for those types).
	Observe func(i int, typeURL string, resources []*anypb.Any)
	// Endpoints makes each client keep, per EDS cluster, a digest of the
	// endpoints it holds (endpointDigest), which POST /stale compares with
	// what they should be (state of the world only).
	Endpoints bool
}

// ackRecord is one response a client acknowledged (or rejected).
type ackRecord struct {
	at        time.Time
	resources int
	nacked    bool
}

// maxAckRecords bounds the responses a client remembers per type.
const maxAckRecords = 32

// sidecarClient is one simulated Envoy.
type sidecarClient struct {
	i    int
	node *corev3.Node

	mu      sync.Mutex
	records map[string][]ackRecord
	// acked marks each type acknowledged at least once with what it
	// asked for; synced is when all four first were.
	acked  map[string]bool
	synced time.Time
	err    string

	// nackType is a type this client rejects every response of (the
	// status endpoint's /nack), empty for none.
	nackType atomic.Value
	// streams counts the streams opened (the first and every reconnect).
	streams atomic.Int64

	// What the client holds, kept across streams (only its goroutine
	// touches it). State of the world: the version last accepted of each
	// type and the names asked of EDS and RDS. Delta: the resources held
	// per type (name → version), what each CDS or LDS resource asks of
	// EDS or RDS, and the EDS and RDS names subscribed.
	version    map[string]string
	names      map[string][]string
	held       map[string]map[string]string
	asks       map[string]map[string][]string
	subscribed map[string]map[string]bool

	// total counts, per type, the responses applied over the client's
	// life, and last is when the latest was (unlike records, unbounded
	// in time: a churn's responses are counted whatever their number);
	// endpoints is, with SidecarClientOptions.Endpoints, each EDS
	// cluster's endpointDigest. Under mu.
	total     map[string]int
	last      map[string]time.Time
	endpoints map[string]string
}

// servers is the list of xDS addresses a client connects to, one picked
// at random per connection.
type servers struct{ list atomic.Pointer[[]string] }

func (s *servers) set(addrs string) {
	l := strings.Split(addrs, ",")
	s.list.Store(&l)
}

func (s *servers) pick() string {
	l := *s.list.Load()
	return l[rand.IntN(len(l))] //nolint:gosec // spreading connections, not security
}

func (c *sidecarClient) record(t string, resources int, nacked bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := append(c.records[t], ackRecord{at: time.Now(), resources: resources, nacked: nacked})
	if len(r) > maxAckRecords {
		r = slices.Delete(r, 0, len(r)-maxAckRecords)
	}
	c.records[t] = r
	if !nacked {
		c.total[t]++
		c.last[t] = time.Now()
	}
}

// keepEndpoints notes the digest of each load assignment of an EDS
// response (a response holds only the clusters that changed).
func (c *sidecarClient) keepEndpoints(anys []*anypb.Any) {
	for _, a := range anys {
		var la endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(a.GetValue(), &la); err != nil {
			continue // decode rejected it already
		}
		d := endpointDigest(&la)
		c.mu.Lock()
		c.endpoints[la.GetClusterName()] = d
		c.mu.Unlock()
	}
}

// endpointDigest names the endpoints of a load assignment that take
// traffic (health status HEALTHY or UNKNOWN), as sorted address:port
// pairs joined by commas — what EndpointDigest makes of the addresses a
// load assignment should hold.
func endpointDigest(la *endpointv3.ClusterLoadAssignment) string {
	var addrs []string
	for _, l := range la.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			if h := e.GetHealthStatus(); h != corev3.HealthStatus_HEALTHY && h != corev3.HealthStatus_UNKNOWN {
				continue
			}
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)))
		}
	}
	return EndpointDigest(addrs)
}

// EndpointDigest is the digest of a load assignment holding these
// address:port pairs, in any order.
func EndpointDigest(addrs []string) string {
	addrs = slices.Clone(addrs)
	slices.Sort(addrs)
	return strings.Join(addrs, ",")
}

// markSynced notes a type acknowledged with what the client asks for.
func (c *sidecarClient) markSynced(t string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acked[t] = true
	if c.synced.IsZero() && len(c.acked) == len(sidecarTypes) {
		c.synced = time.Now()
	}
}

func (c *sidecarClient) rejects(t string) bool {
	v, _ := c.nackType.Load().(string)
	return v == t
}

// RunSidecarClients runs the clients until ctx ends.
func RunSidecarClients(ctx context.Context, o SidecarClientOptions) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if (o.Observe != nil || o.Endpoints) && o.Delta {
		return errors.New("observing what clients hold needs state-of-the-world streams")
	}
	clients := make([]*sidecarClient, o.N)
	if o.Endpoints {
		observe := o.Observe
		o.Observe = func(i int, t string, rs []*anypb.Any) {
			if t == resourcev3.EndpointType {
				clients[i].keepEndpoints(rs)
			}
			if observe != nil {
				observe(i, t, rs)
			}
		}
	}
	for i := range clients {
		b, _, err := bootstrap.Build(bootstrap.Options{Node: o.Workload(o.First + i), Delta: o.Delta})
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
		clients[i] = &sidecarClient{
			i: i, node: b.GetNode(), records: map[string][]ackRecord{}, acked: map[string]bool{},
			version: map[string]string{}, names: map[string][]string{}, held: map[string]map[string]string{},
			asks:       map[string]map[string][]string{resourcev3.ClusterType: {}, resourcev3.ListenerType: {}},
			subscribed: map[string]map[string]bool{resourcev3.EndpointType: {}, resourcev3.RouteType: {}},
			total:      map[string]int{}, last: map[string]time.Time{}, endpoints: map[string]string{},
		}
		for _, t := range sidecarTypes {
			clients[i].held[t] = map[string]string{}
		}
	}
	var srvs servers
	srvs.set(o.XDS)
	l, err := net.Listen("tcp", o.Status)
	if err != nil {
		return fmt.Errorf("status address: %w", err)
	}
	srv := &http.Server{Handler: statusHandler(clients, &srvs), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.Ramp * time.Duration(i) / time.Duration(len(clients))):
			}
			c.run(ctx, o, &srvs)
		})
	}
	wg.Wait()
	return nil
}

// run keeps the client's stream up until ctx ends: when it ends, the
// client connects again after a second, to a server picked anew.
func (c *sidecarClient) run(ctx context.Context, o SidecarClientOptions, srvs *servers) {
	for ctx.Err() == nil {
		err := c.connect(ctx, o, srvs.pick())
		if ctx.Err() != nil {
			return
		}
		if !movedOn(err) {
			c.fail(o.Log, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// connect runs one stream on a connection of its own.
func (c *sidecarClient) connect(ctx context.Context, o SidecarClientOptions, addr string) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer cc.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
	c.streams.Add(1)
	if o.Delta {
		return c.delta(ctx, ads)
	}
	return c.sotw(ctx, ads, o.Observe)
}

// errStreamEnded is a stream the server ended with an OK status
// (discovery's, at its connection age).
var errStreamEnded = errors.New("the server ended the stream")

// movedOn reports whether a stream ended because the server asked the
// client to go, at its connection age: the server ended the stream, or
// closed its connection after a graceful GOAWAY. Envoy then connects
// again, and so does a client, without an error.
func movedOn(err error) bool {
	return errors.Is(err, errStreamEnded) ||
		status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "received prior goaway: code: NO_ERROR")
}

func (c *sidecarClient) fail(log io.Writer, err error) {
	c.mu.Lock()
	first := c.err == ""
	c.err = err.Error()
	c.mu.Unlock()
	if first {
		fmt.Fprintf(log, "sidecar client %d (%s): %v\n", c.i, c.node.GetId(), err)
	}
}

// sotw is one state-of-the-world stream.
func (c *sidecarClient) sotw(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient, observe func(int, string, []*anypb.Any)) error {
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	version, names := c.version, c.names
	nonce := map[string]string{} // of this stream
	first := true
	send := func(t string, rs []string, errDetail error) error {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: t, VersionInfo: version[t], ResponseNonce: nonce[t], ResourceNames: rs}
		if errDetail != nil {
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: errDetail.Error()}
		}
		if first {
			req.Node, first = c.node, false
		}
		return stream.Send(req)
	}
	// CDS and LDS, then (on a stream that resumes) EDS and RDS for what
	// the client asks of them already, held or not yet: a stream that
	// ended before their first response must ask again, as Envoy does.
	for _, t := range sidecarTypes {
		if followType(t) == "" && version[t] == "" && len(names[t]) == 0 {
			continue
		}
		if err := send(t, names[t], nil); err != nil {
			return err
		}
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errStreamEnded
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		t := resp.GetTypeUrl()
		nonce[t] = resp.GetNonce()
		if c.rejects(t) {
			c.record(t, len(resp.GetResources()), true)
			if err := send(t, names[t], errors.New("rejected on demand by the load tool")); err != nil {
				return err
			}
			continue
		}
		follow, err := decode(t, resp.GetResources())
		if err != nil {
			c.record(t, len(resp.GetResources()), true)
			if err := send(t, names[t], err); err != nil {
				return err
			}
			continue
		}
		version[t] = resp.GetVersionInfo()
		// Envoy asks for the EDS clusters (RDS routes) before it
		// acknowledges the CDS (LDS) response that named them.
		if next := followType(t); next != "" {
			if !slices.Equal(follow, names[next]) || version[next] == "" && nonce[next] == "" {
				names[next] = follow
				if err := send(next, follow, nil); err != nil {
					return err
				}
			}
			if len(follow) == 0 {
				c.markSynced(next) // nothing to ask for is in sync
			}
		}
		// Applied: what it holds now, whether or not the ACK gets through
		// (a stream ending at the server's connection age may take this
		// response and not the ACK; the client resumes with its version).
		c.record(t, len(resp.GetResources()), false)
		c.markSynced(t)
		if observe != nil {
			observe(c.i, t, resp.GetResources())
		}
		if err := send(t, names[t], nil); err != nil {
			return err
		}
	}
}

// delta is one incremental stream.
func (c *sidecarClient) delta(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) error {
	stream, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	held, asks, subscribed := c.held, c.asks, c.subscribed
	// CDS and LDS, then (on a stream that resumes) EDS and RDS for what
	// the client subscribes to already, each with what it holds.
	first := true
	for _, t := range sidecarTypes {
		req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, InitialResourceVersions: maps.Clone(held[t])}
		if followType(t) == "" {
			if len(subscribed[t]) == 0 {
				continue
			}
			req.ResourceNamesSubscribe = slices.Sorted(maps.Keys(subscribed[t]))
		}
		if first {
			req.Node, first = c.node, false
		}
		if err := stream.Send(req); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errStreamEnded
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		t := resp.GetTypeUrl()
		ack := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, ResponseNonce: resp.GetNonce()}
		anys := make([]*anypb.Any, 0, len(resp.GetResources()))
		for _, r := range resp.GetResources() {
			anys = append(anys, r.GetResource())
		}
		var follow map[string][]string
		if c.rejects(t) {
			err = errors.New("rejected on demand by the load tool")
		} else {
			follow, err = decodeEach(t, anys)
		}
		if err != nil {
			ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			c.record(t, len(resp.GetResources()), true)
			if err := stream.Send(ack); err != nil {
				return fmt.Errorf("send: %w", err)
			}
			continue
		}
		for _, r := range resp.GetResources() {
			held[t][r.GetName()] = r.GetVersion()
		}
		for _, n := range resp.GetRemovedResources() {
			delete(held[t], n)
			if a := asks[t]; a != nil {
				delete(a, n)
			}
		}
		if next := followType(t); next != "" {
			maps.Copy(asks[t], follow)
			want := map[string]bool{}
			for _, ns := range asks[t] {
				for _, n := range ns {
					want[n] = true
				}
			}
			sub := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: next}
			for n := range want {
				if !subscribed[next][n] {
					sub.ResourceNamesSubscribe = append(sub.ResourceNamesSubscribe, n)
				}
			}
			for n := range subscribed[next] {
				if !want[n] {
					sub.ResourceNamesUnsubscribe = append(sub.ResourceNamesUnsubscribe, n)
					delete(held[next], n)
				}
			}
			if len(sub.ResourceNamesSubscribe)+len(sub.ResourceNamesUnsubscribe) > 0 {
				subscribed[next] = want
				slices.Sort(sub.ResourceNamesSubscribe)
				slices.Sort(sub.ResourceNamesUnsubscribe)
				if err := stream.Send(sub); err != nil {
					return fmt.Errorf("send: %w", err)
				}
			}
			if len(want) == 0 {
				c.markSynced(next)
			}
		}
		c.record(t, len(resp.GetResources())+len(resp.GetRemovedResources()), false) // applied, as in sotw
		c.markSynced(t)
		if err := stream.Send(ack); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
}

// followType is the type a type's resources name: CDS's EDS clusters,
// LDS's RDS route configurations.
func followType(t string) string {
	switch t {
	case resourcev3.ClusterType:
		return resourcev3.EndpointType
	case resourcev3.ListenerType:
		return resourcev3.RouteType
	}
	return ""
}

// decode decodes a state-of-the-world response in full and returns the
// sorted names its resources ask of the following type.
func decode(t string, anys []*anypb.Any) ([]string, error) {
	each, err := decodeEach(t, anys)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, ns := range each {
		for _, n := range ns {
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// decodeEach decodes every resource and returns, by resource name, the
// names it asks of the following type (an EDS cluster its service name;
// a listener its HTTP connection managers' route configurations).
func decodeEach(t string, anys []*anypb.Any) (map[string][]string, error) {
	out := map[string][]string{}
	for _, a := range anys {
		if a.GetTypeUrl() != t {
			return nil, fmt.Errorf("a %s resource in a %s response", a.GetTypeUrl(), t)
		}
		switch t {
		case resourcev3.ClusterType:
			var c clusterv3.Cluster
			if err := proto.Unmarshal(a.GetValue(), &c); err != nil {
				return nil, fmt.Errorf("cluster: %w", err)
			}
			if c.GetType() == clusterv3.Cluster_EDS {
				n := c.GetEdsClusterConfig().GetServiceName()
				if n == "" {
					n = c.GetName()
				}
				out[c.GetName()] = []string{n}
			} else {
				out[c.GetName()] = nil
			}
		case resourcev3.ListenerType:
			var l listenerv3.Listener
			if err := proto.Unmarshal(a.GetValue(), &l); err != nil {
				return nil, fmt.Errorf("listener: %w", err)
			}
			routes, err := listenerRoutes(&l)
			if err != nil {
				return nil, err
			}
			out[l.GetName()] = routes
		case resourcev3.EndpointType:
			var la endpointv3.ClusterLoadAssignment
			if err := proto.Unmarshal(a.GetValue(), &la); err != nil {
				return nil, fmt.Errorf("load assignment: %w", err)
			}
		case resourcev3.RouteType:
			var rc routev3.RouteConfiguration
			if err := proto.Unmarshal(a.GetValue(), &rc); err != nil {
				return nil, fmt.Errorf("route configuration: %w", err)
			}
		default:
			return nil, fmt.Errorf("unexpected type %s", t)
		}
	}
	return out, nil
}

// listenerRoutes are the route configurations a listener's HTTP
// connection managers name.
func listenerRoutes(l *listenerv3.Listener) ([]string, error) {
	chains := slices.Clone(l.GetFilterChains())
	if d := l.GetDefaultFilterChain(); d != nil {
		chains = append(chains, d)
	}
	var out []string
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			tc := f.GetTypedConfig()
			if tc.MessageIs((*hcmv3.HttpConnectionManager)(nil)) {
				var hcm hcmv3.HttpConnectionManager
				if err := tc.UnmarshalTo(&hcm); err != nil {
					return nil, fmt.Errorf("listener %s: http connection manager: %w", l.GetName(), err)
				}
				if n := hcm.GetRds().GetRouteConfigName(); n != "" {
					out = append(out, n)
				}
			}
		}
	}
	return out, nil
}

// ClientAcks is what /acks answers: per client, its first response of a
// type after a time.
type ClientAcks struct {
	// Acked is, per client, the first acknowledgement after since (unix
	// nanoseconds; 0: none yet).
	Acked []int64 `json:"acked"`
	// Responses and Resources count, per client, what it received of the
	// type after since; Nacked the responses it rejected.
	Responses []int `json:"responses"`
	Resources []int `json:"resources"`
	Nacked    []int `json:"nacked"`
}

// ClientTotals is what /totals answers: per client, the responses of a
// type it applied over its life and when the latest was (unix
// nanoseconds; 0: none).
type ClientTotals struct {
	Responses []int   `json:"responses"`
	Last      []int64 `json:"last"`
}

// StaleEndpoints is what /stale answers: how many (client, cluster) pairs
// hold other endpoints than asked, with one of them.
type StaleEndpoints struct {
	Stale   int    `json:"stale"`
	Example string `json:"example,omitempty"`
}

// SyncState is what /synced answers.
type SyncState struct {
	// Synced counts the clients that hold all four types; Last is when
	// the last of them first did (unix nanoseconds).
	Synced int   `json:"synced"`
	Last   int64 `json:"last"`
	// Errors counts the clients whose stream failed, with one of them.
	Errors int    `json:"errors"`
	Error  string `json:"error,omitempty"`
	// Streams counts the streams the clients opened, reconnections
	// included.
	Streams int64 `json:"streams"`
}

func statusHandler(clients []*sidecarClient, srvs *servers) http.Handler {
	mux := http.NewServeMux()
	// POST /servers?addrs=a,b,c: later connections go to one of these.
	mux.HandleFunc("POST /servers", func(w http.ResponseWriter, r *http.Request) {
		addrs := r.URL.Query().Get("addrs")
		if addrs == "" {
			http.Error(w, "want addrs=<host:port>,…", http.StatusBadRequest)
			return
		}
		srvs.set(addrs)
	})
	mux.HandleFunc("GET /synced", func(w http.ResponseWriter, _ *http.Request) {
		var st SyncState
		for _, c := range clients {
			c.mu.Lock()
			if !c.synced.IsZero() {
				st.Synced++
				st.Last = max(st.Last, c.synced.UnixNano())
			}
			if c.err != "" {
				st.Errors++
				st.Error = c.err
			}
			c.mu.Unlock()
			st.Streams += c.streams.Load()
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("GET /acks", func(w http.ResponseWriter, r *http.Request) {
		t, ok := longType(r.URL.Query().Get("type"))
		since, err := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
		if !ok || err != nil {
			http.Error(w, "want type=cds|lds|eds|rds and since=<unix nanoseconds>", http.StatusBadRequest)
			return
		}
		a := ClientAcks{
			Acked: make([]int64, len(clients)), Responses: make([]int, len(clients)),
			Resources: make([]int, len(clients)), Nacked: make([]int, len(clients)),
		}
		for i, c := range clients {
			c.mu.Lock()
			for _, rec := range c.records[t] {
				if rec.at.UnixNano() <= since {
					continue
				}
				if rec.nacked {
					a.Nacked[i]++
					continue
				}
				if a.Acked[i] == 0 {
					a.Acked[i] = rec.at.UnixNano()
				}
				a.Responses[i]++
				a.Resources[i] += rec.resources
			}
			c.mu.Unlock()
		}
		writeJSON(w, a)
	})
	// GET /totals?type=eds: per client, the responses of the type applied
	// over its life and when the latest was.
	mux.HandleFunc("GET /totals", func(w http.ResponseWriter, r *http.Request) {
		t, ok := longType(r.URL.Query().Get("type"))
		if !ok {
			http.Error(w, "want type=cds|lds|eds|rds", http.StatusBadRequest)
			return
		}
		tt := ClientTotals{Responses: make([]int, len(clients)), Last: make([]int64, len(clients))}
		for i, c := range clients {
			c.mu.Lock()
			tt.Responses[i] = c.total[t]
			if l := c.last[t]; !l.IsZero() {
				tt.Last[i] = l.UnixNano()
			}
			c.mu.Unlock()
		}
		writeJSON(w, tt)
	})
	// POST /stale with {cluster: digest}: the clients (and clusters) whose
	// endpoints differ from these (SidecarClientOptions.Endpoints).
	mux.HandleFunc("POST /stale", func(w http.ResponseWriter, r *http.Request) {
		var want map[string]string
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&want); err != nil {
			http.Error(w, "want a JSON object of cluster → endpoint digest: "+err.Error(), http.StatusBadRequest)
			return
		}
		var st StaleEndpoints
		for _, c := range clients {
			c.mu.Lock()
			for cluster, d := range want {
				if got, held := c.endpoints[cluster]; !held || got != d {
					st.Stale++
					if st.Example == "" {
						st.Example = fmt.Sprintf("client %d holds %s as %q, want %q", c.i, cluster, got, d)
					}
				}
			}
			c.mu.Unlock()
		}
		writeJSON(w, st)
	})
	// POST /nack?type=rds&n=10: the first n clients reject every later
	// response of the type (n=0 stops it).
	mux.HandleFunc("POST /nack", func(w http.ResponseWriter, r *http.Request) {
		t, ok := longType(r.URL.Query().Get("type"))
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if !ok || err != nil || n < 0 {
			http.Error(w, "want type=cds|lds|eds|rds and n=<clients>", http.StatusBadRequest)
			return
		}
		for i, c := range clients {
			if i < n {
				c.nackType.Store(t)
			} else {
				c.nackType.Store("")
			}
		}
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
