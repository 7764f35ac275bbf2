package xds_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// registry stands in for galley's WorkloadEntryService (galley's own is
// tested against a real apiserver in services/galley/autoregister):
// it records the calls, and refuses the group "missing" as galley does.
type registry struct {
	galleyv1.UnimplementedWorkloadEntryServiceServer
	mu          sync.Mutex
	connects    []*galleyv1.ConnectRequest
	disconnects []*galleyv1.DisconnectRequest
	health      []*galleyv1.ReportHealthRequest
}

func (r *registry) ReportHealth(_ context.Context, req *galleyv1.ReportHealthRequest) (*galleyv1.ReportHealthResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.health = append(r.health, req)
	return &galleyv1.ReportHealthResponse{}, nil
}

func (r *registry) reports() []*galleyv1.ReportHealthRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.health)
}

func (r *registry) Connect(_ context.Context, req *galleyv1.ConnectRequest) (*galleyv1.ConnectResponse, error) {
	if req.GetWorkload().GetGroup() == "missing" {
		return nil, status.Error(codes.FailedPrecondition, "cannot find WorkloadGroup vm/missing")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connects = append(r.connects, req)
	if e := req.GetWorkload().GetEntry(); e != "" {
		if e == "plain" { // an entry whose health is not checked: not controlled
			return &galleyv1.ConnectResponse{}, nil
		}
		return &galleyv1.ConnectResponse{Entry: e}, nil
	}
	return &galleyv1.ConnectResponse{Entry: req.GetWorkload().GetGroup() + "-" + req.GetWorkload().GetAddress()}, nil
}

func (r *registry) Disconnect(_ context.Context, req *galleyv1.DisconnectRequest) (*galleyv1.DisconnectResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disconnects = append(r.disconnects, req)
	return &galleyv1.DisconnectResponse{}, nil
}

func (r *registry) calls() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.connects), len(r.disconnects)
}

// serveRegistry serves r on loopback and returns a client of it.
func serveRegistry(t *testing.T, r *registry) galleyv1.WorkloadEntryServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	galleyv1.RegisterWorkloadEntryServiceServer(g, r)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return galleyv1.NewWorkloadEntryServiceClient(cc)
}

// openAs opens a state-of-the-world stream for a node and waits for its
// first response.
func openAs(t *testing.T, cc *grpc.ClientConn, nodeID string, md map[string]any) (context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return cancel, err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(nodeID, md), TypeUrl: resourcev3.ClusterType}); err != nil {
		return cancel, err
	}
	_, err = st.Recv()
	return cancel, err
}

func TestAProxyThatJoinsWithAWorkloadGroupIsRegisteredAndToldGoneAfterItsLastStream(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{}
	replica := debugapi.Replica{ID: "discovery-0"}
	srv, addr := mtlsServerOf(t, ca, xds.Options{VerifyIdentity: true, Registrar: serveRegistry(t, r), Replica: replica})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.RunRegistrations(ctx)
	vm := dialAs(t, ca, addr, "spiffe://cluster.local/ns/vm/sa/legacy")
	md := map[string]any{
		"AUTO_REGISTER_GROUP": "vms", "NETWORK": "vm-net", "LABELS": map[string]any{"app": "legacy", "version": "v2"},
		"PROXY_CONFIG": map[string]any{"readinessProbe": map[string]any{"tcpSocket": map[string]any{"port": 8080}}},
	}
	id := "sidecar~10.9.0.5~legacy-vm.vm~vm.svc.cluster.local"
	closeFirst, err := openAs(t, vm, id, md)
	if err != nil {
		t.Fatal(err)
	}
	closeSecond, err := openAs(t, vm, id, md) // a second stream of the same proxy
	if err != nil {
		t.Fatal(err)
	}
	if c, d := r.calls(); c != 2 || d != 0 {
		t.Fatalf("%d connects, %d disconnects; want 2, 0", c, d)
	}
	want := &galleyv1.Workload{
		Namespace: "vm", Group: "vms", Address: "10.9.0.5", Network: "vm-net", ServiceAccount: "legacy",
		Labels: map[string]string{"app": "legacy", "version": "v2"}, HealthChecked: true,
	}
	r.mu.Lock()
	first := r.connects[0]
	r.mu.Unlock()
	if !proto.Equal(first.GetWorkload(), want) || first.GetReplica() != "discovery-0" || first.GetConnectedAt() == nil {
		t.Fatalf("galley was told %v, want the workload %v from discovery-0", first, want)
	}
	closeFirst()
	time.Sleep(200 * time.Millisecond)
	if _, d := r.calls(); d != 0 {
		t.Fatal("told galley the workload left while a stream of it remains")
	}
	closeSecond()
	xdstest.EventuallyWithin(t, 10*time.Second, "galley told of the disconnection", func() bool { _, d := r.calls(); return d == 1 })
	r.mu.Lock()
	dis := r.disconnects[0]
	r.mu.Unlock()
	if dis.GetNamespace() != "vm" || dis.GetEntry() != "vms-10.9.0.5" || dis.GetReplica() != "discovery-0" ||
		dis.GetDisconnectedAt().AsTime().Before(dis.GetConnectedAt().AsTime()) {
		t.Fatalf("disconnection %v", dis)
	}
}

