package xds_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

func distribution(t *testing.T, cc grpc.ClientConnInterface, key string) debugapi.ObjectDistribution {
	t.Helper()
	resp, err := fetch(t, cc, debugapi.Distribution, key)
	if err != nil {
		t.Fatalf("distribution: %v", err)
	}
	d, err := debugapi.DistributionOf(resp)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// holding is which of d's proxies hold what want asks for, and which not.
func holding(t *testing.T, d debugapi.ObjectDistribution, want debugapi.Want) (done, waiting []string) {
	t.Helper()
	push, ok, why := d.Required(want)
	for _, p := range d.Proxies {
		if ok && p.Push >= push {
			done = append(done, p.ID)
		} else {
			waiting = append(waiting, p.ID)
		}
	}
	if !ok {
		t.Logf("not on the replica: %s", why)
	}
	return done, waiting
}

// TestDistributionTellsWhichProxiesHoldAVersionOfAnObject: three
// proxyless clients, two watching host a (one holding its ACK back, as a
// proxy stuck applying it would) and one watching host b. A
// VirtualService for a (generation 3) is held by the client that ACKed
// it, and by b's watcher, which it does not concern (its push was
// skipped); the client holding its ACK holds it once it ACKs. A later
// generation, and the deletion, are told apart by the push that first
// held them.
func TestDistributionTellsWhichProxiesHoldAVersionOfAnObject(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	h.store.PutService(service("a", 80))
	h.store.PutService(service("b", 80))
	h.push()
	const (
		acker  = "sidecar~10.1.0.9~acker-1.default~default.svc.cluster.local"
		holder = "sidecar~10.1.0.10~holder-1.default~default.svc.cluster.local"
		other  = "sidecar~10.1.0.11~other-1.default~default.svc.cluster.local"
	)
	sa, sh := h.watchHost(t, "a", acker), h.watchHost(t, "a", holder)
	h.watchHost(t, "b", other)
	const key = "VirtualService/default/a"
	xdstest.Eventually(t, "every proxy to hold the first push", func() bool {
		done, _ := holding(t, distribution(t, h.conn, key), debugapi.Want{Delete: true})
		return len(done) == 3 // an object the replica never had counts as deleted
	})

	vs := func(generation int64, timeout time.Duration) *istio.Object {
		k, _ := istio.ByName("VirtualService")
		return &istio.Object{Kind: k, Meta: istio.Meta{Name: "a", Namespace: "default", Generation: generation}, Spec: &networking.VirtualService{
			Hosts: []string{"a"},
			Http:  []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a"}}}, Timeout: durationpb.New(timeout)}},
		}}
	}
	h.store.PutObject(vs(3, 3*time.Second))
	h.push()
	ra, rh := sa.next(t), sh.next(t)
	sa.send(t, ack(ra, "a.default.svc.cluster.local:80"))
	var done, waiting []string
	xdstest.Eventually(t, "the acker and b's watcher to hold generation 3", func() bool {
		done, waiting = holding(t, distribution(t, h.conn, key), debugapi.Want{Version: "3"})
		return len(done) == 2
	})
	if len(waiting) != 1 || waiting[0] != holder {
		t.Fatalf("done %v, waiting %v: want the holder alone waiting", done, waiting)
	}
	d := distribution(t, h.conn, key)
	if len(d.History) != 1 || d.History[0].Version != "3" || d.History[0].Push != 2 || d.Push != 2 {
		t.Fatalf("history %+v at push %d: want generation 3 from push 2", d.History, d.Push)
	}
	sh.send(t, ack(rh, "a.default.svc.cluster.local:80"))
	xdstest.Eventually(t, "the holder to hold it once it ACKs", func() bool {
		done, _ = holding(t, distribution(t, h.conn, key), debugapi.Want{Version: "3"})
		return len(done) == 3
	})

	// Generation 4: 3 is still held (by a later version); 4 only once ACKed.
	h.store.PutObject(vs(4, 4*time.Second))
	h.push()
	ra, rh = sa.next(t), sh.next(t)
	if done, _ := holding(t, distribution(t, h.conn, key), debugapi.Want{Version: "3"}); len(done) != 3 {
		t.Fatalf("generation 3 held by %v after 4 was pushed: want all three", done)
	}
	sa.send(t, ack(ra, "a.default.svc.cluster.local:80"))
	sh.send(t, ack(rh, "a.default.svc.cluster.local:80"))
	xdstest.Eventually(t, "every proxy to hold generation 4", func() bool {
		done, _ = holding(t, distribution(t, h.conn, key), debugapi.Want{Version: "4"})
		return len(done) == 3
	})

	// Deleted: held by those that ACKed the push that removed it.
	h.store.Delete(vs(0, 0).Kind.TypeURL(), "default/a")
	h.push()
	sa.send(t, ack(sa.next(t), "a.default.svc.cluster.local:80"))
	sh.next(t) // the holder takes the deletion, and does not ACK it
	xdstest.Eventually(t, "the acker to hold the deletion", func() bool {
		done, waiting = holding(t, distribution(t, h.conn, key), debugapi.Want{Delete: true})
		return len(done) == 2
	})
	if len(waiting) != 1 || waiting[0] != holder {
		t.Fatalf("deletion: done %v, waiting %v", done, waiting)
	}
	if d := distribution(t, h.conn, key); len(d.History) != 3 || !d.History[2].Deleted || d.History[2].Push != 4 {
		t.Fatalf("history %+v: want 3, 4, deleted at push 4", d.History)
	}
}

func TestDistributionNamesOneObject(t *testing.T) {
	h := newHarnessWith(t, xds.Options{PlaintextDebug: true})
	h.push()
	for _, names := range [][]string{nil, {"VirtualService/default/a", "VirtualService/default/b"}} {
		if _, err := fetch(t, h.conn, debugapi.Distribution, names...); grpcstatus.Code(err) != codes.InvalidArgument {
			t.Errorf("%d names: %v, want InvalidArgument", len(names), err)
		}
	}
	if d := distribution(t, h.conn, "VirtualService/default/never"); len(d.History) != 0 || d.Push != 1 {
		t.Fatalf("an object never seen: %+v", d)
	}
}
