package load

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// ReferenceOptions configures a reference-mode run: Istio's documented
// performance reference point (1,000 services, 2,000 sidecars) with the
// services as Kubernetes Services and EndpointSlices in a real
// kube-apiserver, read by galley in cluster mode, served by Replicas
// discovery processes to sidecar clients spread over ClientProcs
// processes.
type ReferenceOptions struct {
	// BinDir holds flotilla-galley and flotilla-discovery, KubeBinDir
	// kube-apiserver and etcd; Self is the xdsload binary.
	BinDir, KubeBinDir, Self string
	Sidecars, Services       int
	Replicas, ClientProcs    int
	// Changes is how many route and how many endpoint changes are
	// measured (alternating).
	Changes int
	Delta   bool
	// Ramp starts each process's clients evenly over this long, as a
	// cluster's pods connect over a rollout (at once when zero).
	Ramp time.Duration
	// ProfileDir, when set, receives the first replica's heap profile
	// after the initial sync (heap.pb.gz) and a second into each change,
	// while the sidecars are still being sent it (heap-<kind>-<n>.pb.gz),
	// and its CPU profile of each change's first two seconds
	// (cpu-<kind>-<n>.pb.gz).
	ProfileDir string
	// DiscoveryEnv is added to the replicas' environment (GOMEMLIMIT).
	DiscoveryEnv []string
	Log          io.Writer
	// SyncTimeout bounds the initial sync and each change (default 15
	// minutes).
	SyncTimeout time.Duration
}

// ReferenceReport is a reference-mode run's result.
type ReferenceReport struct {
	Sidecars, Services, Replicas, ClientProcs int
	Delta                                     bool
	Ramp                                      time.Duration
	// Created is the time to create the Kubernetes objects; GalleyReady
	// from galley's start to its serving them all.
	Created, GalleyReady time.Duration
	// Connected is from starting the clients to the last one holding all
	// four types.
	Connected time.Duration
	Changes   []SidecarChange
	// ReplicaRSSMiB is each discovery replica's resident memory after the
	// changes, ReplicaProxies how many sidecars each served.
	ReplicaRSSMiB  []float64
	ReplicaProxies []int
	// SyncCPU is the CPU seconds of discovery (all replicas) and galley
	// from starting the clients to the initial sync.
	DiscoverySyncCPU, GalleySyncCPU float64
	GalleyRSSMiB                    float64
	ClientsRSSMiB                   float64
	Errors                          int
}

func (r *ReferenceReport) String() string {
	var b strings.Builder
	mode := "sotw"
	if r.Delta {
		mode = "delta"
	}
	fmt.Fprintf(&b, "reference: %d sidecars (%s) over %d client processes, %d Kubernetes Services (EndpointSlices, galley in cluster mode), %d discovery replicas\n",
		r.Sidecars, mode, r.ClientProcs, r.Services, r.Replicas)
	fmt.Fprintf(&b, "  objects created in %s; galley serving them %s after its start\n", r.Created.Round(time.Millisecond), r.GalleyReady.Round(time.Millisecond))
	fmt.Fprintf(&b, "  initial sync of all in %s (clients started over %s): CPU discovery %.1fs galley %.1fs\n", r.Connected.Round(time.Millisecond), r.Ramp, r.DiscoverySyncCPU, r.GalleySyncCPU)
	for _, c := range r.Changes {
		fmt.Fprintf(&b, "  %s change: %s, CPU discovery %.2fs galley %.2fs clients %.2fs\n", c.Kind, c.stages(), c.DiscoveryCPU, c.GalleyCPU, c.ClientsCPU)
		for _, t := range c.Types {
			fmt.Fprintf(&b, "    %s: %d clients  p50 %s  p99 %s  max %s  (%.1f responses, %.1f resources per client)\n", t.Type, t.Clients,
				t.P50.Round(time.Millisecond), t.P99.Round(time.Millisecond), t.Max.Round(time.Millisecond), t.Responses, t.Resources)
		}
	}
	for i, rss := range r.ReplicaRSSMiB {
		fmt.Fprintf(&b, "  discovery replica %d: %d sidecars, RSS %.0f MiB\n", i, r.ReplicaProxies[i], rss)
	}
	fmt.Fprintf(&b, "  galley RSS %.0f MiB; clients' processes %.0f MiB together; clients with stream errors: %d\n", r.GalleyRSSMiB, r.ClientsRSSMiB, r.Errors)
	return b.String()
}

