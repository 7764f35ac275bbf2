// Package cluster_test installs Flotilla with `helm install` into a whole
// cluster — kube-apiserver, etcd, kube-controller-manager, kube-scheduler,
// kwok's simulated nodes and kube-proxy (internal/testsupport/kubeenv) — and runs the
// pods the chart's Deployments become as processes of the binaries built
// here (test/podproc), each as its pod's service account with its pod's
// volumes and flags. Everything between them goes the way it goes in a
// cluster: the apiserver calls the webhooks through their Services at the
// pods' IPs, the services reach each other by their Services' names and
// cluster IPs, and workloads' pods come from the ReplicaSet controller
// through the injector.
package cluster_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/podproc"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var (
	env    *kubeenv.Env
	binDir string
)

// TestMain: three kwok nodes of 250 pods each (their /24 pod CIDRs hold
// 254), room for the benchmark's 500 pods besides bookinfo and the
// control plane.
func TestMain(m *testing.M) {
	os.Exit(build.MainInNetworkNamespace(m, &binDir, &env, kubeenv.Options{Cluster: &kubeenv.ClusterOptions{Nodes: 3, MaxPodsPerNode: 250}},
		"flotilla-galley", "flotilla-discovery", "flotilla-ca", "flotilla-injector"))
}

// controlPlane is the chart installed and its pods running.
type controlPlane struct {
	namespace string
	release   string // the Helm release: its pods are app.kubernetes.io/instance=<release>
	runner    *podproc.Runner
	mu        sync.Mutex
	procs     map[string]*podproc.Process // by pod name
	starting  map[string]bool             // pods whose process is starting
	crashed   map[string]bool             // pods whose process was killed: not restarted
	failures  []string                    // processes that could not start
	// sidecars is what the simulated sidecars hold, once started;
	// stopSidecars ends them.
	sidecars     *fleet
	stopSidecars func()
}

// usage is the CPU seconds used so far and the RSS now of the processes
// of each service (app.kubernetes.io/name of their pods), summed.
func (cp *controlPlane) usage(tb testing.TB) map[string][2]float64 {
	tb.Helper()
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := map[string][2]float64{}
	for _, p := range cp.procs {
		name := p.Pod.Labels["app.kubernetes.io/name"]
		cpu, err := proc.CPUSeconds(p.Pid())
		if err != nil {
			tb.Fatalf("CPU of %s: %v", p.Pod.Name, err)
		}
		rss, err := proc.RSSMiB(p.Pid())
		if err != nil {
			tb.Fatalf("RSS of %s: %v", p.Pod.Name, err)
		}
		u := out[name]
		out[name] = [2]float64{u[0] + cpu, u[1] + rss}
	}
	return out
}

// install runs `helm install --wait` of the chart into namespace with
// values (--set), then starts every pod of the release as a process once
// the apiserver has it Running with an IP. The processes are stopped at
// the test's end.
func install(tb testing.TB, ctx context.Context, namespace string, values ...string) *controlPlane {
	tb.Helper()
	return installRelease(tb, ctx, namespace, "flotilla", values...)
}

