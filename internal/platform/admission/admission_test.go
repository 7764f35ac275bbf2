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

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
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

// holdingHandler is a webhook whose reviews without a name hold their
// slot until release is closed (each says so on started); observedBusy
// counts the busy answers its observer saw.
func holdingHandler(t *testing.T, release chan struct{}) (http.Handler, chan struct{}, *atomic.Int32) {
	t.Helper()
	started := make(chan struct{}, 64)
	var observedBusy atomic.Int32
	h, err := Handler(slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("t"), "test", []string{"/validate"},
		func(ctx context.Context, req *admissionv1.AdmissionRequest, _ func(string) string) *admissionv1.AdmissionResponse {
			if req.Name == "" {
				started <- struct{}{}
				<-release
			}
			return &admissionv1.AdmissionResponse{Allowed: true}
		},
		func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse, status int, _ time.Duration) {
			if req == nil && resp == nil && status == http.StatusTooManyRequests {
				observedBusy.Add(1)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	return h, started, &observedBusy
}

// TestReviewsOverTheConcurrencyLimitAreAnsweredBusyInTime: while every
// slot holds a review that does not finish, the next one waits half of the
// apiserver's timeout and is answered busy (HTTP 429, Retry-After), in
// time; once a slot is free, reviews are decided again.
func TestReviewsOverTheConcurrencyLimitAreAnsweredBusyInTime(t *testing.T) {
	release := make(chan struct{})
	h, started, observedBusy := holdingHandler(t, release)
	srv := httptest.NewServer(h)
	defer srv.Close()
	done := make(chan *admissionv1.AdmissionResponse, MaxConcurrentReviews())
	for range MaxConcurrentReviews() {
		go func() { done <- review(t, srv.URL+"/validate") }()
	}
	for range MaxConcurrentReviews() {
		<-started
	}
	body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metaReview, Request: &admissionv1.AdmissionRequest{UID: types.UID("u2")}})
	busy, err := http.Post(srv.URL+"/validate?timeout=1s", "application/json", bytes.NewReader(body)) //nolint:noctx // test-local
	if err != nil {
		t.Fatal(err)
	}
	busy.Body.Close()
	if busy.StatusCode != http.StatusTooManyRequests || busy.Header.Get("Retry-After") == "" {
		t.Fatalf("a review over the limit: HTTP %d, Retry-After %q; want 429 and a Retry-After", busy.StatusCode, busy.Header.Get("Retry-After"))
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

// countingBody is a request body of n bytes that counts what was taken
// of it.
type countingBody struct {
	left  int
	taken atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), b.left)
	for i := range p[:n] {
		p[i] = ' '
	}
	b.left -= n
	b.taken.Add(int64(n))
	return n, nil
}

// TestAReviewWaitingForASlotIsNotRead: over HTTP/2, as the apiserver
// calls, a 6 MiB review that finds every slot taken is answered busy
// having been sent no more than the connection's flow-control window:
// the webhook did not read it (16 such reviews once added 340 MiB to
// galley); one with a Content-Length over the cap is refused unread.
func TestAReviewWaitingForASlotIsNotRead(t *testing.T) {
	release := make(chan struct{})
	h, started, _ := holdingHandler(t, release)
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(release) // before Close, which waits for the held reviews
	client := srv.Client()
	for range MaxConcurrentReviews() {
		go func() {
			body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metaReview, Request: &admissionv1.AdmissionRequest{UID: types.UID("u1")}})
			if resp, err := client.Post(srv.URL+"/validate", "application/json", bytes.NewReader(body)); err == nil { //nolint:noctx // test-local
				resp.Body.Close()
			}
		}()
	}
	for range MaxConcurrentReviews() {
		<-started
	}
	b := &countingBody{left: MaxBodyBytes}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/validate?timeout=1s", b)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("HTTP/%d %d, want HTTP/2 429", resp.ProtoMajor, resp.StatusCode)
	}
	if n := b.taken.Load(); n > 2<<20 {
		t.Fatalf("%d bytes of a waiting review were sent: it was read", n)
	}
	big, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/validate", &countingBody{left: MaxBodyBytes + 1})
	if err != nil {
		t.Fatal(err)
	}
	big.ContentLength = MaxBodyBytes + 1
	big.Header.Set("Content-Type", "application/json")
	resp, err = client.Do(big)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a review declaring %d bytes: HTTP %d, want 400", MaxBodyBytes+1, resp.StatusCode)
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
