package xds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

func fetch(t *testing.T, cc grpc.ClientConnInterface, typeURL string, names ...string) (*discoveryv3.DiscoveryResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return debugapi.Fetch(ctx, cc, typeURL, names...)
}

func syncz(t *testing.T, cc grpc.ClientConnInterface, names ...string) []debugapi.ProxySync {
	t.Helper()
	resp, err := fetch(t, cc, debugapi.Syncz, names...)
	if err != nil {
		t.Fatalf("syncz: %v", err)
	}
	out, err := debugapi.Syncs(resp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func typeStatus(ps debugapi.ProxySync, typeURL string) debugapi.TypeSync {
	for _, ts := range ps.Types {
		if ts.TypeURL == typeURL {
			return ts
		}
	}
	return debugapi.TypeSync{}
}

func TestDebugTypesAreRefusedOnThePlainTextPortOutsideALocalRun(t *testing.T) {
	h := newHarness(t)
	h.push()
	for _, typ := range []string{debugapi.Syncz, debugapi.ConfigDump, debugapi.AckedConfigDump, debugapi.Distribution} {
		if _, err := fetch(t, h.conn, typ, "x"); grpcstatus.Code(err) != codes.Unauthenticated {
			t.Errorf("%s over plain text: %v, want Unauthenticated", typ, err)
		}
	}
}

func TestSynczTellsNotSentStaleNackedAndSyncedAndNamesTheReplica(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true, Replica: debugapi.NewReplica("flotilla-discovery", "discovery-1", "1.2.3")})
	h.store.PutService(service("a", 80))
	s := h.sotw(t)
	// No push context yet: the watch is NOT SENT.
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, map[string]any{"ISTIO_VERSION": "1.27.0"}), TypeUrl: resourcev3.ClusterType})
	xdstest.Eventually(t, "the proxy to show", func() bool { return len(h.srv.Status()) == 1 })
	resp, err := fetch(t, h.conn, debugapi.Syncz)
	if err != nil {
		t.Fatal(err)
	}
	if r := debugapi.ReplicaOf(resp.GetControlPlane()); r.ID != "discovery-1" || r.Component != "flotilla-discovery" || r.Info.Version != "1.2.3" {
		t.Fatalf("replica %+v from %q", r, resp.GetControlPlane().GetIdentifier())
	}
	all, _ := debugapi.Syncs(resp)
	if len(all) != 1 || all[0].ID != sidecarID || all[0].IstioVersion != "1.27.0" || all[0].Namespace != "default" || all[0].ProxyType != "sidecar" {
		t.Fatalf("syncz: %+v", all)
	}
	if got := typeStatus(all[0], resourcev3.ClusterType).Status; got != debugapi.NotSent {
		t.Fatalf("before any push: %s, want NOT SENT", got)
	}

	// Sent, not acknowledged: STALE, with what was sent. The state is
	// recorded once the stream took the response, which can be a moment
	// after the proxy read it.
	h.push()
	r := s.next(t)
	var cds debugapi.TypeSync
	xdstest.Eventually(t, "STALE", func() bool {
		cds = typeStatus(syncz(t, h.conn)[0], resourcev3.ClusterType)
		return cds.Status != debugapi.NotSent
	})
	if cds.Status != debugapi.Stale || cds.SentVersion != r.GetVersionInfo() || cds.AckedVersion != "" || cds.Resources != len(r.GetResources()) {
		t.Fatalf("sent, not acknowledged: %+v (sent %s with %d)", cds, r.GetVersionInfo(), len(r.GetResources()))
	}
	s.send(t, ack(r))
	xdstest.Eventually(t, "SYNCED", func() bool {
		cds = typeStatus(syncz(t, h.conn)[0], resourcev3.ClusterType)
		return cds.Status == debugapi.Synced
	})
	if cds.AckedVersion != r.GetVersionInfo() {
		t.Fatalf("synced at %q, want %q", cds.AckedVersion, r.GetVersionInfo())
	}

	// A rejection: NACKED with the proxy's message; the version it kept.
	h.store.PutService(service("b", 80))
	h.push()
	r2 := s.next(t)
	s.send(t, nack(r2, r.GetVersionInfo(), "cluster b: test says no"))
	xdstest.Eventually(t, "NACKED", func() bool {
		cds = typeStatus(syncz(t, h.conn)[0], resourcev3.ClusterType)
		return cds.Status == debugapi.Nacked
	})
	if cds.Nack != "cluster b: test says no" || cds.AckedVersion != r.GetVersionInfo() || cds.SentVersion != r2.GetVersionInfo() {
		t.Fatalf("after a NACK: %+v", cds)
	}
	// Narrowed to one proxy ID, or to one that is not here.
	if got := syncz(t, h.conn, sidecarID); len(got) != 1 {
		t.Fatalf("syncz for %s: %d proxies", sidecarID, len(got))
	}
	if got := syncz(t, h.conn, "sidecar~10.9.9.9~nobody.default~default.svc.cluster.local"); len(got) != 0 {
		t.Fatalf("syncz for a proxy not here: %+v", got)
	}
}

