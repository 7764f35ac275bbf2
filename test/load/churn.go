package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// This file is the churn mode: a whole cluster (kube-apiserver, etcd, the
// controller manager, the scheduler and kwok's simulated nodes) running
// Deployments whose pods the ReplicaSet controller makes, the scheduler
// places and kwok reports Ready, and whose EndpointSlices the
// EndpointSlice controller writes; galley reads them in cluster mode,
// discovery serves sidecar clients that keep every cluster's endpoints;
// then waves of rolling restarts (`kubectl rollout restart`), each of a
// part of the Deployments, at a fixed interval.

// ChurnOptions configures a churn-mode run.
type ChurnOptions struct {
	// BinDir holds flotilla-galley and flotilla-discovery, KubeBinDir the
	// cluster's binaries; Self is the xdsload binary.
	BinDir, KubeBinDir, Self string
	// Deployments of PodsEach pods, each behind a Service of its own.
	Deployments, PodsEach int
	Sidecars, ClientProcs int
	// Waves rolling restarts, Interval apart, each of Fraction of the
	// Deployments (the next ones in turn).
	Waves    int
	Interval time.Duration
	Fraction float64
	// ProfileDir, when set, receives galley's and discovery's CPU
	// profiles over the waves (galley-cpu.pb.gz, discovery-cpu.pb.gz) and
	// their heaps after the last (galley-heap.pb.gz,
	// discovery-heap.pb.gz).
	ProfileDir string
	Log        io.Writer
	// SyncTimeout bounds each wait: the pods Ready, the sidecars in sync,
	// the last wave settled (default 15 minutes).
	SyncTimeout time.Duration
}

// churnPodsPerNode is each simulated node's capacity: a node's /24 pod
// range holds 254.
const churnPodsPerNode = 250

// ChurnWave is one rolling restart.
type ChurnWave struct {
	Deployments, Pods int
	// Settled is how long after the wave began its Deployments were rolled
	// (every new pod Ready, every old one gone) and every sidecar held
	// every Service's Ready endpoints; zero when the next wave began
	// first.
	Settled time.Duration
	// Lag is, once settled, the time from the last pod turning Ready or
	// going (as a watch of the pods saw it) to the last sidecar's EDS
	// response.
	Lag time.Duration
}

// ChurnReport is a churn-mode run's result.
type ChurnReport struct {
	Deployments, Pods, Nodes, Sidecars int
	Interval                           time.Duration
	Fraction                           float64
	// Created is from creating the Deployments to every pod Ready;
	// GalleyCreateCPU galley's CPU seconds during it.
	Created         time.Duration
	GalleyCreateCPU float64
	// Connected is from starting the clients to every one holding every
	// Service's endpoints.
	Connected time.Duration
	Waves     []ChurnWave
	// Settled is from the first wave's start to the last wave settled;
	// Lag its final lag (ChurnWave.Lag).
	Settled, Lag time.Duration
	// Unsettled says why the last wave did not settle within SyncTimeout
	// (the figures are still reported; its lag is then zero).
	Unsettled string
	// PodChanges counts the pods turning Ready, stopping serving (being
	// deleted) and gone during the churn.
	PodChanges int
	// EDSPerSidecar is, per sidecar and sorted, the EDS responses it
	// applied during the churn.
	EDSPerSidecar []int
	// CPU seconds during the churn and RSS after it.
	GalleyCPU, DiscoveryCPU       float64
	GalleyRSSMiB, DiscoveryRSSMiB float64
	// Watches is the apiserver's open watches (apiserver_longrunning_requests,
	// verb WATCH) before galley started, with galley running before the
	// churn, and after it.
	WatchesBefore, WatchesGalley, WatchesAfter int
	Errors                                     int
}

