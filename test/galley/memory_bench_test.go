package galley_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// parallel runs n jobs on 16 workers and fails on the first error.
func parallel(b *testing.B, n int, job func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := job(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// procStatus reads a field (in kB) of /proc/<pid>/status.
func procStatus(pid int, field string) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// BenchmarkGalleyMemoryWith1000ServicesAnd10000Endpoints loads the real
// apiserver with 1,000 Services, 10,000 Pods and 1,000 EndpointSlices of 10
// endpoints, runs flotilla-galley against it with one subscriber, and
// reports galley's resident memory once everything has been streamed.
// Run with -benchtime=1x: it measures one process, not a loop.
func BenchmarkGalleyMemoryWith1000ServicesAnd10000Endpoints(b *testing.B) {
	const services, perService = 1000, 10
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		b.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "memory")
	if err != nil {
		b.Fatal(err)
	}
	fast := rest.CopyConfig(env.Config)
	fast.QPS, fast.Burst = 5000, 10000
	kube, err := kubernetes.NewForConfig(fast)
	if err != nil {
		b.Fatal(err)
	}
	ready := true
	port, portName := int32(8080), "http"
	parallel(b, services*perService, func(i int) error {
		_, err := kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%04d-%d", i/perService, i%perService), Labels: map[string]string{
				"app": fmt.Sprintf("svc-%04d", i/perService), "version": "v1", "pod-template-hash": "7d9f8c6b5",
			}},
			Spec: corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/app:1.0", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "FEATURE_X", Value: "on"}},
			}}},
		}, metav1.CreateOptions{})
		return err
	})
	parallel(b, services, func(i int) error {
		name := fmt.Sprintf("svc-%04d", i)
		if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		}
		for j := range perService {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("%s-%d", name, j), Namespace: ns},
			})
		}
		_, err := kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
		return err
	})

	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		b.Fatal(err)
	}
	mcpAddr, adminAddr := proc.FreeAddr(b), proc.FreeAddr(b)
	g := startGalleyWith(b, adminAddr, "--kubeconfig", kubeconfig, "--mcp-address", mcpAddr, "--system-namespace", ns, "--log-level", "warn")
	sub := subscribe(b, mcpAddr)
	start := time.Now()
	deadline := start.Add(5 * time.Minute)
	for {
		sub.mu.Lock()
		n := 0
		for name := range sub.state[registry.EndpointSetTypeURL] {
			if strings.HasPrefix(name, ns+"/") {
				n++
			}
		}
		sub.mu.Unlock()
		if n >= services {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("subscriber has %d of %d endpoint sets", n, services)
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.ReportMetric(time.Since(start).Seconds(), "s-to-stream")
	time.Sleep(2 * time.Second) // let the heap settle after the initial burst
	rss, err := procStatus(g.cmd.Process.Pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	peak, err := procStatus(g.cmd.Process.Pid, "VmHWM")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(rss)/1024, "RSS-MiB")
	b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
	if heap, err := metricValue("http://"+adminAddr+"/metrics", "go_memstats_heap_inuse_bytes"); err == nil {
		b.ReportMetric(heap/(1<<20), "heap-inuse-MiB")
	} else {
		b.Fatal(err)
	}
	for range b.N {
		// One measurement: the setup is the benchmark.
	}
}

// metricValue reads one unlabelled sample from a Prometheus endpoint.
func metricValue(url, name string) (float64, error) {
	resp, err := http.Get(url) //nolint:noctx // a single loopback read
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s not found at %s", name, url)
}
