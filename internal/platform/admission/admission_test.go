package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var metaReview = metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}

func review(t *testing.T, url string) *admissionv1.AdmissionResponse {
	t.Helper()
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metaReview, Request: &admissionv1.AdmissionRequest{UID: types.UID("u1")},
	})
	resp, err := http.Post(url, "application/json", bytes.NewReader(body)) //nolint:noctx // test-local
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Response
}

// TestReviewsOverTheConcurrencyLimitAreDeniedAsBusyInTime: while every
// slot holds a review that does not finish, the next one waits half of the
// apiserver's timeout and is denied as busy (429), in time; once a slot is
// free, reviews are decided again.
func TestReviewsOverTheConcurrencyLimitAreDeniedAsBusyInTime(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 64)
	var observedBusy atomic.Int32
	h, err := Handler(slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("t"), "test", "/validate",
		func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
			if req.Name == "" {
				started <- struct{}{}
				<-release
			}
			return &admissionv1.AdmissionResponse{Allowed: true}
		},
		func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse, status int, _ time.Duration) {
			if req != nil && resp != nil && resp.Result != nil && resp.Result.Code == http.StatusTooManyRequests && status == http.StatusOK {
				observedBusy.Add(1)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	done := make(chan *admissionv1.AdmissionResponse, MaxConcurrentReviews())
	for range MaxConcurrentReviews() {
		go func() { done <- review(t, srv.URL+"/validate") }()
	}
	for range MaxConcurrentReviews() {
		<-started
	}
	busy := review(t, srv.URL+"/validate?timeout=1s")
	if busy.Allowed || busy.Result == nil || busy.Result.Code != http.StatusTooManyRequests {
		t.Fatalf("a review over the limit: %+v, want denied with 429", busy)
	}
	close(release)
	for range MaxConcurrentReviews() {
		if r := <-done; !r.Allowed {
			t.Fatalf("a held review: %+v", r)
		}
	}
	if r := review(t, srv.URL+"/validate?timeout=1s"); !r.Allowed {
		t.Fatalf("with free slots: %+v", r)
	}
	if n := observedBusy.Load(); n != 1 {
		t.Errorf("the webhook's observer saw %d busy answers, want 1", n)
	}
}
