// Package webhook is galley's validating admission webhook: the apiserver
// sends each create and update of an Istio object as an AdmissionReview,
// and the webhook answers with internal/validation's verdict — denied with
// every error and its field path, or allowed with warnings. Malformed,
// oversized or hostile requests get HTTP 400 and a message.
package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// MaxBodyBytes bounds an AdmissionReview: the apiserver's own request limit
// is 3 MiB of object, and a review carries the object twice on update.
const MaxBodyBytes = 6 << 20

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
	o        Options
	reviews  metric.Int64Counter
	duration metric.Float64Histogram
}

// Handler returns the webhook's HTTP handler.
func Handler(o Options) (http.Handler, error) {
	h := &handler{o: o}
	var err error
	if h.reviews, err = o.Meter.Int64Counter("flotilla.galley.webhook.reviews",
		metric.WithDescription("Admission reviews answered, by result.")); err != nil {
		return nil, fmt.Errorf("webhook metrics: %w", err)
	}
	if h.duration, err = o.Meter.Float64Histogram("flotilla.galley.webhook.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to answer an admission review.")); err != nil {
		return nil, fmt.Errorf("webhook metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, h)
	return mux, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	result := h.serve(w, r)
	ctx := r.Context()
	h.reviews.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
	h.duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("result", result)))
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request) string {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "only POST is accepted", http.StatusMethodNotAllowed)
		return "bad_request"
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be application/json", http.StatusBadRequest)
		return "bad_request"
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes), http.StatusBadRequest)
		} else {
			http.Error(w, "reading request body: "+err.Error(), http.StatusBadRequest)
		}
		return "bad_request"
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(w, "malformed AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return "bad_request"
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		http.Error(w, fmt.Sprintf("want an admission.k8s.io/v1 AdmissionReview, got %s %s", review.APIVersion, review.Kind), http.StatusBadRequest)
		return "bad_request"
	}
	if review.Request == nil || review.Request.UID == "" {
		http.Error(w, "AdmissionReview has no request (or no request uid)", http.StatusBadRequest)
		return "bad_request"
	}
	resp := h.review(review.Request)
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		h.o.Log.Warn("writing admission response", "error", err)
	}
	if resp.Allowed {
		return "allowed"
	}
	return "denied"
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
		resp.Warnings = append(resp.Warnings, truncate(w.String(), maxWarning))
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// Serve serves h over TLS on lis until ctx ends, then drains in-flight
// reviews for up to drain.
func Serve(ctx context.Context, log *slog.Logger, lis net.Listener, tlsConfig *tls.Config, h http.Handler, drain time.Duration) error {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(lis, "", "") }()
	log.Info("webhook listening", "address", lis.Addr().String(), "path", Path)
	select {
	case err := <-errc:
		return fmt.Errorf("webhook serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("webhook shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("webhook serve: %w", err)
	}
	return nil
}
