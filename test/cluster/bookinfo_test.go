package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
	"github.com/flotilla-mesh/flotilla/test/load"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// bookinfoApp is Istio's sample application's shape: four services, three
// versions of reviews, each Deployment with its own service account.
var bookinfoApp = []struct {
	service  string
	versions []string
}{
	{"productpage", []string{"v1"}},
	{"details", []string{"v1"}},
	{"reviews", []string{"v1", "v2", "v3"}},
	{"ratings", []string{"v1"}},
}

// bookinfoReplicas is each Deployment's replicas.
const bookinfoReplicas = 2

// bookinfo applies the application as kubectl would (Services,
// ServiceAccounts, Deployments) into a namespace labelled for injection.
// The injector mutates every pod the ReplicaSet controller creates; the
// EndpointSlice controller publishes their kwok IPs; galley normalises
// them; and one simulated sidecar per pod (raw ADS, its node from the
// pod's name, IP, labels and service account) gets from discovery,
// through its Service, every service's cluster and the Ready pods'
// endpoints.
func bookinfo(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	ns, c := appNamespace, env.Client
	for _, app := range bookinfoApp {
		if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: app.service, Labels: map[string]string{"app": app.service, "service": app.service}},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": app.service},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sa := "bookinfo-" + app.service
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, v := range app.versions {
			labels := map[string]string{"app": app.service, "version": v}
			if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: app.service + "-" + v, Labels: labels},
				Spec: appsv1.DeploymentSpec{
					Replicas: ptr(int32(bookinfoReplicas)),
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{
							ServiceAccountName: sa,
							Containers: []corev1.Container{{
								Name: app.service, Image: "docker.io/istio/examples-bookinfo-" + app.service + "-" + v + ":1.20.2",
								Ports: []corev1.ContainerPort{{ContainerPort: 9080}},
							}},
						},
					},
				},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := 0
	for _, app := range bookinfoApp {
		want += bookinfoReplicas * len(app.versions)
	}
	var pods []corev1.Pod
	cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("the %d pods Ready", want), func(ctx context.Context) error {
		var err error
		pods, err = podsOf(ctx, ns, "app")
		if err != nil {
			return err
		}
		if len(pods) != want {
			return fmt.Errorf("%d Ready pods", len(pods))
		}
		return nil
	})
	// What each service's endpoints must be: its Ready pods at 9080.
	wantEndpoints := map[string][]string{}
	for _, p := range pods {
		if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" }) ||
			p.Annotations["sidecar.istio.io/status"] == "" {
			t.Errorf("pod %s was not injected: containers %v, annotations %v", p.Name, p.Spec.Containers, p.Annotations)
		}
		cluster := outbound(p.Labels["app"])
		wantEndpoints[cluster] = append(wantEndpoints[cluster], net.JoinHostPort(p.Status.PodIP, "9080"))
	}
	// An address is one endpoint however many pods kwok gave it (it has
	// been seen to give two pods of a node one IP, which a real cluster's
	// IPAM never does).
	for cluster, eps := range wantEndpoints {
		slices.Sort(eps)
		wantEndpoints[cluster] = slices.Compact(eps)
	}

	// One sidecar per pod, through discovery's Service.
	f := newFleet(len(pods))
	clientsCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	statusAddr := proc.FreeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- load.RunSidecarClients(clientsCtx, load.SidecarClientOptions{
			XDS: "flotilla-discovery." + systemNamespace + ".svc:15010", N: len(pods), Status: statusAddr,
			Workload: func(i int) bootstrap.Node {
				p := pods[i]
				return bootstrap.Node{
					Type: "sidecar", IP: p.Status.PodIP, PodName: p.Name, Namespace: p.Namespace, DomainSuffix: "cluster.local",
					ServiceAccount: p.Spec.ServiceAccountName, ClusterID: "Kubernetes", Labels: p.Labels,
				}
			},
			Log:     tlog{t},
			Observe: f.observe,
		})
	}()
	// They run on for the steps after this one.
	cp.sidecars = f
	cp.stopSidecars = func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("%d sidecars hold every service's cluster and endpoints", len(pods)), func(context.Context) error {
		return f.holds(wantEndpoints)
	})

	// Each replica serves the same: a sidecar's stream on each one's pod
	// IP.
	discoveries, err := podsOf(ctx, systemNamespace, "app.kubernetes.io/name=flotilla-discovery")
	if err != nil || len(discoveries) != 2 {
		t.Fatalf("discovery pods: %d, %v", len(discoveries), err)
	}
	p := pods[0]
	node := fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", p.Status.PodIP, p.Name, ns, ns)
	for _, d := range discoveries {
		addr := net.JoinHostPort(d.Status.PodIP, "15010")
		cp.eventually(t, ctx, time.Minute, "reviews' endpoints from "+d.Name+" at "+addr, func(ctx context.Context) error {
			got, err := endpoints(ctx, addr, node, outbound("reviews"))
			if err != nil {
				return err
			}
			if !slices.Equal(got, wantEndpoints[outbound("reviews")]) {
				return fmt.Errorf("endpoints %v, want %v", got, wantEndpoints[outbound("reviews")])
			}
			return nil
		})
	}
}

// outbound is the outbound cluster of a bookinfo service at port 9080.
func outbound(service string) string {
	return "outbound|9080||" + service + "." + appNamespace + ".svc.cluster.local"
}

