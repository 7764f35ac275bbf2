package dns

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are Istio's agent's DNS metrics (pkg/dns/client/monitoring.go),
// named as its /stats/prometheus shows them. They have no labels.
type metrics struct {
	requests, upstreams, failures metric.Float64Counter
	duration                      metric.Float64Histogram
}

func newMetrics(m metric.Meter) (*metrics, error) {
	if m == nil {
		m = noop.NewMeterProvider().Meter("")
	}
	var out metrics
	var err error
	wrap := func(name string, err error) error { return fmt.Errorf("metric %s: %w", name, err) }
	if out.requests, err = m.Float64Counter("istio_agent_dns_requests_total",
		metric.WithDescription("Total number of DNS requests.")); err != nil {
		return nil, wrap("istio_agent_dns_requests_total", err)
	}
	if out.upstreams, err = m.Float64Counter("istio_agent_dns_upstream_requests_total",
		metric.WithDescription("Total number of DNS requests forwarded to upstream.")); err != nil {
		return nil, wrap("istio_agent_dns_upstream_requests_total", err)
	}
	if out.failures, err = m.Float64Counter("istio_agent_dns_upstream_failures_total",
		metric.WithDescription("Total number of DNS failures.")); err != nil {
		return nil, wrap("istio_agent_dns_upstream_failures_total", err)
	}
	if out.duration, err = m.Float64Histogram("istio_agent_dns_upstream_request_duration_seconds",
		metric.WithExplicitBucketBoundaries(.001, .005, .01, .1, 1, 5),
		metric.WithDescription("Total time in seconds Istio takes to get DNS response from upstream.")); err != nil {
		return nil, wrap("istio_agent_dns_upstream_request_duration_seconds", err)
	}
	return &out, nil
}

func (m *metrics) request()  { m.requests.Add(context.Background(), 1) }
func (m *metrics) upstream() { m.upstreams.Add(context.Background(), 1) }
func (m *metrics) failure()  { m.failures.Add(context.Background(), 1) }
func (m *metrics) upstreamDuration(d time.Duration) {
	m.duration.Record(context.Background(), d.Seconds())
}
