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

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// newProviders is New for a test, shut down (and checked) when it ends.
func newProviders(t *testing.T) *Providers {
	t.Helper()
	p, err := New(context.Background(), Options{ServiceName: "flotilla-test", Version: "v0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return p
}

// scrape is /metrics as Prometheus reads it.
func scrape(p *Providers) string {
	rec := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

func TestMetricsAppearOnThePrometheusHandler(t *testing.T) {
	ctx := context.Background()
	p := newProviders(t)
	c, err := p.Meter.Meter("test").Int64Counter("flotilla.test.pushes")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(ctx, 3)
	body := scrape(p)
	for _, want := range []string{
		"flotilla_test_pushes_total 3",
		`service_name="flotilla-test"`,
		"go_goroutines",
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "otel_scope") {
		t.Errorf("/metrics has otel_scope labels:\n%s", body)
	}
}

func TestIstiosMetricsAreExportedAsIstioExportsThem(t *testing.T) {
	ctx := context.Background()
	p := newProviders(t)
	m := p.Istio.Meter("istio")
	pushes, err := m.Float64Counter("pilot_xds_pushes")
	if err != nil {
		t.Fatal(err)
	}
	pushes.Add(ctx, 2, metric.WithAttributes(attribute.String("type", "cds")))
	pushTime, err := m.Float64Histogram("pilot_xds_push_time", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(.01, .1, 1, 3, 5, 10, 20, 30))
	if err != nil {
		t.Fatal(err)
	}
	pushTime.Record(ctx, 0.05, metric.WithAttributes(attribute.String("type", "cds")))
	requests, err := m.Float64Counter("sidecar_injection_requests_total")
	if err != nil {
		t.Fatal(err)
	}
	requests.Add(ctx, 1)
	body := scrape(p)
	// The lines Istio's istiod exports for the same recordings.
	for _, want := range []string{
		"# TYPE pilot_xds_pushes counter",
		`pilot_xds_pushes{type="cds"} 2`,
		`pilot_xds_push_time_bucket{type="cds",le="0.01"} 0`,
		`pilot_xds_push_time_bucket{type="cds",le="0.1"} 1`,
		`pilot_xds_push_time_count{type="cds"} 1`,
		"sidecar_injection_requests_total 1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, unwanted := range []string{"pilot_xds_pushes_total", "pilot_xds_push_time_seconds", "otel_scope", "sidecar_injection_requests_total_total"} {
		if strings.Contains(body, unwanted) {
			t.Errorf("/metrics has %q", unwanted)
		}
	}
	// One target_info, Flotilla's: Istio's family adds none.
	if n := strings.Count(body, "\ntarget_info{"); n != 1 {
		t.Errorf("%d target_info series, want 1", n)
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
