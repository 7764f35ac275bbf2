package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/testpki"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func providers(t *testing.T) (*telemetry.Providers, *tracetest.InMemoryExporter) {
	t.Helper()
	p, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	p.Tracer = trace.NewTracerProvider(trace.WithSyncer(spans))
	return p, spans
}

type running struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, s *Server) *running {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{addr: lis.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) healthpb.HealthClient {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestHealthServiceAnswersAndCallsAreTracedAndMeasured(t *testing.T) {
	p, spans := providers(t)
	s := New(Options{Log: quiet(), Telemetry: p})
	r := start(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := dial(t, r.addr, nil).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status %v", resp.GetStatus())
	}
	got := spans.GetSpans()
	if len(got) == 0 || got[0].Name != "grpc.health.v1.Health/Check" {
		t.Fatalf("spans %v, want one for the health check", got)
	}
	rec := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `rpc_server_call_duration_seconds_count{`) || !strings.Contains(rec.Body.String(), `rpc_method="grpc.health.v1.Health/Check"`) {
		t.Fatalf("/metrics has no rpc server metric for Check:\n%s", rec.Body.String())
	}
}

func TestOversizedMessageIsRejectedWithResourceExhausted(t *testing.T) {
	p, _ := providers(t)
	r := start(t, New(Options{Log: quiet(), Telemetry: p, MaxRecvMsgBytes: 1 << 10}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := dial(t, r.addr, nil).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 4<<10)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ResourceExhausted", err)
	}
}

func TestMutualTLSRequiresAClientCertificateFromTheCA(t *testing.T) {
	ca, err := testpki.NewCA("root")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srvLeaf, err := ca.Issue(testpki.Request{CommonName: "discovery", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := srvLeaf.WriteFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	rl, err := tlsreload.New(tlsreload.Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := providers(t)
	r := start(t, New(Options{Log: quiet(), Telemetry: p, TLS: rl.ServerConfig()}))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	noCert := credentials.NewClientTLSFromCert(ca.Pool(), "127.0.0.1")
	if _, err := dial(t, r.addr, noCert).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("without client cert: err = %v, want Unavailable", err)
	}
	otherCA, err := testpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	for name, issuer := range map[string]*testpki.CA{"trusted": ca, "untrusted": otherCA} {
		leaf, err := issuer.Issue(testpki.Request{CommonName: "client"})
		if err != nil {
			t.Fatal(err)
		}
		cert, err := leaf.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		creds := credentials.NewTLS(newClientTLS(ca, cert))
		_, err = dial(t, r.addr, creds).Check(ctx, &healthpb.HealthCheckRequest{})
		if (err == nil) != (name == "trusted") {
			t.Errorf("%s client cert: err = %v", name, err)
		}
	}
}

func TestShutdownDrainsThenClosesStreamsThatOutliveTheTimeout(t *testing.T) {
	p, _ := providers(t)
	s := New(Options{Log: quiet(), Telemetry: p, DrainTimeout: 200 * time.Millisecond})
	r := start(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch, err := dial(t, r.addr, nil).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := watch.Recv()
	if err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch update %v, %v", first, err)
	}

	r.cancel()
	// Draining: the open stream is told the server is going away...
	next, err := watch.Recv()
	if err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("update during drain %v, %v; want NOT_SERVING", next, err)
	}
	// ...and is closed when the drain timeout passes, and Serve returns.
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
		r.done <- nil // for the cleanup
	case <-ctx.Done():
		t.Fatal("Serve did not return after the drain timeout")
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable && !errors.Is(err, io.EOF) {
		t.Fatalf("stream after stop: %v, want Unavailable", err)
	}
}

func newClientTLS(ca *testpki.CA, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		RootCAs:      ca.Pool(),
		ServerName:   "127.0.0.1",
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
}