// fleet is what each simulated sidecar holds: its clusters (CDS) and
// each cluster's endpoints (EDS), with the EDS responses it applied.
type fleet struct {
	mu        sync.Mutex
	clusters  []map[string]bool
	endpoints []map[string][]string
	edsPushes []int
	// updates and emptied count, per cluster, the EDS responses that
	// held it, and those where it had no endpoint; cds counts the CDS
	// responses.
	updates, emptied []map[string]int
	cds              []int
	// changed is, per cluster, when the client applied the last EDS
	// response that changed its endpoints (before acknowledging it).
	changed []map[string]time.Time
}

// lastChange is when the last client to do so applied cluster's current
// endpoints.
func (f *fleet) lastChange(cluster string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last time.Time
	for i := range f.changed {
		if at := f.changed[i][cluster]; at.After(last) {
			last = at
		}
	}
	return last
}

// fleetMark is what every client had received at a moment.
type fleetMark struct {
	updates []map[string]int
	cds     []int
}

// mark copies the EDS updates per cluster and the CDS responses of every
// client.
func (f *fleet) mark() fleetMark {
	f.mu.Lock()
	defer f.mu.Unlock()
	var m fleetMark
	for i := range f.updates {
		m.updates = append(m.updates, maps.Clone(f.updates[i]))
	}
	m.cds = slices.Clone(f.cds)
	return m
}

// since is what the clients received after m: the EDS responses holding
// each cluster, summed over every client, and an error for each client
// that got a CDS response (during what).
func (f *fleet) since(m fleetMark, what string) (pushed map[string]int, errs []error) {
	now := f.mark()
	pushed = map[string]int{}
	for i := range now.cds {
		if n := now.cds[i] - m.cds[i]; n != 0 {
			errs = append(errs, fmt.Errorf("sidecar %d got %d CDS responses %s", i, n, what))
		}
		for cluster, n := range now.updates[i] {
			if d := n - m.updates[i][cluster]; d > 0 {
				pushed[cluster] += d
			}
		}
	}
	return pushed, errs
}

func newFleet(n int) *fleet {
	f := &fleet{
		clusters: make([]map[string]bool, n), endpoints: make([]map[string][]string, n), edsPushes: make([]int, n),
		updates: make([]map[string]int, n), emptied: make([]map[string]int, n), cds: make([]int, n),
		changed: make([]map[string]time.Time, n),
	}
	for i := range n {
		f.clusters[i], f.endpoints[i], f.changed[i] = map[string]bool{}, map[string][]string{}, map[string]time.Time{}
		f.updates[i], f.emptied[i] = map[string]int{}, map[string]int{}
	}
	return f
}

// size is how many clients there are.
func (f *fleet) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.clusters)
}

// counts is, per client, how many EDS responses held cluster and how
// many of those had no endpoint.
func (f *fleet) counts(cluster string) (updates, emptied []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.updates {
		updates = append(updates, f.updates[i][cluster])
		emptied = append(emptied, f.emptied[i][cluster])
	}
	return updates, emptied
}

// observe records client i's applied response.
func (f *fleet) observe(i int, typeURL string, resources []*anypb.Any) {
	clusters, endpoints := map[string]bool{}, map[string][]string{}
	for _, r := range resources {
		switch typeURL {
		case resourcev3.ClusterType:
			var c clusterv3.Cluster
			if r.UnmarshalTo(&c) == nil {
				clusters[c.GetName()] = true
			}
		case resourcev3.EndpointType:
			var cla endpointv3.ClusterLoadAssignment
			if r.UnmarshalTo(&cla) != nil {
				continue
			}
			var eps []string
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					// What Envoy would send requests to.
					if h := e.GetHealthStatus(); h != corev3.HealthStatus_UNKNOWN && h != corev3.HealthStatus_HEALTHY {
						continue
					}
					sa := e.GetEndpoint().GetAddress().GetSocketAddress()
					eps = append(eps, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
				}
			}
			slices.Sort(eps)
			endpoints[cla.GetClusterName()] = eps
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch typeURL {
	case resourcev3.ClusterType:
		f.clusters[i] = clusters
		f.cds[i]++
	case resourcev3.EndpointType:
		// Only the clusters that changed may come: the others are kept.
		now := time.Now()
		f.edsPushes[i]++
		for cluster, eps := range endpoints {
			if held, ok := f.endpoints[i][cluster]; !ok || !slices.Equal(held, eps) {
				f.changed[i][cluster] = now
			}
			f.endpoints[i][cluster] = eps
			f.updates[i][cluster]++
			if len(eps) == 0 {
				f.emptied[i][cluster]++
			}
		}
	}
}

// holds says how the first client that does not hold want (cluster →
// sorted endpoints) differs, or nil when every client does.
func (f *fleet) holds(want map[string][]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for i := range f.clusters {
		for _, cluster := range slices.Sorted(maps.Keys(want)) {
			if !f.clusters[i][cluster] {
				errs = append(errs, fmt.Errorf("sidecar %d has no cluster %s (of %d)", i, cluster, len(f.clusters[i])))
			} else if got := f.endpoints[i][cluster]; !slices.Equal(got, want[cluster]) {
				errs = append(errs, fmt.Errorf("sidecar %d (%d EDS responses): %s has endpoints %v, want %v", i, f.edsPushes[i], cluster, got, want[cluster]))
			}
		}
	}
	return errors.Join(errs...)
}

// tlog writes the sidecar clients' complaints to the test's log.
type tlog struct{ t testing.TB }

func (l tlog) Write(b []byte) (int, error) {
	l.t.Logf("%s", b)
	return len(b), nil
}