// RunReference measures the reference point.
func RunReference(ctx context.Context, o ReferenceOptions) (*ReferenceReport, error) {
	if o.Sidecars <= 0 || o.Services <= 0 || o.Replicas <= 0 || o.ClientProcs <= 0 || o.Changes < 0 {
		return nil, errors.New("sidecars, services, replicas and client processes must be positive, changes not negative")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 15 * time.Minute
	}
	r := &ReferenceReport{Sidecars: o.Sidecars, Services: o.Services, Replicas: o.Replicas, ClientProcs: o.ClientProcs, Delta: o.Delta, Ramp: o.Ramp}
	env, fast, err := startKube(ctx, kubeenv.Options{BinDir: o.KubeBinDir})
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Stop() }()
	w, err := newReferenceWorld(fast, o.Services)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if err := w.create(ctx); err != nil {
		return nil, err
	}
	r.Created = time.Since(began)
	fmt.Fprintf(o.Log, "xdsload: %d Services, %d Pods, %d EndpointSlices, %d VirtualServices and DestinationRules created in %s\n",
		o.Services, 3*o.Services, o.Services, o.Services, r.Created)

	galleyStart := time.Now()
	cg, err := startClusterGalley(ctx, o.Log, o.BinDir, env)
	if err != nil {
		return nil, err
	}
	defer cg.stop()
	galley, mcpAddr := cg.cmd, cg.mcpAddr
	replicas, err := startReplicas(ctx, o.Log, o.BinDir, mcpAddr, o.DiscoveryEnv, 0, o.Replicas)
	defer func() {
		for _, rp := range replicas {
			stop(rp.cmd)
			rp.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	// The replicas hold the mesh: svc-<last>'s VirtualService has reached
	// each (galley listed everything before it served any).
	if _, err := waitHeld(ctx, replicas, fmt.Sprintf("VirtualService/load/svc-%d", o.Services-1), nil); err != nil {
		return nil, err
	}
	r.GalleyReady = time.Since(galleyStart)
	var xdsAddrs []string
	ccs := make([]*grpc.ClientConn, len(replicas))
	for i, rp := range replicas {
		xdsAddrs = append(xdsAddrs, rp.xdsAddr)
		ccs[i] = rp.cc
	}
	discCmds := func() []*exec.Cmd {
		var out []*exec.Cmd
		for _, rp := range replicas {
			out = append(out, rp.cmd)
		}
		return out
	}()

	fmt.Fprintf(o.Log, "xdsload: galley and %d discovery replicas ready; starting %d sidecar clients in %d processes\n", o.Replicas, o.Sidecars, o.ClientProcs)
	d0, g0 := cpuOf(discCmds...), cpuOf(galley)
	began = time.Now()
	clients, ms, err := startClientProcs(ctx, o.Log, o.Self, strings.Join(xdsAddrs, ","), o.Sidecars, o.ClientProcs, o.Services, o.Delta, o.Ramp)
	defer func() {
		for _, c := range clients {
			stop(c)
		}
	}()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(o.SyncTimeout)
	for {
		s, err := ms.synced(ctx)
		if err == nil && s.Synced == o.Sidecars {
			r.Connected = time.Unix(0, s.Last).Sub(began)
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("initial sync: %d of %d clients hold all four types after %s (last client error: %q)", s.Synced, o.Sidecars, o.SyncTimeout, s.Error)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return nil, err
		}
	}
	r.DiscoverySyncCPU, r.GalleySyncCPU = cpuOf(discCmds...)-d0, cpuOf(galley)-g0
	if err := (profiler{dir: o.ProfileDir, admin: replicas[0].admin}).save(ctx, "heap.pb.gz", "heap?gc=1"); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "xdsload: %d sidecars in sync in %s\n", o.Sidecars, r.Connected)

	so := SidecarOptions{Services: o.Services, SyncTimeout: o.SyncTimeout}
	weight, epoch := 10, 0
	for i := range 2 * o.Changes {
		if err := sleep(ctx, 3*time.Second); err != nil { // the previous change settles
			return nil, err
		}
		kind, expect := "route", resourcev3.RouteType
		change := func() error {
			weight = 100 - weight
			return w.setWeight(ctx, 0, weight)
		}
		if i%2 == 1 {
			kind, expect = "endpoint", resourcev3.EndpointType
			change = func() error {
				epoch++
				return w.moveEndpoint(ctx, 0, epoch)
			}
		}
		d0, g0, c0 := cpuOf(discCmds...), cpuOf(galley), cpuOf(clients...)
		t0 := time.Now()
		if err := change(); err != nil {
			return nil, err
		}
		cpu := make(chan error, 1)
		go func() {
			cpu <- profiler{dir: o.ProfileDir, admin: replicas[0].admin}.save(ctx, fmt.Sprintf("cpu-%s-%d.pb.gz", kind, i/2+1), "profile?seconds=2")
		}()
		during := make(chan error, 1)
		go func() {
			if err := sleep(ctx, time.Second); err != nil {
				during <- err
				return
			}
			during <- profiler{dir: o.ProfileDir, admin: replicas[0].admin}.save(ctx, fmt.Sprintf("heap-%s-%d.pb.gz", kind, i/2+1), "heap?gc=1")
		}()
		var d1, g1, c1 float64
		c, err := measureChange(ctx, ms, ccs, so, kind, expect, t0, func() {
			d1, g1, c1 = cpuOf(discCmds...), cpuOf(galley), cpuOf(clients...)
		})
		if err != nil {
			return nil, fmt.Errorf("%s change %d: %w", kind, i/2+1, err)
		}
		if err := errors.Join(<-during, <-cpu); err != nil {
			return nil, err
		}
		c.DiscoveryCPU, c.GalleyCPU, c.ClientsCPU = d1-d0, g1-g0, c1-c0
		r.Changes = append(r.Changes, *c)
		fmt.Fprintf(o.Log, "xdsload: %s change measured\n", kind)
	}
	for _, rp := range replicas {
		rss, err := proc.RSSMiB(rp.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		ps, err := syncz(ctx, rp.cc)
		if err != nil {
			return nil, err
		}
		r.ReplicaRSSMiB = append(r.ReplicaRSSMiB, rss)
		r.ReplicaProxies = append(r.ReplicaProxies, len(ps))
	}
	if r.GalleyRSSMiB, err = proc.RSSMiB(galley.Process.Pid); err != nil {
		return nil, err
	}
	for _, c := range clients {
		rss, err := proc.RSSMiB(c.Process.Pid)
		if err != nil {
			return nil, err
		}
		r.ClientsRSSMiB += rss
	}
	if s, err := ms.synced(ctx); err == nil {
		r.Errors = s.Errors
	}
	return r, nil
}

// referenceWorld is the sidecar mode's mesh (sidecarServices,
// sidecarRouting) as Kubernetes objects: in namespace "load", Service
// svc-i (ports http 80 and http-admin 8080) selecting app=svc-i, its
// three Pods (v1, v1, v2: the labels subsets select, which galley reads
// through the EndpointSlice's targetRefs) at the addresses SidecarNode
// gives the sidecars, one EndpointSlice, and the VirtualService and
// DestinationRule.
type referenceWorld struct {
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	services int
}

var (
	virtualServices  = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
	destinationRules = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
)

func newReferenceWorld(cfg *rest.Config, services int) (*referenceWorld, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &referenceWorld{kube: kube, dyn: dyn, services: services}, nil
}

func (w *referenceWorld) create(ctx context.Context) error {
	if err := createNamespaces(ctx, w.kube); err != nil {
		return err
	}
	return parallel(ctx, w.services, func(i int) error {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := w.kube.CoreV1().ServiceAccounts("load").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		for j := range 3 {
			version := "v1"
			if j == 2 {
				version = "v2"
			}
			if _, err := w.kube.CoreV1().Pods("load").Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, j), Labels: map[string]string{"app": name, "version": version, "security.istio.io/tlsMode": "istio"}},
				Spec:       corev1.PodSpec{ServiceAccountName: name, Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
			}, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		if _, err := w.kube.CoreV1().Services("load").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{
				{Name: "http", Port: 80}, {Name: "http-admin", Port: 8080},
			}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := w.kube.DiscoveryV1().EndpointSlices("load").Create(ctx, w.slice(i, 0), metav1.CreateOptions{}); err != nil {
			return err
		}
		for _, doc := range []string{versionSplit(i, 10), versionSubsets(i)} {
			if err := w.apply(ctx, doc); err != nil {
				return err
			}
		}
		return nil
	})
}