func (r *ChurnReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "churn: %d Deployments of %d pods (%d pods on %d kwok nodes), %d sidecars watching every Service's endpoints\n",
		r.Deployments, r.Pods/max(r.Deployments, 1), r.Pods, r.Nodes, r.Sidecars)
	fmt.Fprintf(&b, "  created and Ready in %s (galley %.1f CPU-s); sidecars holding every endpoint %s after they started\n",
		r.Created.Round(time.Second), r.GalleyCreateCPU, r.Connected.Round(time.Millisecond))
	for i, w := range r.Waves {
		if w.Settled == 0 {
			fmt.Fprintf(&b, "  wave %d: %d Deployments (%d pods) restarted; not settled before the next wave\n", i+1, w.Deployments, w.Pods)
			continue
		}
		fmt.Fprintf(&b, "  wave %d: %d Deployments (%d pods) restarted; settled in %s; last pod change to last sidecar's EDS %s\n",
			i+1, w.Deployments, w.Pods, w.Settled.Round(time.Millisecond), w.Lag.Round(time.Millisecond))
	}
	if r.Unsettled != "" {
		fmt.Fprintf(&b, "  %d waves every %s: %d pod changes; the last did not settle: %s\n", len(r.Waves), r.Interval, r.PodChanges, r.Unsettled)
	} else {
		fmt.Fprintf(&b, "  %d waves every %s: %d pod changes; settled %s after the first began; final lag %s\n",
			len(r.Waves), r.Interval, r.PodChanges, r.Settled.Round(time.Millisecond), r.Lag.Round(time.Millisecond))
	}
	if e := r.EDSPerSidecar; len(e) > 0 {
		fmt.Fprintf(&b, "  EDS responses per sidecar during the churn: min %d, median %d, max %d\n", e[0], e[len(e)/2], e[len(e)-1])
	}
	fmt.Fprintf(&b, "  during the churn: galley %.1f CPU-s, discovery %.1f CPU-s; after it: galley RSS %.0f MiB, discovery RSS %.0f MiB\n",
		r.GalleyCPU, r.DiscoveryCPU, r.GalleyRSSMiB, r.DiscoveryRSSMiB)
	fmt.Fprintf(&b, "  apiserver watches: %d before galley, %d with galley, %d after the churn; clients with stream errors: %d\n",
		r.WatchesBefore, r.WatchesGalley, r.WatchesAfter, r.Errors)
	return b.String()
}

