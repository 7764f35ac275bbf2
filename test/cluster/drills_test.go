package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// galleyLeaderLost: the galley replica holding the status writer's Lease
// is killed (SIGKILL) and its pod deleted. The other replica takes the
// status and caBundle Leases, the ReplicaSet controller's new pod gets a
// process, the webhook keeps refusing through the Service, and the
// sidecars get nothing that did not change: discovery, resubscribing to
// the remaining galley, sends no CDS and no EDS of bookinfo's services;
// only the clusters of galley's own Service (its endpoints did change)
// may be pushed.
func galleyLeaderLost(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	c, f := env.Client, cp.sidecars
	leases := c.CoordinationV1().Leases(systemNamespace)
	holder := func(ctx context.Context, name string) (string, error) {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		if l.Spec.HolderIdentity == nil {
			return "", nil
		}
		return *l.Spec.HolderIdentity, nil
	}
	galleys, err := podsOf(ctx, systemNamespace, "app.kubernetes.io/name=flotilla-galley")
	if err != nil || len(galleys) != 2 {
		t.Fatalf("galley pods: %d, %v", len(galleys), err)
	}
	var leader string
	cp.eventually(t, ctx, time.Minute, "galley's status Lease held by a galley pod", func(ctx context.Context) error {
		h, err := holder(ctx, "flotilla-galley-status")
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(galleys, func(p corev1.Pod) bool { return p.Name == h }) {
			return fmt.Errorf("held by %q, not by a galley pod", h)
		}
		leader = h
		return nil
	})
	m := newMarker(t, ctx, cp)
	before := f.mark()

	start := time.Now()
	cp.crash(t, leader)
	zero := int64(0)
	if err := c.CoreV1().Pods(systemNamespace).Delete(ctx, leader, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	for _, lease := range []string{"flotilla-galley-status", "flotilla-galley-cabundle"} {
		cp.eventually(t, ctx, time.Minute, lease+" moved off the lost leader", func(ctx context.Context) error {
			h, err := holder(ctx, lease)
			if err != nil {
				return err
			}
			if h == "" || h == leader {
				return fmt.Errorf("held by %q", h)
			}
			return nil
		})
	}
	t.Logf("the leases moved %s after the kill", time.Since(start).Round(time.Millisecond))
	cp.eventually(t, ctx, time.Minute, "the replacement galley pod running", func(ctx context.Context) error {
		pods, err := podsOf(ctx, systemNamespace, "app.kubernetes.io/name=flotilla-galley")
		if err != nil {
			return err
		}
		if len(pods) != 2 || cp.running("flotilla-galley") != 2 {
			return fmt.Errorf("%d Ready galley pods, %d processes", len(pods), cp.running("flotilla-galley"))
		}
		return cp.ready(ctx, "flotilla-galley", "15015")
	})
	galleyRefuses(t, ctx, cp)

	// Any push the drill caused reaches a sidecar before the marker's move.
	m.move(t, ctx, cp)
	pushed, errs := f.since(before, "during the drill")
	t.Logf("EDS pushed to the sidecars during the drill (cluster: responses, all sidecars): %v", pushed)
	errs = append(errs, m.pushedOnce(cp, pushed)...)
	for _, cluster := range slices.Sorted(maps.Keys(pushed)) {
		if !strings.Contains(cluster, "flotilla-galley.") {
			errs = append(errs, fmt.Errorf("%s was pushed though only galley's endpoints changed", cluster))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// apiserverRestarted: kube-apiserver restarted (SIGTERM, then the same
// flags and port). Once every client's watches are back (the apiserver's
// registered watches as many as before) and discovery's debounce has
// passed (a later change, the marker's, has reached every sidecar), the
// sidecars have received nothing: galley's informers resumed
// or relisted without withdrawing anything that still exists or
// republishing what did not change (no CDS, no EDS, no service ever
// empty). Then a change made after the restart (reviews-v1 scaled up and
// back) reaches every sidecar: galley watches again.
func apiserverRestarted(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	f := cp.sidecars
	var watched []string
	for _, app := range bookinfoApp {
		watched = append(watched, outbound(app.service))
	}
	emptiedBefore := map[string][]int{}
	for _, cluster := range watched {
		_, emptiedBefore[cluster] = f.counts(cluster)
	}
	watchesBefore, _, _ := apiserverMetrics(t, ctx)
	m := newMarker(t, ctx, cp)
	before := f.mark()

	start := time.Now()
	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver restarted and ready in %s", time.Since(start).Round(time.Millisecond))
	cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("the clients' %.0f watches back", watchesBefore), func(ctx context.Context) error {
		if w, _, _ := apiserverMetrics(t, ctx); w < watchesBefore {
			return fmt.Errorf("%.0f watches", w)
		}
		return nil
	})
	// Any push the restart caused reaches a sidecar before the marker's
	// move.
	m.move(t, ctx, cp)
	pushed, errs := f.since(before, "after the restart")
	errs = append(errs, m.pushedOnce(cp, pushed)...)
	for _, cluster := range slices.Sorted(maps.Keys(pushed)) {
		errs = append(errs, fmt.Errorf("%s was pushed %d times (all sidecars) though nothing changed", cluster, pushed[cluster]))
	}

	// The watches carry changes again: reviews-v1 scaled to 3 pods, then
	// back to 2 (reviews never without endpoints). Only reviews' clusters
	// are pushed: an endpoint change is pushed as the changed services'
	// load assignments only, as Istio's incremental EDS does.
	before = f.mark()
	for _, replicas := range []int{bookinfoReplicas + 1, bookinfoReplicas} {
		cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("reviews-v1 scaled to %d after the restart", replicas), func(ctx context.Context) error {
			return scale(ctx, appNamespace, "reviews-v1", replicas)
		})
		cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("every sidecar holds reviews with reviews-v1 at %d", replicas), func(ctx context.Context) error {
			if err := podsAt(ctx, appNamespace, "app=reviews,version=v1", replicas); err != nil {
				return err
			}
			want, err := endpointsOf(ctx, appNamespace, "app=reviews")
			if err != nil {
				return err
			}
			return f.holds(map[string][]string{outbound("reviews"): want})
		})
	}
	pushed, scaledErrs := f.since(before, "when reviews-v1 scaled")
	errs = append(errs, scaledErrs...)
	t.Logf("EDS pushed to the sidecars when reviews-v1 scaled (cluster: responses, all sidecars): %v", pushed)
	for _, cluster := range slices.Sorted(maps.Keys(pushed)) {
		if !strings.Contains(cluster, "|reviews.") {
			errs = append(errs, fmt.Errorf("%s was pushed %d times (all sidecars) though only reviews' endpoints changed", cluster, pushed[cluster]))
		}
	}
	for _, cluster := range watched {
		_, emptied := f.counts(cluster)
		for i := range emptied {
			if emptied[i] != emptiedBefore[cluster][i] {
				errs = append(errs, fmt.Errorf("sidecar %d held %s with no endpoint", i, cluster))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// marker is a change the drills make after what they test, so that "no
// push" is observed rather than waited for: a selector-less Service whose
// one EndpointSlice the test writes. Galley reads the slice's changes from
// one watch and sends them, after everything it read before, on its MCP
// stream; discovery sends a sidecar its pushes in order on one stream. So
// when every sidecar holds the marker's new address, every push caused
// before the move has arrived.
type marker struct {
	cluster string
	// host is the last octet of the endpoint's address, 10.254.0.host.
	host int
}

const markerName = "drill-marker"

// newMarker creates the marker's Service and EndpointSlice unless an
// earlier drill did, and waits until every sidecar holds its address.
func newMarker(tb testing.TB, ctx context.Context, cp *controlPlane) *marker {
	tb.Helper()
	c := env.Client
	m := &marker{cluster: outbound(markerName), host: 1}
	slice, err := c.DiscoveryV1().EndpointSlices(appNamespace).Get(ctx, markerName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := c.CoreV1().Services(appNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: markerName},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
		}, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
		if _, err := c.DiscoveryV1().EndpointSlices(appNamespace).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: markerName, Labels: map[string]string{
				discoveryv1.LabelServiceName: markerName, discoveryv1.LabelManagedBy: "flotilla-cluster-test",
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{m.address()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(9080))}},
		}, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	case err != nil:
		tb.Fatal(err)
	default:
		if len(slice.Endpoints) != 1 || len(slice.Endpoints[0].Addresses) != 1 {
			tb.Fatalf("the marker's EndpointSlice has %d endpoints, want one address", len(slice.Endpoints))
		}
		if _, err := fmt.Sscanf(slice.Endpoints[0].Addresses[0], "10.254.0.%d", &m.host); err != nil {
			tb.Fatalf("the marker's address %q: %v", slice.Endpoints[0].Addresses[0], err)
		}
	}
	m.wait(tb, ctx, cp)
	return m
}

func (m *marker) address() string { return fmt.Sprintf("10.254.0.%d", m.host) }

// move gives the marker's endpoint the next address and waits until every
// sidecar holds it.
func (m *marker) move(tb testing.TB, ctx context.Context, cp *controlPlane) {
	tb.Helper()
	m.host = m.host%250 + 1
	patch := fmt.Appendf(nil, `{"endpoints":[{"addresses":[%q],"conditions":{"ready":true}}]}`, m.address())
	if _, err := env.Client.DiscoveryV1().EndpointSlices(appNamespace).Patch(ctx, markerName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
	m.wait(tb, ctx, cp)
}

func (m *marker) wait(tb testing.TB, ctx context.Context, cp *controlPlane) {
	tb.Helper()
	want := map[string][]string{m.cluster: {net.JoinHostPort(m.address(), "9080")}}
	cp.eventually(tb, ctx, time.Minute, "every sidecar holds the marker at "+m.address(), func(context.Context) error {
		return cp.sidecars.holds(want)
	})
}

// pushedOnce takes the marker's cluster out of pushed (cluster → EDS
// responses summed over the sidecars since before one move) and says
// whether it was pushed once to each of them: more is a push the drill
// caused.
func (m *marker) pushedOnce(cp *controlPlane, pushed map[string]int) []error {
	n := pushed[m.cluster]
	delete(pushed, m.cluster)
	if sidecars := cp.sidecars.size(); n != sidecars {
		return []error{fmt.Errorf("%s was pushed %d times to %d sidecars, once each when it moved", m.cluster, n, sidecars)}
	}
	return nil
}