// createNamespaces creates "load", "istio-system" and the clients'
// namespaces (those that exist are left).
func createNamespaces(ctx context.Context, kube kubernetes.Interface) error {
	for _, ns := range append([]string{"load", "istio-system"}, clientNamespaces()...) {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func clientNamespaces() []string {
	var out []string
	for ns := range ClientNamespaces {
		out = append(out, fmt.Sprintf("ns-%d", ns))
	}
	return out
}

// clusterGalley is galley in cluster mode against a kubeenv apiserver.
type clusterGalley struct {
	cmd            *exec.Cmd
	mcpAddr, admin string
	dir            string
}

// startKube starts a kube-apiserver (and, with o.Cluster, the rest of a
// cluster) with Istio's CRDs installed, and returns a client configuration
// whose rate limits do not hold the load tool back.
func startKube(ctx context.Context, o kubeenv.Options) (*kubeenv.Env, *rest.Config, error) {
	env, err := kubeenv.Start(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		_ = env.Stop()
		return nil, nil, err
	}
	fast := rest.CopyConfig(env.Config)
	fast.QPS, fast.Burst = 5000, 10000
	return env, fast, nil
}

// startClusterGalley starts galley reading env's apiserver (system
// namespace istio-system) and waits until it is ready.
func startClusterGalley(ctx context.Context, log io.Writer, binDir string, env *kubeenv.Env) (*clusterGalley, error) {
	dir, err := os.MkdirTemp("", "xdsload-")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	addrs, err := freeAddrs(2)
	if err == nil {
		err = env.WriteKubeconfig(kubeconfig)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g := &clusterGalley{mcpAddr: addrs[0], admin: addrs[1], dir: dir}
	if g.cmd, err = start(ctx, log, nil, filepath.Join(binDir, "flotilla-galley"),
		"--kubeconfig", kubeconfig, "--mcp-address", g.mcpAddr, "--admin-address", g.admin, "--log-level", "warn", "--system-namespace", "istio-system"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := waitReady(ctx, g.admin); err != nil {
		g.stop()
		return nil, fmt.Errorf("galley: %w", err)
	}
	return g, nil
}

func (g *clusterGalley) stop() {
	stop(g.cmd)
	os.RemoveAll(g.dir)
}

// cpuOf is the CPU seconds the processes used so far, summed.
func cpuOf(cmds ...*exec.Cmd) float64 {
	var s float64
	for _, c := range cmds {
		v, _ := proc.CPUSeconds(c.Process.Pid)
		s += v
	}
	return s
}

// slice is svc-i's EndpointSlice; endpointEpoch moves the third
// endpoint of svc-0, as sidecarServices does.
func (w *referenceWorld) slice(i, endpointEpoch int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%d", i)
	ready := true
	http, admin := "http", "http-admin"
	p80, p8080 := int32(80), int32(8080)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Port: &p80}, {Name: &admin, Port: &p8080}},
	}
	for j := range 3 {
		addr := fmt.Sprintf("10.%d.%d.%d", 1+i/256, i%256, j+1)
		if i == 0 && j == 2 && endpointEpoch%2 == 1 {
			addr = "10.250.0.3"
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "load", Name: fmt.Sprintf("%s-%d", name, j)},
		})
	}
	return s
}

