package cluster_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// rolloutReplicas is the rolled Deployment's size in `make test`; the
// benchmark (`make bench`) rolls rolloutReplicasAtScale and scales to
// scaleToAtScale, the sizes of issue 20.
const (
	rolloutReplicas        = 50
	rolloutReplicasAtScale = 200
	scaleToAtScale         = 500
)

// rollout is the rolling update and scaling at `make test`'s size.
func rollout(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	rollOut(t, ctx, cp, rolloutReplicas, rolloutReplicas)
}

// rolloutFigures are what rollOut measured of the rolling update: its
// duration, the time from its end to the last sidecar's EDS (lag), the
// EDS responses per sidecar during it (sorted), and the CPU seconds used
// during it and RSS after it of galley's and discovery's pods (usage's
// keys), and the same lag after each scaling.
type rolloutFigures struct {
	took, lag time.Duration
	pushes    []int
	cpu, rss  map[string]float64
	scaled    []time.Duration
}

// rollOut: a Deployment of replicas pods behind a Service, seen by every
// bookinfo sidecar; its image changed as `kubectl set image` does
// (maxSurge and maxUnavailable 25 %, Kubernetes' defaults, written out),
// then scaled to 0, up to scaleTo and to 0 again. Every sidecar's EDS follows
// each step to the Ready pods exactly (nothing stale), and during the
// rolling update, when Ready pods exist at every moment, no sidecar ever
// holds the Service with no endpoint. It logs the time from the rollout's
// end (every new pod Ready, every old one gone) to the last sidecar
// holding the new endpoints, the EDS responses per sidecar during the
// rollout (debounce at work), and galley's and discovery's CPU and RSS.
func rollOut(tb testing.TB, ctx context.Context, cp *controlPlane, replicas, scaleTo int) rolloutFigures {
	tb.Helper()
	ns, c, f := appNamespace, env.Client, cp.sidecars
	if f == nil {
		tb.Fatal("no sidecars: the bookinfo step did not start them")
	}
	const name = "web"
	cluster := outbound(name)
	labels := map[string]string{"app": name}
	quarter := intstr.FromString("25%")
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &quarter, MaxUnavailable: &quarter},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: name, Image: "web:1", Ports: []corev1.ContainerPort{{ContainerPort: 9080}},
				}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}

	// readyEndpoints are the Ready pods' endpoints once the Deployment is
	// settled at replicas: every pod of its current template, none other.
	readyEndpoints := func(ctx context.Context, replicas int) ([]string, error) {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || int(s.UpdatedReplicas) != replicas || int(s.Replicas) != replicas || int(s.ReadyReplicas) != replicas {
			return nil, fmt.Errorf("deployment: %d updated, %d in all, %d ready", s.UpdatedReplicas, s.Replicas, s.ReadyReplicas)
		}
		if err := podsAt(ctx, ns, "app="+name, replicas); err != nil {
			return nil, err
		}
		return endpointsOf(ctx, ns, "app="+name)
	}
	// settle waits for the Deployment at replicas, then for every
	// sidecar to hold its endpoints; it returns the time from the last
	// pod becoming Ready or going, as the test's watch saw it, to the
	// last sidecar applying the endpoints that followed (before its ACK).
	clock := watchPods(tb, ctx, ns, "app="+name)
	settle := func(what string, replicas int) time.Duration {
		tb.Helper()
		var want []string
		cp.eventually(tb, ctx, 3*time.Minute, what+": the Deployment settled", func(ctx context.Context) (err error) {
			want, err = readyEndpoints(ctx, replicas)
			return err
		})
		cp.eventually(tb, ctx, 2*time.Minute, fmt.Sprintf("%s: %d sidecars hold its %d endpoints", what, len(f.clusters), len(want)), func(context.Context) error {
			return f.holds(map[string][]string{cluster: want})
		})
		return f.lastChange(cluster).Sub(clock.lastChange())
	}
	settle("created", replicas)

	// The rolling update.
	updatesBefore, emptiedBefore := f.counts(cluster)
	usageBefore := cp.usage(tb)
	start := time.Now()
	if _, err := c.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"web:2"}]}}}}`), metav1.PatchOptions{}); err != nil {
		tb.Fatal(err)
	}
	fig := rolloutFigures{cpu: map[string]float64{}, rss: map[string]float64{}}
	fig.lag = settle("rolled to web:2", replicas)
	fig.took = time.Since(start)
	usageAfter := cp.usage(tb)
	updates, emptied := f.counts(cluster)
	for i := range updates {
		fig.pushes = append(fig.pushes, updates[i]-updatesBefore[i])
		if n := emptied[i] - emptiedBefore[i]; n > 0 {
			tb.Errorf("sidecar %d held %s with no endpoint %d times during the rolling update, while Ready pods existed", i, name, n)
		}
	}
	slices.Sort(fig.pushes)
	pushes := fig.pushes
	tb.Logf("rolling update of %d pods: %s in all; from the last pod Ready (and the old ones gone) to the last sidecar's EDS: %s; "+
		"EDS responses per sidecar during it: min %d, median %d, max %d", replicas, fig.took.Round(time.Millisecond),
		fig.lag.Round(time.Millisecond), pushes[0], pushes[len(pushes)/2], pushes[len(pushes)-1])
	for _, svc := range []string{"flotilla-galley", "flotilla-discovery"} {
		fig.cpu[svc], fig.rss[svc] = usageAfter[svc][0]-usageBefore[svc][0], usageAfter[svc][1]
		tb.Logf("%s (all replicas): %.2f CPU seconds during the rollout, %.0f MiB RSS after it", svc, fig.cpu[svc], fig.rss[svc])
	}

	// Scaled to nothing, back up, and to nothing again: at each end every
	// sidecar holds exactly what is Ready.
	for _, n := range []int{0, scaleTo, 0} {
		if err := scale(ctx, ns, name, n); err != nil {
			tb.Fatal(err)
		}
		lag := settle(fmt.Sprintf("scaled to %d", n), n)
		fig.scaled = append(fig.scaled, lag)
		tb.Logf("scaled to %d: the last sidecar's EDS %s after the last pod Ready or gone", n, lag.Round(time.Millisecond))
	}
	return fig
}

// BenchmarkRolloutAtScale (`make bench`): the rolling update and scaling
// at issue 20's sizes, a Deployment of rolloutReplicasAtScale pods rolled
// and then scaled 0 → scaleToAtScale → 0, on the chart installed as in
// TestFlotillaInAWholeCluster with bookinfo's 12 sidecars watching. One
// run of it takes minutes, so the benchmark runs once (b.N is 1) and
// reports rollOut's figures; the assertions are the test's.
// FLOTILLA_BENCH_CHART_SET adds chart values (space-separated key=value,
// as helm's --set), to measure a setting against the defaults in one
// session: discovery.debounceFirst=100ms is the fixed window of before
// issue 48.
func BenchmarkRolloutAtScale(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	values := append(slices.Clone(chartValues), strings.Fields(os.Getenv("FLOTILLA_BENCH_CHART_SET"))...)
	cp := install(b, ctx, systemNamespace, values...)
	defer func() {
		if cp.stopSidecars != nil {
			cp.stopSidecars()
		}
	}()
	podsFindEachOther(b, ctx, cp)
	bookinfo(b, ctx, cp)
	b.ResetTimer()
	fig := rollOut(b, ctx, cp, rolloutReplicasAtScale, scaleToAtScale)
	b.StopTimer()
	b.ReportMetric(fig.took.Seconds(), "rollout-s")
	b.ReportMetric(fig.lag.Seconds(), "last-eds-after-rollout-s")
	b.ReportMetric(float64(fig.pushes[len(fig.pushes)/2]), "eds-per-sidecar-median")
	b.ReportMetric(float64(fig.pushes[len(fig.pushes)-1]), "eds-per-sidecar-max")
	for i, what := range []string{"after-scale-to-0", "after-scale-up", "after-scale-down"} {
		b.ReportMetric(fig.scaled[i].Seconds(), "last-eds-"+what+"-s")
	}
	for svc, short := range map[string]string{"flotilla-galley": "galley", "flotilla-discovery": "discovery"} {
		b.ReportMetric(fig.cpu[svc], short+"-cpu-s")
		b.ReportMetric(fig.rss[svc], short+"-rss-MiB")
	}
}
