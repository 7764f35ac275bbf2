// Package telemetry sets up a service's OpenTelemetry providers: metrics
// exported for Prometheus (served on the admin /metrics endpoint), in two
// families — Flotilla's own (flotilla_*, Prometheus' naming conventions)
// and those named as Istio's control plane names them (pilot_*, galley_*,
// citadel_*, sidecar_injection_*), exported as Istio exports them — and traces
// exported over OTLP/gRPC when an endpoint is configured, with W3C trace
// context and baggage propagation. Nothing is installed globally: callers
// pass the providers to the instrumentation that needs them.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options configures New.
type Options struct {
	// ServiceName becomes the service.name resource attribute.
	ServiceName string
	// Version becomes the service.version resource attribute.
	Version string
	// OTLPEndpoint is where traces are sent: "host:port" (plain text, as
	// for a collector on the node or in the pod) or a URL
	// ("https://collector:4317"). Empty disables trace export.
	OTLPEndpoint string
}

// Providers holds the telemetry a service hands to its components.
type Providers struct {
	// Meter is the meter provider of Flotilla's own metrics; its
	// instruments appear on MetricsHandler with Prometheus' suffixes (a
	// counter's _total, a unit's _seconds) and no otel_scope labels.
	Meter metric.MeterProvider
	// Istio is the meter provider of the metrics Istio's control plane
	// exports, named as Istio names them, so the dashboards and alerts
	// Istio users have read them unchanged. They are exported as Istio's
	// pkg/monitoring exports them: no unit or _total suffix is added (a
	// counter named pilot_xds_pushes is pilot_xds_pushes), no otel_scope
	// labels, no target_info. Durations are recorded in seconds.
	Istio metric.MeterProvider
	// Tracer is the tracer provider: exporting over OTLP, or a no-op.
	Tracer trace.TracerProvider
	// Propagator carries W3C trace context and baggage across processes.
	Propagator propagation.TextMapPropagator

	metrics  http.Handler
	shutdown []func(context.Context) error
}

// New builds the providers. Call Shutdown to flush them.
func New(ctx context.Context, o Options) (*Providers, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", o.ServiceName),
		attribute.String("service.version", o.Version),
	))
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}

	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register go collector: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process collector: %w", err)
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	istio, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("prometheus exporter (Istio's metrics): %w", err), mp.Shutdown(ctx))
	}
	imp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(istio), sdkmetric.WithResource(res))
	p := &Providers{
		Meter: mp,
		Istio: imp,
		Propagator: propagation.NewCompositeTextMapPropagator(
			propagation.TraceContext{}, propagation.Baggage{}),
		metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		shutdown: []func(context.Context) error{mp.Shutdown, imp.Shutdown},
	}

	if o.OTLPEndpoint == "" {
		p.Tracer = noop.NewTracerProvider()
		return p, nil
	}
	var opt otlptracegrpc.Option
	if strings.Contains(o.OTLPEndpoint, "://") {
		opt = otlptracegrpc.WithEndpointURL(o.OTLPEndpoint)
	} else {
		opt = otlptracegrpc.WithEndpoint(o.OTLPEndpoint)
	}
	opts := []otlptracegrpc.Option{opt}
	if !strings.Contains(o.OTLPEndpoint, "://") {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	te, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("otlp trace exporter %q: %w", o.OTLPEndpoint, err), mp.Shutdown(ctx), imp.Shutdown(ctx))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(te), sdktrace.WithResource(res))
	p.Tracer = tp
	p.shutdown = append(p.shutdown, tp.Shutdown)
	return p, nil
}

// MetricsHandler serves every metric in the Prometheus text format.
func (p *Providers) MetricsHandler() http.Handler { return p.metrics }

// Shutdown flushes pending spans and stops the providers.
func (p *Providers) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range p.shutdown {
		if err := f(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