// apply creates one Istio object written as YAML.
func (w *referenceWorld) apply(ctx context.Context, doc string) error {
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(strings.TrimSuffix(strings.TrimSpace(doc), "---")), &u.Object); err != nil {
		return err
	}
	gvr := virtualServices
	if u.GetKind() == "DestinationRule" {
		gvr = destinationRules
	}
	_, err := w.dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, &u, metav1.CreateOptions{})
	return err
}

// setWeight sets the v2 weight of svc-i's VirtualService (the route
// change).
func (w *referenceWorld) setWeight(ctx context.Context, i, v2 int) error {
	patch := fmt.Sprintf(`{"spec":{"http":[{"route":[{"destination":{"host":"svc-%[1]d.load.svc.cluster.local","subset":"v1"},"weight":%[2]d},{"destination":{"host":"svc-%[1]d.load.svc.cluster.local","subset":"v2"},"weight":%[3]d}]}]}}`, i, 100-v2, v2)
	_, err := w.dyn.Resource(virtualServices).Namespace("load").Patch(ctx, fmt.Sprintf("svc-%d", i), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// moveEndpoint moves svc-i's third endpoint (the endpoint change).
func (w *referenceWorld) moveEndpoint(ctx context.Context, i, epoch int) error {
	cur, err := w.kube.DiscoveryV1().EndpointSlices("load").Get(ctx, fmt.Sprintf("svc-%d-abcde", i), metav1.GetOptions{})
	if err != nil {
		return err
	}
	next := w.slice(i, epoch)
	next.ResourceVersion = cur.ResourceVersion
	_, err = w.kube.DiscoveryV1().EndpointSlices("load").Update(ctx, next, metav1.UpdateOptions{})
	return err
}

// parallel runs job(0..n-1) on 16 workers and returns the first error.
func parallel(ctx context.Context, n int, job func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs error
	)
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := job(i); err != nil {
					mu.Lock()
					errs = errors.Join(errs, fmt.Errorf("object %d: %w", i, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			close(next)
			wg.Wait()
			return ctx.Err()
		}
	}
	close(next)
	wg.Wait()
	return errs
}

// clientStatus is what the measurement reads of the clients' processes.
type clientStatus interface {
	synced(ctx context.Context) (SyncState, error)
	acks(ctx context.Context, t string, since time.Time) (ClientAcks, error)
}

// multiStatus reads several clients' processes, each running a range
// of client indices, in order: it reports them as one.
type multiStatus []*statusClient

// startClientProcs starts total sidecar clients spread evenly over procs
// processes (startSidecarClients), numbered from 0 across them. What it
// started is returned with an error too, for the caller to stop.
func startClientProcs(ctx context.Context, log io.Writer, self, xdsAddr string, total, procs, services int, delta bool, ramp time.Duration, extra ...string) ([]*exec.Cmd, multiStatus, error) {
	var cmds []*exec.Cmd
	var ms multiStatus
	for k := range procs {
		first, last := k*total/procs, (k+1)*total/procs
		cmd, sc, err := startSidecarClients(ctx, log, self, xdsAddr, last-first, services, delta, ramp, first, extra...)
		if err != nil {
			return cmds, ms, err
		}
		cmds = append(cmds, cmd)
		ms = append(ms, sc)
	}
	return cmds, ms, nil
}

func (m multiStatus) synced(ctx context.Context) (SyncState, error) {
	var all SyncState
	for _, s := range m {
		st, err := s.synced(ctx)
		if err != nil {
			return all, err
		}
		all.Synced += st.Synced
		all.Last = max(all.Last, st.Last)
		all.Errors += st.Errors
		all.Streams += st.Streams
		all.Error = cmp.Or(all.Error, st.Error)
	}
	return all, nil
}

func (m multiStatus) acks(ctx context.Context, t string, since time.Time) (ClientAcks, error) {
	var all ClientAcks
	for _, s := range m {
		a, err := s.acks(ctx, t, since)
		if err != nil {
			return all, err
		}
		all.Acked = append(all.Acked, a.Acked...)
		all.Responses = append(all.Responses, a.Responses...)
		all.Resources = append(all.Resources, a.Resources...)
		all.Nacked = append(all.Nacked, a.Nacked...)
	}
	return all, nil
}
