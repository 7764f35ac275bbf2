// Package webhook is galley's validating admission webhook: the apiserver
// sends each create and update of an Istio object as an AdmissionReview,
// and the webhook answers with internal/validation's verdict — denied with
// every error and its field path, or allowed with warnings. Malformed,
// oversized or hostile requests get HTTP 400 and a message.
package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
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
	// Context answers cross-object questions (subsets); it may return nil.
	Context func() validation.Context
}

type handler struct {
	o Options
}

// Handler returns the webhook's HTTP handler.
func Handler(o Options) (http.Handler, error) {
	h := &handler{o: o}
	return admission.Handler(o.Log, o.Meter, "flotilla.galley.webhook", Path, func(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
		return h.review(req)
	})
}

func (h *handler) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return resp
	}
	if _, err := istio.ByAPIVersion(req.Kind.Group+"/"+req.Kind.Version, req.Kind.Kind); err != nil {
		resp.Warnings = []string{"galley does not validate " + req.Kind.String()}
		return resp
	}
	docs := istio.Decode("", req.Object.Raw, req.Namespace)
	if len(docs) != 1 {
		return deny(resp, fmt.Sprintf("the request holds %d objects, want 1", len(docs)))
	}
	doc := docs[0]
	if doc.Err != nil {
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
		return deny(resp, obj.String()+": "+strings.Join(msgs, "; "))
	}
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
	return admission.Serve(ctx, log, lis, tlsConfig, h, drain) //nolint:wrapcheck // already says what failed
}
