// Package webhook is galley's validating admission webhook: the apiserver
// sends each create and update of an Istio object as an AdmissionReview,
// and the webhook answers with internal/validation's verdict — denied with
// every error and its field path, or allowed with warnings. Malformed,
// oversized or hostile requests get HTTP 400 and a message. Beside its
// own metrics it counts what Istio's validation webhook counts, under
// Istio's names (pkg/webhooks/validation/server/monitoring.go):
// galley_validation_passed and _failed by the resource's group, version
// and resource (and the reason it failed), and galley_validation_http_error
// by status.
package webhook

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// MaxBodyBytes bounds an AdmissionReview.
const MaxBodyBytes = admission.MaxBodyBytes

// maxWarning bounds one warning: the apiserver truncates longer ones.
const maxWarning = 256

// Path is where the webhook is served.
const Path = "/validate"

// Options configures the handler.
type Options struct {
	Log   *slog.Logger
	Meter metric.Meter
	// IstioMeter is the meter of the metrics named as Istio names them
	// (telemetry.Providers.Istio); none when nil.
	IstioMeter metric.Meter
	// Context answers cross-object questions (subsets); it may return nil.
	Context func() validation.Context
}

type handler struct {
	o                         Options
	passed, failed, httpError metric.Float64Counter
}

// Istio's reasons for galley_validation_failed.
const (
	reasonDecode     = "yaml_decode_error"
	reasonConversion = "crd_conversion_error"
	reasonInvalid    = "invalid_resource"
)

// Handler returns the webhook's HTTP handler.
func Handler(o Options) (http.Handler, error) {
	h := &handler{o: o}
	m := cmp.Or[metric.Meter](o.IstioMeter, noop.Meter{})
	var err error
	if h.passed, err = m.Float64Counter("galley_validation_passed", metric.WithDescription("Resource is valid")); err != nil {
		return nil, fmt.Errorf("metric galley_validation_passed: %w", err)
	}
	if h.failed, err = m.Float64Counter("galley_validation_failed", metric.WithDescription("Resource validation failed")); err != nil {
		return nil, fmt.Errorf("metric galley_validation_failed: %w", err)
	}
	if h.httpError, err = m.Float64Counter("galley_validation_http_error", metric.WithDescription("Resource validation http serve errors")); err != nil {
		return nil, fmt.Errorf("metric galley_validation_http_error: %w", err)
	}
	return admission.Handler(o.Log, o.Meter, "flotilla.galley.webhook", []string{Path}, func(_ context.Context, req *admissionv1.AdmissionRequest, _ func(string) string) *admissionv1.AdmissionResponse {
		return h.review(req)
	}, func(_ *admissionv1.AdmissionRequest, _ *admissionv1.AdmissionResponse, status int, _ time.Duration) {
		if status >= http.StatusBadRequest {
			h.httpError.Add(context.Background(), 1, metric.WithAttributes(attribute.String("status", strconv.Itoa(status))))
		}
	})
}

// validated counts a review of kind at version (a kind galley validates,
// so the labels take only those kinds' values): passed when reason is
// empty. As Istio's, a dry run's failure is not counted.
func (h *handler) validated(kind istio.Kind, version string, dryRun bool, reason string) {
	attrs := []attribute.KeyValue{
		attribute.String("group", kind.Group), attribute.String("version", version), attribute.String("resource", kind.Plural),
	}
	switch {
	case reason == "":
		h.passed.Add(context.Background(), 1, metric.WithAttributes(attrs...))
	case !dryRun:
		h.failed.Add(context.Background(), 1, metric.WithAttributes(append(attrs, attribute.String("reason", reason))...))
	}
}

func (h *handler) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return resp
	}
	kind, err := istio.ByAPIVersion(req.Kind.Group+"/"+req.Kind.Version, req.Kind.Kind)
	if err != nil {
		resp.Warnings = []string{"galley does not validate " + req.Kind.String()}
		return resp
	}
	// Counted under the kind's own labels, not what the request claims: a
	// caller cannot grow the series.
	count := func(reason string) { h.validated(kind, req.Kind.Version, req.DryRun != nil && *req.DryRun, reason) }
	docs := istio.Decode("", req.Object.Raw, req.Namespace)
	if len(docs) != 1 {
		count(reasonDecode)
		return deny(resp, fmt.Sprintf("the request holds %d objects, want 1", len(docs)))
	}
	doc := docs[0]
	if doc.Err != nil {
		count(reasonDecode)
		var de *istio.DecodeError
		if errors.As(doc.Err, &de) {
			if de.Object != "" {
				return deny(resp, de.Object+": "+de.Reason)
			}
			return deny(resp, de.Reason)
		}
		return deny(resp, doc.Err.Error())
	}
	obj := doc.Object
	if obj.Kind.Kind != req.Kind.Kind {
		count(reasonConversion)
		return deny(resp, fmt.Sprintf("the object is a %s, the request is for a %s", obj.Kind.Kind, req.Kind.Kind))
	}
	if obj.Meta.Name == "" {
		obj.Meta.Name = req.Name
	}
	var ctx validation.Context
	if h.o.Context != nil {
		ctx = h.o.Context()
	}
	res := validation.Validate(obj, ctx)
	for _, w := range res.Warnings {
		// "FLT0103 spec.trafficPolicy...: ...": the code is flotilla
		// analyze's (docs/analyze.md).
		resp.Warnings = append(resp.Warnings, clip.String(string(w.Code)+" "+w.String(), maxWarning))
	}
	if !res.OK() {
		msgs := make([]string, len(res.Errors))
		for i, e := range res.Errors {
			msgs[i] = e.String()
		}
		h.o.Log.Info("denied", "object", obj.String(), "user", req.UserInfo.Username, "errors", len(msgs))
		count(reasonInvalid)
		return deny(resp, obj.String()+": "+strings.Join(msgs, "; "))
	}
	count("")
	return resp
}

func deny(resp *admissionv1.AdmissionResponse, msg string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{
		Status:  metav1.StatusFailure,
		Reason:  metav1.StatusReasonInvalid,
		Code:    http.StatusUnprocessableEntity,
		Message: msg,
	}
	return resp
}

// Serve serves h over TLS on lis until ctx ends, then drains in-flight
// reviews for up to drain.
func Serve(ctx context.Context, log *slog.Logger, lis net.Listener, tlsConfig *tls.Config, h http.Handler, drain time.Duration) error {
	return admission.Serve(ctx, log, lis, tlsConfig, h, drain)
}