// RunChurn measures the churn.
func RunChurn(ctx context.Context, o ChurnOptions) (*ChurnReport, error) {
	if o.Deployments <= 0 || o.PodsEach <= 0 || o.Sidecars <= 0 || o.ClientProcs <= 0 || o.Waves < 0 || o.Fraction <= 0 || o.Fraction > 1 || o.Interval <= 0 {
		return nil, errors.New("deployments, pods each, sidecars, client processes and the interval must be positive, waves not negative, the fraction in (0, 1]")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 15 * time.Minute
	}
	pods := o.Deployments * o.PodsEach
	// Room for the surge: a rolling update's 25 % more pods at once.
	nodes := (pods+pods/4)/churnPodsPerNode + 1
	r := &ChurnReport{Deployments: o.Deployments, Pods: pods, Nodes: nodes, Sidecars: o.Sidecars, Interval: o.Interval, Fraction: o.Fraction}
	env, fast, err := startKube(ctx, kubeenv.Options{
		BinDir: o.KubeBinDir, StartTimeout: 5 * time.Minute,
		Cluster: &kubeenv.ClusterOptions{Nodes: nodes, MaxPodsPerNode: churnPodsPerNode, ControllerQPS: 500},
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Stop() }()
	kube, err := kubernetes.NewForConfig(fast)
	if err != nil {
		return nil, err
	}
	if err := createNamespaces(ctx, kube); err != nil {
		return nil, err
	}
	if r.WatchesBefore, err = watchCount(ctx, kube); err != nil {
		return nil, err
	}

	// The control plane first: it sees the cluster come up, as it would.
	cg, err := startClusterGalley(ctx, o.Log, o.BinDir, env)
	if err != nil {
		return nil, err
	}
	defer cg.stop()
	galley, galleyAdmin := cg.cmd, cg.admin
	replicas, err := startReplicas(ctx, o.Log, o.BinDir, cg.mcpAddr, nil, 0, 1)
	defer func() {
		for _, rp := range replicas {
			stop(rp.cmd)
			rp.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	disc := replicas[0]
	if r.WatchesGalley, err = watchCount(ctx, kube); err != nil {
		return nil, err
	}

	clock, err := watchServing(ctx, kube)
	if err != nil {
		return nil, err
	}
	g0 := cpuOf(galley)
	began := time.Now()
	if err := parallel(ctx, o.Deployments, func(i int) error { return createDeployment(ctx, kube, i, o.PodsEach) }); err != nil {
		return nil, err
	}
	all := make([]int, o.Deployments)
	for i := range all {
		all[i] = i
	}
	if err := waitFor(ctx, o.SyncTimeout, "every Deployment rolled out", func() error { return rolledOut(ctx, kube, all, o.PodsEach) }); err != nil {
		return nil, err
	}
	r.Created, r.GalleyCreateCPU = time.Since(began), cpuOf(galley)-g0
	fmt.Fprintf(o.Log, "xdsload: %d Deployments (%d pods on %d nodes) Ready in %s\n", o.Deployments, pods, nodes, r.Created)

	began = time.Now()
	// --services 0: every client is a sidecar of a client namespace, none
	// of the Deployments' pods.
	clients, ms, err := startClientProcs(ctx, o.Log, o.Self, disc.xdsAddr, o.Sidecars, o.ClientProcs, 0, false, 0, "--endpoints")
	defer func() {
		for _, c := range clients {
			stop(c)
		}
	}()
	if err != nil {
		return nil, err
	}
	holdAll := func() error {
		want := clock.wantEndpoints(o.Deployments)
		st, err := ms.stale(ctx, want)
		if err != nil {
			return err
		}
		if st.Stale > 0 {
			return fmt.Errorf("%d (sidecar, Service) pairs stale, e.g. %s", st.Stale, st.Example)
		}
		return nil
	}
	if err := waitFor(ctx, o.SyncTimeout, "every sidecar holding every Service's endpoints", holdAll); err != nil {
		return nil, err
	}
	r.Connected = time.Since(began)
	fmt.Fprintf(o.Log, "xdsload: %d sidecars hold every endpoint after %s\n", o.Sidecars, r.Connected)

	edsBefore, err := ms.totals(ctx, resourcev3.EndpointType)
	if err != nil {
		return nil, err
	}
	changesBefore := clock.changes()
	g0, d0 := cpuOf(galley), cpuOf(disc.cmd)
	churnStart := time.Now()
	galleyProf, discProf := profiler{dir: o.ProfileDir, admin: galleyAdmin}, profiler{dir: o.ProfileDir, admin: disc.admin}
	profiled := []<-chan error{
		galleyProf.start(ctx, "galley-cpu.pb.gz", time.Duration(o.Waves)*o.Interval),
		discProf.start(ctx, "discovery-cpu.pb.gz", time.Duration(o.Waves)*o.Interval),
	}
	per := max(1, int(float64(o.Deployments)*o.Fraction))
	var rolled []int // every Deployment restarted so far
	for w := range o.Waves {
		waveStart := churnStart.Add(time.Duration(w) * o.Interval)
		if err := sleep(ctx, time.Until(waveStart)); err != nil {
			return nil, err
		}
		var these []int
		for k := range per {
			these = append(these, (w*per+k)%o.Deployments)
		}
		if err := parallel(ctx, len(these), func(k int) error { return restart(ctx, kube, these[k], w) }); err != nil {
			return nil, err
		}
		rolled = append(rolled, these...)
		wave := ChurnWave{Deployments: len(these), Pods: len(these) * o.PodsEach}
		next := waveStart.Add(o.Interval)
		if w == o.Waves-1 {
			next = time.Now().Add(o.SyncTimeout)
		}
		settled := func() error {
			if err := rolledOut(ctx, kube, rolled, o.PodsEach); err != nil {
				return err
			}
			return holdAll()
		}
		if err := waitFor(ctx, time.Until(next), "", settled); err == nil {
			wave.Settled = time.Since(waveStart)
			if wave.Lag, err = lastEDS(ctx, ms, clock); err != nil {
				return nil, err
			}
		} else if w == o.Waves-1 {
			r.Unsettled = err.Error()
		}
		r.Waves = append(r.Waves, wave)
		fmt.Fprintf(o.Log, "xdsload: wave %d of %d: %d Deployments restarted, settled after %s\n", w+1, o.Waves, len(these), wave.Settled)
	}
	if len(r.Waves) > 0 {
		r.Settled = time.Since(churnStart)
		r.Lag = r.Waves[len(r.Waves)-1].Lag
	}
	r.GalleyCPU, r.DiscoveryCPU = cpuOf(galley)-g0, cpuOf(disc.cmd)-d0
	for _, p := range profiled {
		if err := <-p; err != nil {
			return nil, err
		}
	}
	if err := galleyProf.save(ctx, "galley-heap.pb.gz", "heap?gc=1"); err != nil {
		return nil, err
	}
	if err := discProf.save(ctx, "discovery-heap.pb.gz", "heap?gc=1"); err != nil {
		return nil, err
	}
	r.PodChanges = clock.changes() - changesBefore
	edsAfter, err := ms.totals(ctx, resourcev3.EndpointType)
	if err != nil {
		return nil, err
	}
	for i := range edsAfter.Responses {
		r.EDSPerSidecar = append(r.EDSPerSidecar, edsAfter.Responses[i]-edsBefore.Responses[i])
	}
	slices.Sort(r.EDSPerSidecar)
	if r.GalleyRSSMiB, err = proc.RSSMiB(galley.Process.Pid); err != nil {
		return nil, err
	}
	if r.DiscoveryRSSMiB, err = proc.RSSMiB(disc.cmd.Process.Pid); err != nil {
		return nil, err
	}
	if r.WatchesAfter, err = watchCount(ctx, kube); err != nil {
		return nil, err
	}
	if s, err := ms.synced(ctx); err == nil {
		r.Errors = s.Errors
	}
	return r, nil
}

// waitFor polls cond every half second until it holds, for at most
// limit; the error says what was awaited and what was last seen.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if what == "" {
				return err
			}
			return fmt.Errorf("%s: not after %s: %w", what, limit, err)
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// createDeployment creates svc-i, a Service, and its Deployment of n pods
// rolled as `kubectl set image` and `kubectl rollout restart` roll them
// (maxSurge and maxUnavailable 25 %, Kubernetes' defaults, written out).
func createDeployment(ctx context.Context, kube kubernetes.Interface, i, n int) error {
	name := fmt.Sprintf("svc-%d", i)
	labels := map[string]string{"app": name}
	if _, err := kube.CoreV1().Services("load").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	quarter := intstr.FromString("25%")
	if n > math.MaxInt32 {
		return fmt.Errorf("%d pods: more than a Deployment holds", n)
	}
	replicas := int32(n) //nolint:gosec // bounded just above
	_, err := kube.AppsV1().Deployments("load").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &quarter, MaxUnavailable: &quarter},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: "app:1", Ports: []corev1.ContainerPort{{ContainerPort: 80}},
				}}},
			},
		},
	}, metav1.CreateOptions{})
	return err
}