func TestConfigDumpIsWhatTheProxyWouldGetNowAndTheAckedDumpWhatItHolds(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.send(t, ack(s.next(t)))
	xdstest.Eventually(t, "SYNCED", func() bool {
		return typeStatus(syncz(t, h.conn)[0], resourcev3.ClusterType).Status == debugapi.Synced
	})
	now := clusterNames(t, dump(t, h.conn, debugapi.ConfigDump))
	acked := dump(t, h.conn, debugapi.AckedConfigDump)
	if held := clusterNames(t, acked); !strings.Contains(now, "outbound|80||a.default.svc.cluster.local") || held != now {
		t.Fatalf("synced: would send %s; holds %s", now, held)
	}
	if u := unknownTypes(t, acked); len(u) != 0 {
		t.Fatalf("synced, yet types not known: %v", u)
	}

	// A change the proxy has not taken: the dump has it, the acked dump
	// cannot tell what the proxy holds and says so.
	h.store.PutService(service("b", 80))
	h.push()
	r := s.next(t)
	if now = clusterNames(t, dump(t, h.conn, debugapi.ConfigDump)); !strings.Contains(now, "b.default") {
		t.Fatalf("would send %s after adding b", now)
	}
	acked = dump(t, h.conn, debugapi.AckedConfigDump)
	if u := unknownTypes(t, acked); u[resourcev3.ClusterType] == "" {
		t.Fatalf("stale CDS not listed as unknown: %v", u)
	}
	s.send(t, ack(r))
	xdstest.Eventually(t, "the acked dump to have b", func() bool {
		return strings.Contains(clusterNames(t, dump(t, h.conn, debugapi.AckedConfigDump)), "b.default")
	})

	for name, names := range map[string][]string{"no proxy": nil, "two proxies": {sidecarID, sidecarID}} {
		if _, err := fetch(t, h.conn, debugapi.ConfigDump, names...); grpcstatus.Code(err) != codes.InvalidArgument {
			t.Errorf("config_dump for %s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := fetch(t, h.conn, debugapi.ConfigDump, "sidecar~10.9.9.9~nobody.default~default.svc.cluster.local"); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("config_dump for a proxy not here: %v, want NotFound", err)
	}
}

func TestHostileDebugRequestsGetAClearErrorAndCostTheirStreamOnly(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	h.push()
	if _, err := fetch(t, h.conn, debugapi.IstioPrefix+"no-such-thing"); grpcstatus.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown debug type") {
		t.Errorf("an unknown debug type: %v", err)
	}
	if _, err := fetch(t, h.conn, debugapi.Syncz, strings.Repeat("x", 2000)); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Errorf("an oversized name: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	delta, err := discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: debugapi.Syncz}); err != nil {
		t.Fatal(err)
	}
	if _, err := delta.Recv(); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Errorf("a debug type over delta: %v", err)
	}

	// A client that asks again and again is answered at a bounded rate,
	// and a proxy beside it is served as usual.
	loop, err := discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range 1000 {
			if loop.Send(&discoveryv3.DiscoveryRequest{TypeUrl: debugapi.Syncz}) != nil {
				return
			}
		}
	}()
	answered := 0
	deadline := time.After(time.Second)
count:
	for {
		select {
		case <-deadline:
			break count
		default:
		}
		if _, err := loop.Recv(); err != nil {
			t.Fatal(err)
		}
		answered++
	}
	// The burst and one second at the idle rate: 100 + 50, with room.
	if answered > 200 {
		t.Errorf("%d answers in about a second to a looping debug client", answered)
	}
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.next(t)
}