func TestAProxyGalleyWillNotRegisterIsRefusedWithTheReason(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{}
	_, addr := mtlsServerOf(t, ca, xds.Options{VerifyIdentity: true, Registrar: serveRegistry(t, r)})
	vm := dialAs(t, ca, addr, "spiffe://cluster.local/ns/vm/sa/legacy")
	_, err = openAs(t, vm, "sidecar~10.9.0.6~legacy-vm.vm~vm.svc.cluster.local", map[string]any{"AUTO_REGISTER_GROUP": "missing"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot find WorkloadGroup") {
		t.Fatalf("a missing group: %v", err)
	}
	// Without a verified identity (the plain-text port) nothing is asked.
	h := newHarnessWith(t, xds.Options{Registrar: serveRegistry(t, r)})
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node("sidecar~10.9.0.7~legacy-vm.vm~vm.svc.cluster.local", map[string]any{"AUTO_REGISTER_GROUP": "vms"}), TypeUrl: resourcev3.ClusterType})
	s.endsWith(t, codes.PermissionDenied, "requires a verified identity")
	if c, _ := r.calls(); c != 0 {
		t.Fatalf("galley was asked %d times", c)
	}
	// A proxy that does not ask is not registered.
	cart := dialAs(t, ca, addr, "spiffe://cluster.local/ns/shop/sa/cart")
	if _, err := openAs(t, cart, "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", nil); err != nil {
		t.Fatal(err)
	}
	if c, _ := r.calls(); c != 0 {
		t.Fatalf("galley was asked %d times", c)
	}
}

