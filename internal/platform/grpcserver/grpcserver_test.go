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
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
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

func newServer(t *testing.T, o Options) *Server {
	t.Helper()
	if o.Log == nil {
		o.Log = quiet()
	}
	if o.Telemetry == nil {
		o.Telemetry, _ = providers(t)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
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
	r := start(t, newServer(t, Options{Telemetry: p}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := dial(t, r.addr, nil).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status %v", resp.GetStatus())
	}
	// The server ends its span after the response is on the wire, so the
	// client can see the response first: wait for the span.
	metrics := func() string {
		rec := httptest.NewRecorder()
		p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String()
	}
	measured := func(m string) bool {
		return strings.Contains(m, `rpc_server_call_duration_seconds_count{`) && strings.Contains(m, `rpc_method="grpc.health.v1.Health/Check"`)
	}
	deadline := time.Now().Add(10 * time.Second)
	for (len(spans.GetSpans()) == 0 || !measured(metrics())) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := spans.GetSpans()
	if len(got) == 0 || got[0].Name != "grpc.health.v1.Health/Check" {
		t.Fatalf("spans %v, want one for the health check", got)
	}
	if m := metrics(); !measured(m) {
		t.Fatalf("/metrics has no rpc server metric for Check:\n%s", m)
	}
}

func TestOversizedMessageIsRejectedWithResourceExhausted(t *testing.T) {
	r := start(t, newServer(t, Options{MaxRecvMsgBytes: 1 << 10}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := dial(t, r.addr, nil).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 4<<10)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ResourceExhausted", err)
	}
}

type pki struct {
	ca    *testpki.CA
	dir   string
	files tlsreload.Files
}

// newPKI writes a CA file and a server certificate for 127.0.0.1.
func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := testpki.NewCA("root")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca, dir: t.TempDir()}
	p.files.CAFile = filepath.Join(p.dir, "ca.pem")
	if err := os.WriteFile(p.files.CAFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	p.rotate(t)
	return p
}

// rotate writes a new server certificate and returns its serial.
func (p *pki) rotate(t *testing.T) string {
	t.Helper()
	leaf, err := p.ca.Issue(testpki.Request{CommonName: "discovery", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if p.files.CertFile, p.files.KeyFile, err = leaf.WriteFiles(p.dir); err != nil {
		t.Fatal(err)
	}
	return leaf.Cert.SerialNumber.String()
}

// clientCreds returns TLS client credentials with a certificate from issuer
// (none when issuer is nil) that record the server certificate's serial.
func (p *pki) clientCreds(t *testing.T, issuer *testpki.CA, serial *string) credentials.TransportCredentials {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if issuer != nil {
		leaf, err := issuer.Issue(testpki.Request{CommonName: "client"})
		if err != nil {
			t.Fatal(err)
		}
		cert, err := leaf.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if serial != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			*serial = cs.PeerCertificates[0].SerialNumber.String()
			return nil
		}
	}
	return credentials.NewTLS(cfg)
}

func TestMutualTLSRequiresAClientCertificateFromTheCA(t *testing.T) {
	p := newPKI(t)
	r := start(t, newServer(t, Options{TLS: p.files}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	otherCA, err := testpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		issuer *testpki.CA
		ok     bool
	}{"no client certificate": {nil, false}, "untrusted": {otherCA, false}, "trusted": {p.ca, true}} {
		_, err := dial(t, r.addr, p.clientCreds(t, tc.issuer, nil)).Check(ctx, &healthpb.HealthCheckRequest{})
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", name, err)
		}
		if !tc.ok && status.Code(err) != codes.Unavailable {
			t.Errorf("%s: code %v, want Unavailable", name, status.Code(err))
		}
	}
}

func TestRefusedHandshakesAreCountedAndLoggedButAClosedProbeIsNot(t *testing.T) {
	p := newPKI(t)
	prov, _ := providers(t)
	var logs testenv.SyncBuffer
	r := start(t, newServer(t, Options{TLS: p.files, Telemetry: prov, Log: slog.New(slog.NewTextHandler(&logs, nil))}))
	refused := func() string {
		rec := httptest.NewRecorder()
		prov.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(l, "flotilla_grpc_server_handshakes_refused_total") {
				return l[strings.LastIndex(l, " ")+1:]
			}
		}
		return "0"
	}
	// A TCP probe: connects and closes without a word.
	probe, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = probe.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(p.clientCreds(t, nil, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	_ = conn.Close() // before its reconnection (a second later) could try again
	if err == nil {
		t.Fatal("no client certificate was accepted")
	}
	deadline := time.Now().Add(10 * time.Second)
	for refused() != "1" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := refused(); got != "1" {
		t.Fatalf("handshakes refused: %s, want 1 (the client without a certificate; not the probe)", got)
	}
	if l := logs.String(); strings.Count(l, "TLS handshake refused") != 1 || !strings.Contains(l, "peer=127.0.0.1") {
		t.Fatalf("log:\n%s\nwant one line for the refused handshake, with its peer", l)
	}
}

func TestRotatedCertificateFilesAreServedToNewConnections(t *testing.T) {
	p := newPKI(t)
	firstSerial := p.rotate(t)
	r := start(t, newServer(t, Options{TLS: p.files}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seen string
	if _, err := dial(t, r.addr, p.clientCreds(t, p.ca, &seen)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if seen != firstSerial {
		t.Fatalf("served %s, want %s", seen, firstSerial)
	}
	time.Sleep(100 * time.Millisecond) // let the watcher start before rotating
	next := p.rotate(t)
	for seen != next {
		if ctx.Err() != nil {
			t.Fatalf("rotated certificate %s never served (still %s)", next, seen)
		}
		time.Sleep(50 * time.Millisecond)
		if _, err := dial(t, r.addr, p.clientCreds(t, p.ca, &seen)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewFailsWhenTLSFilesCannotBeLoaded(t *testing.T) {
	p, _ := providers(t)
	_, err := New(Options{Log: quiet(), Telemetry: p, TLS: tlsreload.Files{CertFile: "/nonexistent/cert.pem", KeyFile: "/nonexistent/key.pem"}})
	if err == nil || !strings.Contains(err.Error(), "grpc server tls") {
		t.Fatalf("err = %v", err)
	}
}

// TestShutdownEndsOpenStreamsSoTheDrainCompletes: subscriptions (xDS,
// MCP) never end on their own; the drain ends them (their clients then
// reconnect elsewhere) instead of waiting out the drain timeout, and
// Serve returns with no error.
func TestShutdownEndsOpenStreamsSoTheDrainCompletes(t *testing.T) {
	r := start(t, newServer(t, Options{DrainTimeout: time.Hour}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	// The stream may still see NOT_SERVING; then it ends.
	for {
		next, err := watch.Recv()
		if err != nil {
			if c := status.Code(err); c != codes.Unavailable && c != codes.Canceled && !errors.Is(err, io.EOF) {
				t.Fatalf("stream ended with %v, want Unavailable, Canceled or EOF", err)
			}
			break
		}
		if next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("update during drain %v; want NOT_SERVING", next)
		}
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
		r.done <- nil // for the cleanup
	case <-ctx.Done():
		t.Fatal("Serve did not return: the open stream held the drain")
	}
}

// TestAStreamBlockedReceivingDoesNotHoldTheDrain: a handler that only
// waits for the client's next message (as discovery's xDS streams do)
// cannot see its context; its connection is closed StreamGrace into the
// drain, the client sees the stream end, and Serve returns cleanly.
func TestAStreamBlockedReceivingDoesNotHoldTheDrain(t *testing.T) {
	s := newServer(t, Options{DrainTimeout: time.Hour})
	received := make(chan struct{}, 1)
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Blocker",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: "Block", ClientStreams: true, ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				for {
					if err := stream.RecvMsg(&emptypb.Empty{}); err != nil {
						return nil //nolint:nilerr // the client went away
					}
					received <- struct{}{}
				}
			},
		}},
	}, nil)
	r := start(t, s)
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/test.Blocker/Block")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	<-received
	r.cancel()
	if err := stream.RecvMsg(&emptypb.Empty{}); err == nil {
		t.Fatal("the stream is still open after the drain")
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
		r.done <- nil
	case <-ctx.Done():
		t.Fatal("Serve did not return")
	}
}

// TestAConnectionPastItsAgeEndsItsStreamsAndTheClientReconnects: with a
// maximum connection age, a stream that never ends by itself (an xDS
// subscription) is ended after the age and its grace, and the client's
// next stream goes over a new connection, as a proxy's reconnection would
// reach another replica.
func TestAConnectionPastItsAgeEndsItsStreamsAndTheClientReconnects(t *testing.T) {
	r := start(t, newServer(t, Options{MaxConnectionAge: 300 * time.Millisecond, MaxConnectionAgeGrace: 200 * time.Millisecond}))
	client := dial(t, r.addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for round := range 2 {
		watch, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if first, err := watch.Recv(); err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("round %d: first watch update %v, %v", round, first, err)
		}
		if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("round %d: the stream ended with %v, want Unavailable (the connection's age)", round, err)
		}
		if ctx.Err() != nil {
			t.Fatal("the stream was not ended within 30s")
		}
	}
}

// closedWithin reports whether the server closes conn (reads end) within d.
func closedWithin(t *testing.T, conn net.Conn, d time.Duration) bool {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			var ne net.Error
			return !errors.As(err, &ne) || !ne.Timeout()
		}
	}
}

func TestAConnectionThatNeverHandshakesIsClosed(t *testing.T) {
	r := start(t, newServer(t, Options{HandshakeTimeout: 200 * time.Millisecond}))
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !closedWithin(t, conn, 10*time.Second) {
		t.Fatal("a connection that sent nothing was still open after 10 s")
	}
}

func TestAConnectionWithNoRPCIsClosedOnceIdle(t *testing.T) {
	r := start(t, newServer(t, Options{MaxConnectionIdle: 200 * time.Millisecond}))
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The HTTP/2 handshake done, no RPC.
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(t, conn, 10*time.Second) {
		t.Fatal("an idle HTTP/2 connection was still open after 10 s")
	}
}

func TestStreamsOverTheLimitOfAConnectionWaitForOneToEnd(t *testing.T) {
	r := start(t, newServer(t, Options{MaxConcurrentStreams: 2}))
	client := dial(t, r.addr, nil)
	watch := func(ctx context.Context) error {
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		return err
	}
	first, endFirst := context.WithCancel(t.Context())
	if err := watch(first); err != nil {
		t.Fatal(err)
	}
	if err := watch(t.Context()); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer stop()
	if err := watch(short); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third stream on a connection allowed two: %v, want it to wait (DeadlineExceeded)", err)
	}
	endFirst()
	later, stopLater := context.WithTimeout(t.Context(), 10*time.Second)
	defer stopLater()
	if err := watch(later); err != nil {
		t.Fatalf("a third stream once the first ended: %v", err)
	}
}

func TestConnectionsOverAPeersLimitAreClosedAndItsOthersKept(t *testing.T) {
	r := start(t, newServer(t, Options{MaxConnsPerPeer: 3}))
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	over, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if !closedWithin(t, over, 10*time.Second) {
		t.Fatal("a fourth connection from a peer allowed three was kept")
	}
	for i, c := range held {
		if closedWithin(t, c, 200*time.Millisecond) { // it reads the server's HTTP/2 settings, then waits
			t.Fatalf("connection %d within the limit was closed", i)
		}
	}
	held[0].Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := dial(t, r.addr, nil).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a connection once one of the three closed: %v", err)
	}
}

func TestPeerIPIsTheCallersAddressWithoutItsPort(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 4321}, "10.1.2.3"},
		{&net.TCPAddr{IP: net.ParseIP("fd00::7"), Port: 1}, "fd00::7"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "/run/x.sock"},
	} {
		if got := PeerIP(peer.NewContext(context.Background(), &peer.Peer{Addr: c.addr})); got != c.want {
			t.Errorf("PeerIP(%v) = %q, want %q", c.addr, got, c.want)
		}
	}
	if got := PeerIP(context.Background()); got != "" {
		t.Errorf("no peer: %q", got)
	}
}