// restart is `kubectl rollout restart deployment/svc-i`: the template's
// restartedAt annotation changed (to the wave's number, so a Deployment
// restarted twice rolls twice).
func restart(ctx context.Context, kube kubernetes.Interface, i, wave int) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":"wave-%d"}}}}}`, wave)
	_, err := kube.AppsV1().Deployments("load").Patch(ctx, fmt.Sprintf("svc-%d", i), types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// rolledOut reports which of the Deployments have not rolled out to n
// Ready pods of their current template, and the old ones gone.
func rolledOut(ctx context.Context, kube kubernetes.Interface, which []int, n int) error {
	list, err := kube.AppsV1().Deployments("load").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return err
	}
	byName := map[string]*appsv1.Deployment{}
	for k := range list.Items {
		byName[list.Items[k].Name] = &list.Items[k]
	}
	var pending []string
	for _, i := range which {
		name := fmt.Sprintf("svc-%d", i)
		d := byName[name]
		if d == nil {
			pending = append(pending, name+" (missing)")
			continue
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || int(s.UpdatedReplicas) != n || int(s.Replicas) != n || int(s.ReadyReplicas) != n {
			pending = append(pending, name)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%d Deployments rolling, e.g. %s", len(pending), pending[0])
	}
	return nil
}

// wantEndpoints is, per Service's outbound cluster (svc-0 … svc-n-1),
// the digest of its pods that serve (serving), as the clock's informer
// holds them (no list from the apiserver on every poll): what every
// sidecar must hold once the EndpointSlices have followed the pods.
func (c *servingClock) wantEndpoints(n int) map[string]string {
	addrs := make(map[string][]string, n)
	for _, obj := range c.pods.List() {
		p, ok := obj.(*corev1.Pod)
		if ok && serving(p) && p.Status.PodIP != "" {
			addrs[p.Labels["app"]] = append(addrs[p.Labels["app"]], net.JoinHostPort(p.Status.PodIP, "80"))
		}
	}
	out := make(map[string]string, n)
	for i := range n {
		svc := fmt.Sprintf("svc-%d", i)
		out[fmt.Sprintf("outbound|80||%s.load.svc.cluster.local", svc)] = EndpointDigest(addrs[svc])
	}
	return out
}

// lastEDS is the time from the last pod change clock saw to the last EDS
// response any sidecar applied.
func lastEDS(ctx context.Context, ms multiStatus, clock *servingClock) (time.Duration, error) {
	tt, err := ms.totals(ctx, resourcev3.EndpointType)
	if err != nil {
		return 0, err
	}
	last := int64(0)
	for _, l := range tt.Last {
		last = max(last, l)
	}
	return time.Unix(0, last).Sub(clock.last()), nil
}

// servingClock follows the pods of namespace "load" and notes when one
// starts or stops serving (turns Ready, or stops being Ready or is being
// deleted while it was) and when one is gone. Its own informer's time, not the pods' status
// (which counts in seconds).
type servingClock struct {
	pods    cache.Store // the informer's
	mu      sync.Mutex
	at      time.Time
	counted int
}

func (c *servingClock) changed() {
	c.mu.Lock()
	c.at = time.Now()
	c.counted++
	c.mu.Unlock()
}

func (c *servingClock) last() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *servingClock) changes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counted
}

