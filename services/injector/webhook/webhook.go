// Package webhook is the injector's mutating admission webhook: pods that
// the policy selects come back with the sidecar, as a JSONPatch. Beside
// its own metrics it counts what Istio's injector counts, under Istio's
// names (pkg/kube/inject/monitoring.go): sidecar_injection_requests_total,
// _success_total (a pod injected), _skip_total (a request that needs no
// injection), _failure_total (refused, at the HTTP edge or in the review,
// or answered busy) and sidecar_injection_time_seconds.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
)

// Path is where the webhook is served; TagPath+<tag> is where a revision
// tag's webhook (istio-revision-tag-<tag>, made by flotilla tag set)
// calls it, for pods and namespaces that select the revision by the tag.
const (
	Path    = inject.WebhookPath
	TagPath = Path + "/tag/" // inject.TagWebhookPath
)

// Options configures the webhook.
type Options struct {
	Log   *slog.Logger
	Meter metric.Meter
	// IstioMeter is the meter of the metrics named as Istio names them
	// (telemetry.Providers.Istio); none when nil.
	IstioMeter metric.Meter
	// Config returns the template and values in force (the injection
	// ConfigMap's, or the local ones).
	Config func() inject.Config
	Policy inject.Policy
	// NamespaceLabels returns a namespace's labels.
	NamespaceLabels func(ctx context.Context, namespace string) (map[string]string, error)
	// ProxyConfigs returns the ProxyConfig resources in force; nil: none.
	ProxyConfigs func() *inject.ProxyConfigs
}

// Handler returns the webhook's HTTP handler.
func Handler(o Options) (http.Handler, error) {
	m := cmp.Or[metric.Meter](o.IstioMeter, noop.Meter{})
	var requests, successes, failures, skips metric.Float64Counter
	for _, c := range []struct {
		to         *metric.Float64Counter
		name, help string
	}{
		{&requests, "sidecar_injection_requests_total", "Total number of sidecar injection requests."},
		{&successes, "sidecar_injection_success_total", "Total number of successful sidecar injection requests."},
		{&failures, "sidecar_injection_failure_total", "Total number of failed sidecar injection requests."},
		{&skips, "sidecar_injection_skip_total", "Total number of skipped sidecar injection requests."},
	} {
		var err error
		if *c.to, err = m.Float64Counter(c.name, metric.WithDescription(c.help)); err != nil {
			return nil, fmt.Errorf("metric %s: %w", c.name, err)
		}
	}
	took, err := m.Float64Histogram("sidecar_injection_time_seconds", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.1, 1, 3, 5, 10, 20, 30, 60),
		metric.WithDescription("Total time taken for injection in seconds."))
	if err != nil {
		return nil, fmt.Errorf("metric sidecar_injection_time_seconds: %w", err)
	}
	return admission.Handler(o.Log, o.Meter, "flotilla.injector.webhook", []string{Path, TagPath + "{tag}"}, func(ctx context.Context, req *admissionv1.AdmissionRequest, pathValue func(string) string) *admissionv1.AdmissionResponse {
		return review(ctx, o, req, pathValue("tag"))
	}, func(_ *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse, _ int, d time.Duration) {
		ctx := context.Background()
		requests.Add(ctx, 1)
		took.Record(ctx, d.Seconds())
		switch {
		case resp == nil || !resp.Allowed:
			failures.Add(ctx, 1)
		case resp.Patch != nil:
			successes.Add(ctx, 1)
		default:
			skips.Add(ctx, 1)
		}
	})
}

// review decides on one pod; tag is the revision tag whose webhook called
// ("" for the revision's own).
func review(ctx context.Context, o Options, req *admissionv1.AdmissionRequest, tag string) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return resp
	}
	// Case-sensitive, as the apiserver decodes: the patch addresses the
	// object's keys exactly.
	var pod corev1.Pod
	if err := utiljson.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(resp, "the request's object is not a Pod: "+err.Error())
	}
	var top map[string]json.RawMessage
	if err := utiljson.Unmarshal(req.Object.Raw, &top); err != nil {
		return deny(resp, "the request's object is not a Pod: "+err.Error())
	}
	for _, key := range []string{"metadata", "spec"} {
		if v := bytes.TrimSpace(top[key]); len(v) == 0 || v[0] != '{' {
			return deny(resp, "the request's object is not a Pod: it has no "+key)
		}
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	labels, err := o.NamespaceLabels(ctx, ns)
	if err != nil {
		return deny(resp, fmt.Sprintf("cannot read namespace %s's labels to decide on injection: %v", ns, err))
	}
	policy := o.Policy
	if tag != "" {
		if err := controlplane.CheckRevision(tag); err != nil {
			return deny(resp, "the webhook's path names no revision tag: "+err.Error())
		}
		policy.Tag = tag
	}
	ok, why := inject.Decide(&pod, ns, labels, policy)
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "…"
	}
	if !ok {
		o.Log.Debug("not injected", "pod", ns+"/"+name, "reason", why)
		return resp
	}
	c := o.Config()
	if o.ProxyConfigs != nil {
		c.Values.ProxyConfigs = o.ProxyConfigs()
	}
	if pod.Namespace == "" {
		pod.Namespace = ns // the namespace's ProxyConfigs apply
	}
	injected, err := c.Template.Inject(&pod, c.Values)
	if err != nil {
		return deny(resp, "sidecar injection failed: "+err.Error())
	}
	patch, err := inject.Patch(&pod, injected)
	if err != nil {
		return deny(resp, "sidecar injection failed: "+err.Error())
	}
	jsonPatch := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &jsonPatch
	// Istio's annotations that Flotilla does not act on are said, not
	// silently dropped (docs/annotations.md).
	resp.Warnings = inject.NotHonouredOn(&pod)
	o.Log.Info("injected", "pod", ns+"/"+name, "reason", why)
	return resp
}

func deny(resp *admissionv1.AdmissionResponse, msg string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonBadRequest, Code: http.StatusBadRequest, Message: msg}
	return resp
}
