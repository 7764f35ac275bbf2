package telemetry

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

func TestMetricsAppearOnThePrometheusHandler(t *testing.T) {
	ctx := context.Background()
	p, err := New(ctx, Options{ServiceName: "flotilla-test", Version: "v0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	c, err := p.Meter.Meter("test").Int64Counter("flotilla.test.pushes")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(ctx, 3)

	rec := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"flotilla_test_pushes_total",
		`service_name="flotilla-test"`,
		"go_goroutines",
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestWithoutAnEndpointTracesAreNotRecorded(t *testing.T) {
	p, err := New(context.Background(), Options{ServiceName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer.Tracer("t").Start(context.Background(), "op")
	if span.IsRecording() {
		t.Fatal("span is recording without an exporter")
	}
}

// collector is an OTLP trace receiver on loopback.
type collector struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []string
	attrs []string
}

func (c *collector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			c.attrs = append(c.attrs, a.GetKey()+"="+a.GetValue().GetStringValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, s.GetName())
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func TestSpansAreExportedToTheOTLPEndpoint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	col := &collector{}
	coltrace.RegisterTraceServiceServer(srv, col)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := New(ctx, Options{ServiceName: "flotilla-galley", Version: "v1", OTLPEndpoint: lis.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer.Tracer("test").Start(ctx, "push")
	span.End()
	if err := p.Shutdown(ctx); err != nil { // flushes the batch
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.spans) != 1 || col.spans[0] != "push" {
		t.Fatalf("collector got spans %v, want [push]", col.spans)
	}
	if !strings.Contains(strings.Join(col.attrs, " "), "service.name=flotilla-galley") {
		t.Fatalf("resource attributes %v lack service.name", col.attrs)
	}
}

func TestW3CTraceContextRoundTrips(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis.Close() // nothing listens: spans are recorded, export fails quietly
	p, err := New(context.Background(), Options{ServiceName: "x", OTLPEndpoint: lis.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Shutdown(sctx) // the export fails: nothing listens
	}()
	ctx, span := p.Tracer.Tracer("t").Start(context.Background(), "op")
	defer span.End()

	carrier := propagation.HeaderCarrier(http.Header{})
	p.Propagator.Inject(ctx, carrier)
	tp := carrier.Get("traceparent")
	if !strings.HasPrefix(tp, "00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("traceparent = %q, want trace %s", tp, span.SpanContext().TraceID())
	}
	got := p.Propagator.Extract(context.Background(), carrier)
	if _, s := p.Tracer.Tracer("t").Start(got, "child"); s.SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Fatal("extracted context does not continue the trace")
	}
}
