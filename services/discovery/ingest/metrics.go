package ingest

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

type ingestMetrics struct {
	buildTime metric.Float64Histogram
	debounce  metric.Float64Histogram
	merged    metric.Int64Histogram
	rejected  metric.Int64Counter
}

func newMetrics(m metric.Meter) (*ingestMetrics, error) {
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
	return &out, nil
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
