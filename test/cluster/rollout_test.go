package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// rolloutReplicas is the rolled Deployment's size in `make test`.
const rolloutReplicas = 50

// rollout: a Deployment of rolloutReplicas pods behind a Service, seen by
// every bookinfo sidecar; its image changed as `kubectl set image` does
// (maxSurge and maxUnavailable 25 %, Kubernetes' defaults, written out),
// then scaled to 0, back up and to 0 again. Every sidecar's EDS follows
// each step to the Ready pods exactly (nothing stale), and during the
// rolling update, when Ready pods exist at every moment, no sidecar ever
// holds the Service with no endpoint. It logs the time from the rollout's
// end (every new pod Ready, every old one gone) to the last sidecar
// holding the new endpoints, the EDS responses per sidecar during the
// rollout (debounce at work), and galley's and discovery's CPU and RSS.
func rollout(t *testing.T, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	ns, c, f := appNamespace, env.Client, cp.sidecars
	if f == nil {
		t.Fatal("no sidecars: the bookinfo step did not start them")
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
		t.Fatal(err)
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(rolloutReplicas)),
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
		t.Fatal(err)
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
	// sidecar to hold its endpoints; it returns the time in between
	// (zero when they already did: the Deployment's status is polled
	// every 100 ms and comes after the EndpointSlices).
	settle := func(what string, replicas int) time.Duration {
		t.Helper()
		var want []string
		cp.eventually(t, ctx, 3*time.Minute, what+": the Deployment settled", func(ctx context.Context) (err error) {
			want, err = readyEndpoints(ctx, replicas)
			return err
		})
		settled := time.Now()
		cp.eventually(t, ctx, 2*time.Minute, fmt.Sprintf("%s: %d sidecars hold its %d endpoints", what, len(f.clusters), len(want)), func(context.Context) error {
			return f.holds(map[string][]string{cluster: want})
		})
		return time.Since(settled)
	}
	settle("created", rolloutReplicas)

	// The rolling update.
	updatesBefore, emptiedBefore := f.counts(cluster)
	usageBefore := cp.usage(t)
	start := time.Now()
	if _, err := c.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType,
		[]byte(`{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"web:2"}]}}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	lag := settle("rolled to web:2", rolloutReplicas)
	took := time.Since(start)
	usageAfter := cp.usage(t)
	updates, emptied := f.counts(cluster)
	var pushes []int
	for i := range updates {
		pushes = append(pushes, updates[i]-updatesBefore[i])
		if n := emptied[i] - emptiedBefore[i]; n > 0 {
			t.Errorf("sidecar %d held %s with no endpoint %d times during the rolling update, while Ready pods existed", i, name, n)
		}
	}
	slices.Sort(pushes)
	t.Logf("rolling update of %d pods: %s in all; from the last pod Ready (and the old ones gone) to the last sidecar's EDS: %s; "+
		"EDS responses per sidecar during it: min %d, median %d, max %d", rolloutReplicas, took.Round(time.Millisecond),
		lag.Round(time.Millisecond), pushes[0], pushes[len(pushes)/2], pushes[len(pushes)-1])
	for _, svc := range []string{"flotilla-galley", "flotilla-discovery"} {
		t.Logf("%s (all replicas): %.2f CPU seconds during the rollout, %.0f MiB RSS after it",
			svc, usageAfter[svc][0]-usageBefore[svc][0], usageAfter[svc][1])
	}

	// Scaled to nothing, back up, and to nothing again: at each end every
	// sidecar holds exactly what is Ready.
	for _, replicas := range []int{0, rolloutReplicas, 0} {
		if err := scale(ctx, ns, name, replicas); err != nil {
			t.Fatal(err)
		}
		lag := settle(fmt.Sprintf("scaled to %d", replicas), replicas)
		t.Logf("scaled to %d: the last sidecar's EDS %s after the Deployment settled", replicas, lag.Round(time.Millisecond))
	}
}
