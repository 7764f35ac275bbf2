package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// BenchmarkWebhookLatencyAt200RPS sends admission reviews of a typical
// VirtualService to the webhook over HTTPS on loopback at a steady 200
// requests per second (one connection, kept alive, as the apiserver does)
// and reports the latency percentiles. Run with -benchtime=2000x.
func BenchmarkWebhookLatencyAt200RPS(b *testing.B) {
	ca, err := testpki.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "galley", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		b.Fatal(err)
	}
	certFile, keyFile, err := leaf.WriteFiles(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	rl, err := tlsreload.New(tlsreload.Files{CertFile: certFile, KeyFile: keyFile}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = Serve(ctx, slog.New(slog.DiscardHandler), lis, rl.ServerConfig(), testHandler(b), time.Second)
	}()

	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
	}}
	url := "https://" + lis.Addr().String() + Path
	body := review(vsKind, admissionv1.Create, `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},
"spec":{"hosts":["reviews"],"http":[{"match":[{"uri":{"prefix":"/api"},"headers":{"end-user":{"exact":"jason"}}}],
"route":[{"destination":{"host":"reviews","subset":"v2"},"weight":90},{"destination":{"host":"reviews","subset":"v3"},"weight":10}],
"timeout":"10s","retries":{"attempts":3,"perTryTimeout":"2s","retryOn":"5xx,connect-failure"}},
{"route":[{"destination":{"host":"reviews","subset":"v1"}}]}]}}`)
	send := func() time.Duration {
		start := time.Now()
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("HTTP %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	send() // handshake outside the measurement

	latencies := make([]time.Duration, 0, b.N)
	tick := time.NewTicker(5 * time.Millisecond) // 200 requests per second
	defer tick.Stop()
	b.ResetTimer()
	for range b.N {
		<-tick.C
		latencies = append(latencies, send())
	}
	b.StopTimer()
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
}