// installRelease is install of a release of that name (a second
// revision's).
func installRelease(tb testing.TB, ctx context.Context, namespace, release string, values ...string) *controlPlane {
	tb.Helper()
	root, err := build.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	kubeconfig := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		tb.Fatal(err)
	}
	args := []string{
		"install", release, filepath.Join(root, "deploy", "helm", "flotilla"),
		"--kubeconfig", kubeconfig, "--namespace", namespace, "--create-namespace", "--wait", "--timeout", "3m",
	}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "bin", "tools", "helm"), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tb.TempDir(), "HELM_CONFIG_HOME="+tb.TempDir(), "HELM_DATA_HOME="+tb.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("helm install: %v\n%s", err, out)
	}
	tb.Logf("helm install --wait: %s", time.Since(start).Round(time.Millisecond))

	cp := &controlPlane{
		namespace: namespace, release: release,
		runner: &podproc.Runner{
			Client: env.Client, APIServer: env.Config.Host,
			Bin: binDir, Dir: tb.TempDir(),
		},
		procs:    map[string]*podproc.Process{},
		starting: map[string]bool{},
		crashed:  map[string]bool{},
	}
	kubeletCtx, stopKubelet := context.WithCancel(context.WithoutCancel(ctx))
	kubeletDone := make(chan struct{})
	go func() {
		defer close(kubeletDone)
		cp.kubelet(kubeletCtx)
	}()
	tb.Cleanup(func() {
		stopKubelet()
		<-kubeletDone
		cp.mu.Lock()
		defer cp.mu.Unlock()
		for name, p := range cp.procs {
			if err := p.Stop(10 * time.Second); err != nil {
				tb.Errorf("pod %s: %v\n%s", name, err, tail(p.Log(), 30))
			}
		}
	})
	pods, err := env.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: cp.pods()})
	if err != nil {
		tb.Fatal(err)
	}
	cp.eventually(tb, ctx, 2*time.Minute, fmt.Sprintf("the %d pods running as processes", len(pods.Items)), func(context.Context) error {
		if n := cp.running(""); n != len(pods.Items) {
			return fmt.Errorf("%d running", n)
		}
		return nil
	})
	tb.Logf("from helm install to every pod's process started: %s", time.Since(start).Round(time.Millisecond))
	return cp
}

// pods selects the release's pods.
func (cp *controlPlane) pods() string { return "app.kubernetes.io/instance=" + cp.release }

// kubelet keeps a process for every pod of the release that is Running
// with an IP and not terminating, as the nodes' kubelets would: it starts
// one for a new pod (each waits for what it mounts, so all start at
// once) and stops the process of a pod deleted or terminating.
func (cp *controlPlane) kubelet(ctx context.Context) {
	for {
		if list, err := env.Client.CoreV1().Pods(cp.namespace).List(ctx, metav1.ListOptions{LabelSelector: cp.pods()}); err == nil {
			cp.reconcile(ctx, list.Items)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (cp *controlPlane) reconcile(ctx context.Context, pods []corev1.Pod) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	live := map[string]bool{}
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		live[pod.Name] = true
		if cp.procs[pod.Name] != nil || cp.starting[pod.Name] || cp.crashed[pod.Name] {
			continue
		}
		cp.starting[pod.Name] = true
		go func() {
			p, err := cp.runner.Start(ctx, pod)
			cp.mu.Lock()
			defer cp.mu.Unlock()
			delete(cp.starting, pod.Name)
			switch {
			case err != nil && ctx.Err() == nil:
				cp.failures = append(cp.failures, err.Error())
			case err == nil:
				cp.procs[pod.Name] = p
			}
		}()
	}
	for name, p := range cp.procs {
		if !live[name] {
			delete(cp.procs, name)
			// A terminating pod's container gets SIGTERM, then SIGKILL
			// after its grace period.
			go func() { _ = p.Stop(30 * time.Second) }()
		}
	}
}

// crash kills the process of pod at once (SIGKILL, as a node failure or
// an OOM kill would) and keeps it from being started again.
func (cp *controlPlane) crash(tb testing.TB, pod string) {
	tb.Helper()
	cp.mu.Lock()
	p := cp.procs[pod]
	delete(cp.procs, pod)
	cp.crashed[pod] = true
	cp.mu.Unlock()
	if p == nil {
		tb.Fatalf("no process for pod %s", pod)
	}
	p.Kill()
}

// running counts the processes of the service (the pods'
// app.kubernetes.io/name, "" for all).
func (cp *controlPlane) running(service string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	n := 0
	for _, p := range cp.procs {
		if service == "" || p.Pod.Labels["app.kubernetes.io/name"] == service {
			n++
		}
	}
	return n
}

// exited names the processes that have exited, with their logs' tails.
func (cp *controlPlane) exited() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := slices.Clone(cp.failures)
	for name, p := range cp.procs {
		select {
		case <-p.Exited():
			out = append(out, fmt.Sprintf("pod %s exited (%v):\n%s", name, p.Err(), tail(p.Log(), 30)))
		default:
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// logs is every process's log tail, for a failure's message.
func (cp *controlPlane) logs() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var out []string
	for name, p := range cp.procs {
		out = append(out, fmt.Sprintf("--- %s:\n%s", name, tail(p.Log(), 15)))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// eventually polls cond until it holds, failing the test with cond's last
// error, any exited process and the logs after limit; it logs how long it
// took.
func (cp *controlPlane) eventually(tb testing.TB, ctx context.Context, limit time.Duration, what string, cond func(context.Context) error) {
	tb.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		if ex := cp.exited(); ex != "" {
			return false, fmt.Errorf("a control-plane process exited:\n%s", ex)
		}
		last = cond(ctx)
		return last == nil, nil
	})
	if err != nil {
		tb.Fatalf("%s: %v (last: %v)\n%s", what, err, last, cp.logs())
	}
	tb.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond))
}

