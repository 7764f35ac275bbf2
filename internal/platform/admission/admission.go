// Package admission serves Kubernetes admission webhooks: the HTTP edge
// (POST only, JSON, a body size cap, an admission.k8s.io/v1 review with a
// request) and the TLS server with timeouts and a graceful drain. Each
// webhook gives only its decision; a malformed, oversized or hostile
// request gets HTTP 400 and a message and never reaches it.
package admission

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
	"runtime"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	admissionv1 "k8s.io/api/admission/v1"
)

// MaxBodyBytes bounds an AdmissionReview: the apiserver's own request limit
// is 3 MiB of object, and a review carries the object twice on update.
const MaxBodyBytes = 6 << 20

// Decide answers one admission request; it must set Allowed (and may set
// a patch, warnings or a result). The UID is filled in. pathValue is the
// request's http.Request.PathValue: a wildcard of the pattern it came in
// on.
type Decide func(ctx context.Context, req *admissionv1.AdmissionRequest, pathValue func(name string) string) *admissionv1.AdmissionResponse

// Observe is told how each request ended, for a webhook's own metrics:
// status is the HTTP status (200 when a review was answered, allowed or
// not; 429 when it waited for a slot in vain, unread); req and resp are
// the review's (nil when the request was refused at the edge or busy); d
// is the time taken.
type Observe func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse, status int, d time.Duration)

type handler struct {
	log     *slog.Logger
	decide  Decide
	observe Observe
	// slots bounds the reviews read and decided at once: the rest queue,
	// unread, each for at most half of the time the apiserver gives the
	// webhook, and are then answered busy (HTTP 429), in time, rather than
	// all slowed down together.
	slots    chan struct{}
	reviews  metric.Int64Counter
	duration metric.Float64Histogram
}

// Handler serves decide at the paths (http.ServeMux patterns); metrics are named <prefix>.reviews and
// <prefix>.duration, by result (allowed, denied, busy, bad_request).
// observe, when not nil, is told how each request ended.
func Handler(log *slog.Logger, meter metric.Meter, prefix string, paths []string, decide Decide, observe Observe) (http.Handler, error) {
	h := &handler{log: log, decide: decide, observe: observe, slots: make(chan struct{}, MaxConcurrentReviews())}
	var err error
	if h.reviews, err = meter.Int64Counter(prefix+".reviews",
		metric.WithDescription("Admission reviews answered, by result.")); err != nil {
		return nil, fmt.Errorf("webhook metrics: %w", err)
	}
	if h.duration, err = meter.Float64Histogram(prefix+".duration", metric.WithUnit("s"),
		metric.WithDescription("Time to answer an admission review.")); err != nil {
		return nil, fmt.Errorf("webhook metrics: %w", err)
	}
	mux := http.NewServeMux()
	for _, p := range paths {
		mux.Handle(p, h)
	}
	return mux, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	o := h.serve(w, r)
	ctx := r.Context()
	d := time.Since(start)
	h.reviews.Add(ctx, 1, metric.WithAttributes(attribute.String("result", o.result)))
	h.duration.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("result", o.result)))
	if h.observe != nil {
		h.observe(o.req, o.resp, o.status, d)
	}
}

// outcome is how a request ended: its result label, HTTP status, and the
// review's request and response when there was one.
type outcome struct {
	result string
	status int
	req    *admissionv1.AdmissionRequest
	resp   *admissionv1.AdmissionResponse
}

// refuse answers a request refused at the edge.
func refuse(w http.ResponseWriter, msg string, status int) outcome {
	http.Error(w, msg, status)
	return outcome{result: "bad_request", status: status}
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request) outcome {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return refuse(w, "only POST is accepted", http.StatusMethodNotAllowed)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return refuse(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
	}
	if r.ContentLength > MaxBodyBytes {
		return refuse(w, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes), http.StatusBadRequest)
	}
	// The slot first, then the body: a review waiting for a slot holds
	// nothing but its connection, however large its body.
	wait := queueWait(r)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-timer.C:
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("the webhook is busy: %d reviews are being decided and this one waited %s; retry", cap(h.slots), wait),
			http.StatusTooManyRequests)
		return outcome{result: "busy", status: http.StatusTooManyRequests}
	}
	// The body must arrive within the wait too: a slow sender holds its
	// slot no longer than a waiting review would wait.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(wait)) // unsupported only by test recorders
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return refuse(w, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes), http.StatusBadRequest)
		}
		return refuse(w, "reading request body: "+err.Error(), http.StatusBadRequest)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return refuse(w, "malformed AdmissionReview: "+err.Error(), http.StatusBadRequest)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return refuse(w, fmt.Sprintf("want an admission.k8s.io/v1 AdmissionReview, got %s %s", review.APIVersion, review.Kind), http.StatusBadRequest)
	}
	if review.Request == nil || review.Request.UID == "" {
		return refuse(w, "AdmissionReview has no request (or no request uid)", http.StatusBadRequest)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*wait)
	defer cancel()
	resp := h.decide(ctx, review.Request, r.PathValue)
	resp.UID = review.Request.UID
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		h.log.Warn("writing admission response", "error", err)
	}
	o := outcome{result: "denied", status: http.StatusOK, req: review.Request, resp: resp}
	if resp.Allowed {
		o.result = "allowed"
	}
	return o
}

// MaxConcurrentReviews is how many reviews a webhook decides at once:
// twice the CPUs it may use.
func MaxConcurrentReviews() int { return 2 * runtime.GOMAXPROCS(0) }

// queueWait is how long a review may wait for a slot: half of the
// timeout the apiserver gives the call (its "timeout" query parameter,
// 10 s by default), so that a busy answer still arrives in time.
func queueWait(r *http.Request) time.Duration {
	timeout := 10 * time.Second
	if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 && d <= 30*time.Second {
		timeout = d
	}
	return timeout / 2
}

// Serve serves h over TLS on lis until ctx ends, then drains in-flight
// reviews for up to drain. It serves a copy of tlsConfig (net/http adds
// its ALPN protocols to the server's config), so one config may serve
// several listeners at once.
func Serve(ctx context.Context, log *slog.Logger, lis net.Listener, tlsConfig *tls.Config, h http.Handler, drain time.Duration) error {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsConfig.Clone(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(lis, "", "") }()
	log.Info("webhook listening", "address", lis.Addr().String())
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
