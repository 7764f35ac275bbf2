package xds

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

type metrics struct {
	connected     metric.Int64UpDownCounter
	pushCount     metric.Int64Counter
	responses     metric.Int64Counter
	resources     metric.Int64Counter
	pushDuration  metric.Float64Histogram
	convergence   metric.Float64Histogram
	nacks         metric.Int64Counter
	rejectedNodes metric.Int64Counter
	proxyPushes   metric.Int64Counter
	behind        metric.Int64UpDownCounter
	sendTimeouts  metric.Int64Counter
	debugStreams  metric.Int64Counter
}

func newMetrics(m metric.Meter) (*metrics, error) {
	var out metrics
	var err error
	wrap := func(name string, e error) error {
		if e != nil {
			return fmt.Errorf("metric %s: %w", name, e)
		}
		return nil
	}
	if out.connected, err = m.Int64UpDownCounter("flotilla.discovery.proxies_connected",
		metric.WithDescription("Proxies with an open ADS stream.")); err != nil {
		return nil, wrap("proxies_connected", err)
	}
	if out.pushCount, err = m.Int64Counter("flotilla.discovery.pushes",
		metric.WithDescription("Push contexts handed to the connected proxies, by kind: full, eds, or none (only the versions of objects that reach proxies through the registry moved).")); err != nil {
		return nil, wrap("pushes", err)
	}
	if out.responses, err = m.Int64Counter("flotilla.discovery.xds_responses",
		metric.WithDescription("xDS responses sent, by type.")); err != nil {
		return nil, wrap("xds_responses", err)
	}
	if out.resources, err = m.Int64Counter("flotilla.discovery.xds_resources_sent",
		metric.WithDescription("Resources sent in xDS responses, by type.")); err != nil {
		return nil, wrap("xds_resources_sent", err)
	}
	buckets := metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
	if out.pushDuration, err = m.Float64Histogram("flotilla.discovery.push_duration", metric.WithUnit("s"), buckets,
		metric.WithDescription("Time to generate and send one xDS response, by type.")); err != nil {
		return nil, wrap("push_duration", err)
	}
	if out.convergence, err = m.Float64Histogram("flotilla.discovery.convergence", metric.WithUnit("s"), buckets,
		metric.WithDescription("From a change being seen to the proxy acknowledging the response carrying it, by type.")); err != nil {
		return nil, wrap("convergence", err)
	}
	if out.nacks, err = m.Int64Counter("flotilla.discovery.nacks",
		metric.WithDescription("Responses proxies rejected, by type.")); err != nil {
		return nil, wrap("nacks", err)
	}
	if out.rejectedNodes, err = m.Int64Counter("flotilla.discovery.rejected_nodes",
		metric.WithDescription("Streams refused because the node ID or metadata did not parse.")); err != nil {
		return nil, wrap("rejected_nodes", err)
	}
	if out.proxyPushes, err = m.Int64Counter("flotilla.discovery.proxy_pushes",
		metric.WithDescription("Pushes handled per proxy, by decision: full (translated again), eds (endpoints only) or skipped (the change does not concern it).")); err != nil {
		return nil, wrap("proxy_pushes", err)
	}
	if out.behind, err = m.Int64UpDownCounter("flotilla.discovery.proxies_behind",
		metric.WithDescription("Proxies whose response has waited at least a second for them to read (HTTP/2 flow control): slow or stuck readers.")); err != nil {
		return nil, wrap("proxies_behind", err)
	}
	if out.sendTimeouts, err = m.Int64Counter("flotilla.discovery.send_timeouts",
		metric.WithDescription("Streams closed because the proxy took no response within the send timeout.")); err != nil {
		return nil, wrap("send_timeouts", err)
	}
	if out.debugStreams, err = m.Int64Counter("flotilla.discovery.debug_streams",
		metric.WithDescription("Debug streams (flotilla proxy-status and proxy-config) authorized, by first type asked (a type not served counts as other).")); err != nil {
		return nil, wrap("debug_streams", err)
	}
	return &out, nil
}

// debugRequests counts an authorized debug stream; the label is one of
// the served types or "other", so a client cannot grow the series.
func (m *metrics) debugRequests(typeURL string) {
	switch typeURL {
	case debugapi.Syncz, debugapi.ConfigDump, debugapi.AckedConfigDump:
	default:
		typeURL = "other"
	}
	m.debugStreams.Add(context.Background(), 1, metric.WithAttributes(attribute.String("type", typeURL)))
}

func (m *metrics) decided(decision string) {
	m.proxyPushes.Add(context.Background(), 1, metric.WithAttributes(attribute.String("decision", decision)))
}

func (m *metrics) pushes(cs model.ChangeSet) {
	kind := "eds"
	switch {
	case cs.Full:
		kind = "full"
	case len(cs.Endpoints) == 0:
		kind = "none" // only objects' versions moved (their effect comes as registry changes)
	}
	m.pushCount.Add(context.Background(), 1, metric.WithAttributes(attribute.String("kind", kind)))
}

func (m *metrics) sent(t string, resources int, d time.Duration) {
	attrs := metric.WithAttributes(attribute.String("type", shortType(t)))
	m.responses.Add(context.Background(), 1, attrs)
	m.resources.Add(context.Background(), int64(resources), attrs)
	m.pushDuration.Record(context.Background(), d.Seconds(), attrs)
}

func (m *metrics) converged(t string, d time.Duration) {
	m.convergence.Record(context.Background(), d.Seconds(), metric.WithAttributes(attribute.String("type", shortType(t))))
}