func TestAProxysHealthReportsReachGalleyForItsEntryOnceEachUnansweredAndClipped(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{}
	srv, addr := mtlsServerOf(t, ca, xds.Options{VerifyIdentity: true, Registrar: serveRegistry(t, r), Replica: debugapi.Replica{ID: "discovery-0"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.RunRegistrations(ctx)
	// healthOf opens a stream for a node, sends the reports after its
	// first response, then a request for a type not served, whose empty
	// answer must be the next response: no report is answered.
	healthOf := func(cc *grpc.ClientConn, id string, md map[string]any, reports ...*statuspb.Status) {
		t.Helper()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id, md), TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		for _, detail := range reports {
			if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdstype.HealthInfoType, ErrorDetail: detail}); err != nil {
				t.Fatal(err)
			}
		}
		const other = "type.googleapis.com/flotilla.test.NotServed"
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: other}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != other {
			t.Fatalf("a health report was answered: %v", resp)
		}
	}
	vm := dialAs(t, ca, addr, "spiffe://cluster.local/ns/vm/sa/legacy")
	md := map[string]any{"AUTO_REGISTER_GROUP": "vms", "PROXY_CONFIG": map[string]any{"readinessProbe": map[string]any{"tcpSocket": map[string]any{"port": 8080}}}}
	unhealthy := &statuspb.Status{Code: int32(codes.Internal), Message: "dial tcp 10.9.0.8:8080: connect: connection refused"}
	long := &statuspb.Status{Code: int32(codes.Internal), Message: strings.Repeat("é", 5000)}
	healthOf(vm, "sidecar~10.9.0.8~legacy-vm.vm~vm.svc.cluster.local", md, unhealthy, unhealthy, nil, nil, long)
	clipped := strings.Repeat("é", 500) + "…"
	last := func() *galleyv1.ReportHealthRequest {
		if got := r.reports(); len(got) > 0 {
			return got[len(got)-1]
		}
		return nil
	}
	xdstest.EventuallyWithin(t, 10*time.Second, "the last report at galley", func() bool { return last().GetMessage() == clipped })
	// A proxy that registered nothing reports into no entry, nor one
	// naming an entry galley does not let it control; the VM's next
	// report, on a new stream, arrives after them.
	cart := dialAs(t, ca, addr, "spiffe://cluster.local/ns/shop/sa/cart")
	healthOf(cart, "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", nil, unhealthy)
	healthOf(cart, "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", map[string]any{"WORKLOAD_ENTRY": "plain"}, unhealthy)
	healthOf(vm, "sidecar~10.9.0.8~legacy-vm.vm~vm.svc.cluster.local", md, nil)
	xdstest.EventuallyWithin(t, 10*time.Second, "the second stream's report at galley", func() bool { return last().GetHealthy() })
	// What galley got is the changes in order, a waiting report replaced
	// by a later one of the same entry, never a repeat.
	type verdict struct {
		healthy bool
		message string
	}
	sent := []verdict{{false, unhealthy.GetMessage()}, {true, ""}, {false, clipped}, {true, ""}}
	next := 0
	for i, rep := range r.reports() {
		if rep.GetNamespace() != "vm" || rep.GetEntry() != "vms-10.9.0.8" || rep.GetReplica() != "discovery-0" || rep.GetProbedAt() == nil {
			t.Errorf("report %d: %v, want one for vm/vms-10.9.0.8 from discovery-0", i, rep)
		}
		if len(rep.GetMessage()) > 1024 {
			t.Errorf("report %d: a message of %d bytes, over galley's bound", i, len(rep.GetMessage()))
		}
		got := verdict{rep.GetHealthy(), rep.GetMessage()}
		for next < len(sent) && sent[next] != got {
			next++
		}
		if next == len(sent) {
			t.Fatalf("report %d (healthy=%v %q) is not the next change the proxy made, in order", i, got.healthy, clipForError(got.message))
		}
		next++
	}
}

func clipForError(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

func TestAProxyNamingItsWorkloadEntryReportsItsHealthIntoIt(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{}
	srv, addr := mtlsServerOf(t, ca, xds.Options{VerifyIdentity: true, Registrar: serveRegistry(t, r), Replica: debugapi.Replica{ID: "discovery-0"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.RunRegistrations(ctx)
	vm := dialAs(t, ca, addr, "spiffe://cluster.local/ns/vm/sa/legacy")
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(vm).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node("sidecar~10.9.0.30~legacy-vm.vm~vm.svc.cluster.local", map[string]any{"WORKLOAD_ENTRY": "legacy-vm"}), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: xdstype.HealthInfoType}); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 10*time.Second, "the report at galley", func() bool { return len(r.reports()) == 1 })
	r.mu.Lock()
	connect := r.connects[0]
	r.mu.Unlock()
	if w := connect.GetWorkload(); w.GetEntry() != "legacy-vm" || w.GetGroup() != "" || w.GetNamespace() != "vm" || w.GetServiceAccount() != "legacy" {
		t.Fatalf("galley was told %v", w)
	}
	if rep := r.reports()[0]; rep.GetEntry() != "legacy-vm" || !rep.GetHealthy() {
		t.Fatalf("report %v", rep)
	}
}