// podsOf are the Ready pods of namespace matching selector.
func podsOf(ctx context.Context, namespace, selector string) ([]corev1.Pod, error) {
	list, err := env.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if isReady(&p) {
			ready = append(ready, p)
		}
	}
	return ready, nil
}

// isReady: the pod has an IP, is Ready and is not terminating (what the
// EndpointSlice controller publishes as a ready endpoint).
func isReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podClock is when the test's own watch last saw a pod of a selector
// become Ready or stop being Ready (terminating, deleted): the last
// moment the Service's Ready endpoints changed, as near as a client of
// the apiserver can tell (conditions' timestamps have whole seconds).
type podClock struct {
	mu   sync.Mutex
	last time.Time
}

// watchPods starts a podClock for namespace's pods matching selector,
// stopped at the test's end.
func watchPods(tb testing.TB, ctx context.Context, namespace, selector string) *podClock {
	tb.Helper()
	w, err := env.Client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(w.Stop)
	clock := &podClock{}
	go func() {
		ready := map[string]bool{}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			now := ev.Type != watch.Deleted && isReady(p)
			if now != ready[p.Name] {
				clock.mu.Lock()
				clock.last = time.Now()
				clock.mu.Unlock()
			}
			ready[p.Name] = now
			if ev.Type == watch.Deleted {
				delete(ready, p.Name)
			}
		}
	}()
	return clock
}

// lastChange is when the watch last saw a pod become Ready or stop being
// Ready.
func (c *podClock) lastChange() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// scale sets a Deployment's replicas, as `kubectl scale` does.
func scale(ctx context.Context, namespace, name string, replicas int) error {
	_, err := env.Client.AppsV1().Deployments(namespace).Patch(ctx, name, types.MergePatchType,
		fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas), metav1.PatchOptions{})
	return err
}

// podsAt says how namespace's pods matching selector differ from n pods,
// all Ready, none terminating left behind; nil when they do not.
func podsAt(ctx context.Context, namespace, selector string, n int) error {
	all, err := env.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	ready, err := podsOf(ctx, namespace, selector)
	if err != nil {
		return err
	}
	if len(all.Items) != n || len(ready) != n {
		return fmt.Errorf("%s: %d pods, %d Ready, want %d", selector, len(all.Items), len(ready), n)
	}
	return nil
}

// endpointsOf are the Ready pods of namespace matching selector at port
// 9080 (bookinfo's), sorted: what a sidecar must hold for their Service.
func endpointsOf(ctx context.Context, namespace, selector string) ([]string, error) {
	pods, err := podsOf(ctx, namespace, selector)
	if err != nil {
		return nil, err
	}
	var eps []string
	for _, p := range pods {
		eps = append(eps, net.JoinHostPort(p.Status.PodIP, "9080"))
	}
	slices.Sort(eps)
	return eps, nil
}
