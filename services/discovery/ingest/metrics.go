package ingest

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// ingestMetrics are what discovery counts of galley's updates and the
// pushes it debounces them into: Flotilla's own (flotilla_discovery_*)
// and, where Istio's pilot counts the same, Istio's instruments, named,
// labelled and bucketed as pilot/pkg/xds/monitoring.go and
// pilot/pkg/model/push_context.go export them (Istio 1.20–1.29).
type ingestMetrics struct {
	buildTime metric.Float64Histogram
	debounce  metric.Float64Histogram
	merged    metric.Int64Histogram
	rejected  metric.Int64Counter

	istioDebounce metric.Float64Histogram // pilot_debounce_time
	istioInit     metric.Float64Histogram // pilot_pushcontext_init_seconds
	triggers      metric.Float64Counter   // pilot_push_triggers{type}
	inbound       metric.Float64Counter   // pilot_inbound_updates{type}
	services      metric.Float64Gauge     // pilot_services
	virtServices  metric.Float64Gauge     // pilot_virt_services
}

func newMetrics(m, istio metric.Meter) (*ingestMetrics, error) {
	var out ingestMetrics
	var err error
	buckets := metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
	if out.buildTime, err = m.Float64Histogram("flotilla.discovery.push_context_build", metric.WithUnit("s"), buckets,
		metric.WithDescription("Time to build a push context, by kind (full or eds).")); err != nil {
		return nil, fmt.Errorf("metric push_context_build: %w", err)
	}
	if out.debounce, err = m.Float64Histogram("flotilla.discovery.debounce_delay", metric.WithUnit("s"), buckets,
		metric.WithDescription("From the first change of a push being seen to the push.")); err != nil {
		return nil, fmt.Errorf("metric debounce_delay: %w", err)
	}
	if out.merged, err = m.Int64Histogram("flotilla.discovery.debounce_merged",
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 50, 100, 1000),
		metric.WithDescription("Updates from galley merged into one push.")); err != nil {
		return nil, fmt.Errorf("metric debounce_merged: %w", err)
	}
	if out.rejected, err = m.Int64Counter("flotilla.discovery.resources_rejected",
		metric.WithDescription("Resources from galley that did not decode (NACKed).")); err != nil {
		return nil, fmt.Errorf("metric resources_rejected: %w", err)
	}
	istioBuckets := metric.WithExplicitBucketBoundaries(.01, .1, 1, 3, 5, 10, 20, 30)
	if out.istioDebounce, err = istio.Float64Histogram("pilot_debounce_time", metric.WithUnit("s"), istioBuckets,
		metric.WithDescription("Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue.")); err != nil {
		return nil, fmt.Errorf("metric pilot_debounce_time: %w", err)
	}
	if out.istioInit, err = istio.Float64Histogram("pilot_pushcontext_init_seconds", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.01, .1, 0.5, 1, 3, 5),
		metric.WithDescription("Total time in seconds Pilot takes to init pushContext.")); err != nil {
		return nil, fmt.Errorf("metric pilot_pushcontext_init_seconds: %w", err)
	}
	if out.triggers, err = istio.Float64Counter("pilot_push_triggers",
		metric.WithDescription("Total number of times a push was triggered, labeled by reason for the push.")); err != nil {
		return nil, fmt.Errorf("metric pilot_push_triggers: %w", err)
	}
	if out.inbound, err = istio.Float64Counter("pilot_inbound_updates",
		metric.WithDescription("Total number of updates received by pilot.")); err != nil {
		return nil, fmt.Errorf("metric pilot_inbound_updates: %w", err)
	}
	if out.services, err = istio.Float64Gauge("pilot_services",
		metric.WithDescription("Total services known to pilot.")); err != nil {
		return nil, fmt.Errorf("metric pilot_services: %w", err)
	}
	if out.virtServices, err = istio.Float64Gauge("pilot_virt_services",
		metric.WithDescription("Total virtual services known to pilot.")); err != nil {
		return nil, fmt.Errorf("metric pilot_virt_services: %w", err)
	}
	return &out, nil
}

// received counts one update from galley as Istio counts its inbound
// updates: eds (endpoints), svc and svcdelete (services), config
// (anything else: Istio configuration, namespaces, the mesh
// configuration, credentials).
func (m *ingestMetrics) received(typeURL string, updated, removed int) {
	kind, removal := "config", "config"
	switch typeURL {
	case registry.EndpointSetTypeURL:
		kind, removal = "eds", "eds"
	case registry.ServiceTypeURL:
		kind, removal = "svc", "svcdelete"
	}
	ctx := context.Background()
	if updated > 0 {
		m.inbound.Add(ctx, float64(updated), metric.WithAttributes(attribute.String("type", kind)))
	}
	if removed > 0 {
		m.inbound.Add(ctx, float64(removed), metric.WithAttributes(attribute.String("type", removal)))
	}
}

// trigger is Istio's reason for a push (pilot_push_triggers' type) that
// an update of a collection is.
func trigger(typeURL string) string {
	switch typeURL {
	case registry.EndpointSetTypeURL:
		return "endpoint"
	case registry.ServiceTypeURL:
		return "service"
	case registry.NamespaceTypeURL:
		return "namespace"
	case registry.MeshConfigTypeURL:
		return "global"
	case registry.CredentialTypeURL:
		return "secret"
	}
	return "config"
}

// pushing records a push about to be made, of a push context built in
// build, delay after its first update, for the reasons (Istio's trigger
// types) of the updates it merged.
func (m *ingestMetrics) pushing(pc *model.PushContext, build time.Duration, events int, delay time.Duration, full bool, reasons map[string]bool) {
	m.built(build, events, delay, full)
	ctx := context.Background()
	m.istioDebounce.Record(ctx, delay.Seconds())
	m.istioInit.Record(ctx, build.Seconds())
	for r := range reasons {
		m.triggers.Add(ctx, 1, metric.WithAttributes(attribute.String("type", r)))
	}
	if full {
		m.services.Record(ctx, float64(len(pc.Services())))
		m.virtServices.Record(ctx, float64(len(pc.VirtualServices())))
	}
}

func (m *ingestMetrics) built(build time.Duration, events int, delay time.Duration, full bool) {
	kind := "eds"
	if full {
		kind = "full"
	}
	ctx := context.Background()
	m.buildTime.Record(ctx, build.Seconds(), metric.WithAttributes(attribute.String("kind", kind)))
	m.debounce.Record(ctx, delay.Seconds())
	m.merged.Record(ctx, int64(events))
}
