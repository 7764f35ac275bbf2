package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-mesh/flotilla/internal/testpki"
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

// TestOneTLSConfigServesSeveralListenersAtOnce: a webhook listening on
// several addresses (a pod's IPs) with one certificate answers on each,
// over HTTP/2 as the apiserver speaks it, and the config it was given is
// left as it was (net/http adds its ALPN protocols to the copy it serves).
func TestOneTLSConfigServesSeveralListenersAtOnce(t *testing.T) {
	ca, err := testpki.NewCA("admission test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "webhook", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) })
	ctx, cancel := context.WithCancel(context.Background())
	var addrs []string
	done := make(chan error, 3)
	for range 3 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, lis.Addr().String())
		go func() { done <- Serve(ctx, slog.New(slog.DiscardHandler), lis, cfg, h, time.Second) }()
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true,
	}}
	for _, addr := range addrs {
		resp, err := client.Get("https://" + addr + "/") //nolint:noctx // bounded by the client's timeout
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "HTTP/2.0" {
			t.Errorf("%s answered over %q, want HTTP/2.0", addr, body)
		}
	}
	client.CloseIdleConnections()
	cancel()
	for range addrs {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if len(cfg.NextProtos) != 0 {
		t.Errorf("the caller's config was changed: NextProtos %v", cfg.NextProtos)
	}
}