func TestACallerSeesItsOwnNamespaceAndTheSystemNamespaceEverything(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	addr := mtlsServerWith(t, ca, xds.Options{VerifyIdentity: true, SystemNamespace: "istio-system"})
	shopID, bankID := "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", "sidecar~10.0.0.2~vault-1.bank~bank.svc.cluster.local"
	for id, spiffeID := range map[string]string{shopID: "spiffe://cluster.local/ns/shop/sa/cart", bankID: "spiffe://cluster.local/ns/bank/sa/vault"} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialAs(t, ca, addr, spiffeID)).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id, nil), TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	admin := dialAs(t, ca, addr, "spiffe://cluster.local/ns/istio-system/sa/flotilla-cli")
	if got := syncz(t, admin); len(got) != 2 || got[1].Identity != "spiffe://cluster.local/ns/bank/sa/vault" {
		t.Fatalf("the system namespace sees %+v", got)
	}
	shop := dialAs(t, ca, addr, "spiffe://cluster.local/ns/shop/sa/cart")
	if got := syncz(t, shop); len(got) != 1 || got[0].ID != shopID {
		t.Fatalf("shop sees %+v", got)
	}
	if _, err := fetch(t, shop, debugapi.ConfigDump, bankID); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("shop dumping bank's proxy: %v, want NotFound", err)
	}
	if _, err := fetch(t, admin, debugapi.ConfigDump, bankID); err != nil {
		t.Fatalf("the system namespace dumping bank's proxy: %v", err)
	}
	if shopSees, adminSees := len(distribution(t, shop, "VirtualService/shop/cart").Proxies), len(distribution(t, admin, "VirtualService/bank/vault").Proxies); shopSees != 1 || adminSees != 2 {
		t.Fatalf("distribution lists %d proxies to shop and %d to the system namespace: want 1 and 2", shopSees, adminSees)
	}
	// An object's history is its namespace's to see (and the system
	// namespace's).
	if _, err := fetch(t, shop, debugapi.Distribution, "VirtualService/bank/vault"); grpcstatus.Code(err) != codes.PermissionDenied {
		t.Fatalf("shop asking the distribution of bank's object: %v, want PermissionDenied", err)
	}
}

// dump fetches a config dump of sidecarID.
func dump(t *testing.T, cc grpc.ClientConnInterface, typeURL string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	resp, err := fetch(t, cc, typeURL, sidecarID)
	if err != nil {
		t.Fatalf("%s: %v", typeURL, err)
	}
	return resp
}

// clusterNames lists a dump's clusters, comma-separated.
func clusterNames(t *testing.T, resp *discoveryv3.DiscoveryResponse) string {
	t.Helper()
	var names []string
	for _, a := range resp.GetResources() {
		var d adminv3.ClustersConfigDump
		if a.UnmarshalTo(&d) != nil {
			continue
		}
		for _, c := range d.GetDynamicActiveClusters() {
			var cl clusterv3.Cluster
			if err := c.GetCluster().UnmarshalTo(&cl); err != nil {
				t.Fatal(err)
			}
			names = append(names, cl.GetName())
		}
	}
	return strings.Join(names, ",")
}

// unknownTypes is an acked dump's list of types it cannot tell.
func unknownTypes(t *testing.T, resp *discoveryv3.DiscoveryResponse) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range resp.GetResources() {
		var st structpb.Struct
		if a.UnmarshalTo(&st) != nil {
			continue
		}
		for k, v := range st.GetFields()[debugapi.MetadataUnknownTypes].GetStructValue().GetFields() {
			out[k] = v.GetStringValue()
		}
	}
	return out
}

func TestWhatWasDroppedForAProxyIsInItsDetailNotInTheListing(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	// Two services on one address: the second's routes are dropped.
	h.store.PutService(service("a", 8080))
	h.store.PutService(service("b", 8080))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ListenerType})
	s.send(t, ack(s.next(t)))
	xdstest.Eventually(t, "the drop to be known", func() bool { return len(h.srv.Status()[0].Problems) > 0 })
	if all := syncz(t, h.conn); len(all) != 1 || len(all[0].Problems) != 0 {
		t.Fatalf("the listing carries problems: %+v", all)
	}
	if one := syncz(t, h.conn, sidecarID); len(one) != 1 || !strings.Contains(strings.Join(one[0].Problems, "\n"), "dropped") {
		t.Fatalf("the detail lacks the drop: %+v", one)
	}
}

func TestADebugClientThatReadsNothingLosesItsStreamAndCostsNoOneElse(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true, SendTimeout: 500 * time.Millisecond})
	h.store.PutService(service("a", 80))
	h.push()
	// Enough proxies that their syncz is larger than a flow-control window.
	for i := range 300 {
		s := h.sotw(t)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: node(fmt.Sprintf("sidecar~10.2.%d.%d~p-%d.default~default.svc.cluster.local", i/250, i%250, i), nil), TypeUrl: resourcev3.ClusterType})
		s.next(t)
	}
	stuck, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(stuck).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// It asks again and again and never reads: gRPC buffers one answer
	// whatever its size; the next waits for room that never comes, and
	// the stream is closed after the send timeout while others are
	// answered.
	for range 3 {
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: debugapi.Syncz}); err != nil {
			t.Fatal(err)
		}
	}
	xdstest.Eventually(t, "the stuck debug stream to be closed", func() bool {
		return h.counter("flotilla.discovery.send_timeouts") == 1
	})
	if got := syncz(t, h.conn); len(got) != 300 {
		t.Fatalf("another debug client got %d proxies", len(got))
	}
}