func serving(obj any) bool {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func watchServing(ctx context.Context, kube kubernetes.Interface) (*servingClock, error) {
	c := &servingClock{}
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace("load"))
	inf := f.Core().V1().Pods().Informer()
	c.pods = inf.GetStore()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if serving(obj) {
				c.changed()
			}
		},
		UpdateFunc: func(old, cur any) {
			if serving(old) != serving(cur) {
				c.changed()
			}
		},
		// Gone: its endpoint leaves the EndpointSlice (it was only
		// marked terminating before).
		DeleteFunc: func(any) { c.changed() },
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, errors.New("the pods' informer did not sync")
	}
	return c, nil
}

// watchCount is the apiserver's open watches: the sum of
// apiserver_longrunning_requests with verb WATCH.
func watchCount(ctx context.Context, kube kubernetes.Interface) (int, error) {
	b, err := kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("the apiserver's metrics: %w", err)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_longrunning_requests{") || !strings.Contains(line, `verb="WATCH"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("the apiserver's metrics: %q: %w", line, err)
		}
		n += int(v)
	}
	return n, sc.Err()
}

// totals and stale over several clients' processes, in order.
func (m multiStatus) totals(ctx context.Context, t string) (ClientTotals, error) {
	var all ClientTotals
	for _, s := range m {
		tt, err := s.totals(ctx, t)
		if err != nil {
			return all, err
		}
		all.Responses = append(all.Responses, tt.Responses...)
		all.Last = append(all.Last, tt.Last...)
	}
	return all, nil
}

func (m multiStatus) stale(ctx context.Context, want map[string]string) (StaleEndpoints, error) {
	var all StaleEndpoints
	for _, s := range m {
		st, err := s.stale(ctx, want)
		if err != nil {
			return all, err
		}
		all.Stale += st.Stale
		if all.Example == "" {
			all.Example = st.Example
		}
	}
	return all, nil
}
