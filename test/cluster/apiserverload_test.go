package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/services/galley/kubesource"
)

// apiserverLoad: the design's central claim, measured. With 1, 3 and 10
// discovery replicas (the sidecars spread over them through the Service),
// the apiserver's registered watches do not change and its requests do
// not grow: only galley watches. The control is what a design where every
// replica watches the apiserver would cost: 1, 3 and 10 sets of the
// informers galley runs (kubesource, the same kinds), started in this
// process. For each, the same churn (a Deployment scaled 0 → 10 → 0) is
// measured: the requests it costs (the controllers', kwok's, the test's)
// and the watch events the apiserver sends, which every watcher of pods
// and EndpointSlices multiplies. The table is logged (BENCHMARKS.md keeps
// it); the watches are asserted, the counters only logged.
func apiserverLoad(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	type row struct {
		n                          int
		watchers, requests, events float64
	}
	// measure reads the watches once settled, and the requests and watch
	// events a fixed churn costs: the web Deployment scaled 0 → 10 → 0
	// (pods and EndpointSlices changing, as in any cluster).
	measure := func(n int) row {
		t.Helper()
		time.Sleep(2 * time.Second)
		w, r0, e0 := apiserverMetrics(t, ctx)
		for _, replicas := range []int{10, 0} {
			if err := scale(ctx, appNamespace, "web", replicas); err != nil {
				t.Fatal(err)
			}
			cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("web at %d pods", replicas), func(ctx context.Context) error {
				return podsAt(ctx, appNamespace, "app=web", replicas)
			})
		}
		time.Sleep(2 * time.Second)
		_, r1, e1 := apiserverMetrics(t, ctx)
		return row{n: n, watchers: w, requests: r1 - r0, events: e1 - e0}
	}

	var flotilla []row
	for _, n := range []int{1, 3, 10} {
		if err := scale(ctx, systemNamespace, "flotilla-discovery", n); err != nil {
			t.Fatal(err)
		}
		cp.eventually(t, ctx, 3*time.Minute, fmt.Sprintf("%d discovery replicas running and ready", n), func(ctx context.Context) error {
			if got := cp.running("flotilla-discovery"); got != n {
				return fmt.Errorf("%d discovery processes", got)
			}
			return cp.ready(ctx, "flotilla-discovery", "15014")
		})
		// The sidecars of a replica scaled away connect to another.
		cp.eventually(t, ctx, 2*time.Minute, "the sidecars hold reviews' endpoints", func(ctx context.Context) error {
			want, err := endpointsOf(ctx, appNamespace, "app=reviews")
			if err != nil {
				return err
			}
			return cp.sidecars.holds(map[string][]string{outbound("reviews"): want})
		})
		flotilla = append(flotilla, measure(n))
	}

	var control []row
	var cancels []context.CancelFunc
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for _, n := range []int{1, 3, 10} {
		for len(cancels) < n {
			cancel, err := startInformerSet(ctx, len(cancels))
			if err != nil {
				t.Fatal(err)
			}
			cancels = append(cancels, cancel)
		}
		control = append(control, measure(n))
	}

	var b strings.Builder
	fmt.Fprintf(&b, "| replicas | Flotilla: watches | requests | watch events | control: watches | requests | watch events |\n|---|---|---|---|---|---|---|\n")
	for i := range flotilla {
		f, c := flotilla[i], control[i]
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", f.n, f.watchers, f.requests, f.events, c.watchers, c.requests, c.events)
	}
	t.Logf("the apiserver's registered watches, and the requests and watch events of scaling a Deployment 0 → 10 → 0:\n%s", b.String())

	// Only galley watches: the watches do not move with the replicas
	// (one or two of kube's own may come and go), and each informer set
	// of the control adds a watch per kind.
	if d := flotilla[2].watchers - flotilla[0].watchers; d > 2 || d < -2 {
		t.Errorf("10 discovery replicas changed the apiserver's watches by %.0f from 1 replica's", d)
	}
	if d := control[2].watchers - control[0].watchers; d < 9*5 {
		t.Errorf("nine more informer sets added only %.0f watches: the control measures nothing", d)
	}
	if control[2].events <= flotilla[2].events {
		t.Errorf("the churn sent %.0f watch events with ten informer sets and %.0f with ten discovery replicas: the control measures nothing", control[2].events, flotilla[2].events)
	}
}

// apiserverMetrics reads the apiserver's registered watches (the sum of
// apiserver_registered_watchers; apiserver_longrunning_requests of verb
// WATCH where that is absent), the total of apiserver_request_total and
// of apiserver_watch_events_total (the events it sent its watchers).
func apiserverMetrics(tb testing.TB, ctx context.Context) (watchers, requests, events float64) {
	tb.Helper()
	raw, err := env.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		tb.Fatalf("the apiserver's /metrics: %v", err)
	}
	var registered, longrunning float64
	seen := false
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, _, _ := strings.Cut(line, "{")
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			continue
		}
		switch name {
		case "apiserver_registered_watchers":
			registered += v
			seen = true
		case "apiserver_longrunning_requests":
			if strings.Contains(line, `verb="WATCH"`) {
				longrunning += v
			}
		case "apiserver_request_total":
			requests += v
		case "apiserver_watch_events_total":
			events += v
		}
	}
	if seen {
		return registered, requests, events
	}
	return longrunning, requests, events
}

// ready checks every process of service answers 200 on its admin
// port's /readyz at its pod's IP.
func (cp *controlPlane) ready(ctx context.Context, service, port string) error {
	cp.mu.Lock()
	var ips []string
	for _, p := range cp.procs {
		if p.Pod.Labels["app.kubernetes.io/name"] == service {
			ips = append(ips, p.Pod.Status.PodIP)
		}
	}
	cp.mu.Unlock()
	for _, ip := range ips {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, port)+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s at %s: /readyz %s", service, ip, resp.Status)
		}
	}
	return nil
}

// startInformerSet starts galley's informers (kubesource) on a client of
// their own, as a discovery replica that watched the apiserver would, and
// waits until they have listed the cluster; what they see is dropped.
func startInformerSet(ctx context.Context, i int) (context.CancelFunc, error) {
	cfg := *env.Config
	cfg.UserAgent = "informer-set-" + strconv.Itoa(i)
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return nil, err
	}
	ic, err := istioclient.NewForConfig(&cfg)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfig(&cfg)
	if err != nil {
		return nil, err
	}
	src := kubesource.New(kubesource.Options{
		Kube: kube, Istio: ic, Metadata: meta, SystemNamespace: systemNamespace,
		Log: slog.New(slog.DiscardHandler), DomainSuffix: "cluster.local", ClusterID: "Kubernetes",
	}, discard{}, discard{})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() { _ = src.Run(runCtx) }()
	select {
	case <-src.Synced():
		return cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, fmt.Errorf("informer set %d never synced: %w", i, ctx.Err())
	}
}

// discard is a sink that drops what it is given.
type discard struct{}

func (discard) Apply(context.Context, []*istio.Object, []istio.ID) error { return nil }

func (discard) Update(string, []*mcp.Resource, []string) (int, error) { return 0, nil }
