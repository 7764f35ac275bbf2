package xds

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// metrics are what discovery counts of its proxies and pushes, twice
// where Istio's pilot counts the same: Flotilla's own instruments
// (flotilla_discovery_*), and istio's, named, labelled and bucketed as
// istiod's pilot/pkg/xds/monitoring.go and pkg/xds/monitoring.go export
// them (Istio 1.20–1.29), so that Istio's control-plane dashboard and the
// alerts Istio users have read discovery unchanged. Every label takes
// values from a fixed set (types served, a bounded set of proxy
// versions): no proxy can grow the series.
type metrics struct {
	istio istioMetrics
	types map[string]typeLabels // read-only once made

	connectedN    metric.Int64UpDownCounter
	pushCount     metric.Int64Counter
	responses     metric.Int64Counter
	resources     metric.Int64Counter
	pushDuration  metric.Float64Histogram
	convergence   metric.Float64Histogram
	nacks         metric.Int64Counter
	rejectedNodes metric.Int64Counter
	authns        metric.Int64Counter
	proxyPushes   metric.Int64Counter
	behind        metric.Int64UpDownCounter
	sendTimeouts  metric.Int64Counter
	debugStreams  metric.Int64Counter
}

func newMetrics(m, istio metric.Meter, version string) (*metrics, error) {
	var out metrics
	var err error
	wrap := func(name string, e error) error {
		if e != nil {
			return fmt.Errorf("metric %s: %w", name, e)
		}
		return nil
	}
	if out.connectedN, err = m.Int64UpDownCounter("flotilla.discovery.proxies_connected",
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
	if out.authns, err = m.Int64Counter("flotilla.discovery.proxy_authentications",
		metric.WithDescription("Streams whose proxy was authenticated, by method (certificate, or token: Istio's agent as Istio injects it) and result (accepted, cached: a token ca vouched for before, refused, or unavailable: ca could not be asked).")); err != nil {
		return nil, wrap("proxy_authentications", err)
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
	if err := out.istio.init(istio, version); err != nil {
		return nil, err
	}
	// The signs of slow proxies are exported at zero from the start, so a
	// dashboard or an alert on them reads 0, not "no data", until the
	// first slow proxy.
	out.behind.Add(context.Background(), 0)
	out.sendTimeouts.Add(context.Background(), 0)
	out.istio.writeTimeout.Add(context.Background(), 0)
	out.types = map[string]typeLabels{}
	for _, t := range translate.Types() {
		out.types[t] = newTypeLabels(t)
	}
	return &out, nil
}

// istioMetrics are pilot's metrics of xDS serving. Istio's buckets, in
// seconds (push and send time: pilot_xds_push_time's of Istio 1.20–1.29).
type istioMetrics struct {
	xds          metric.Int64UpDownCounter // pilot_xds{version}
	versions     boundedLabel
	pushes       metric.Float64Counter   // pilot_xds_pushes{type}, type_senderr on a failed send
	pushTime     metric.Float64Histogram // pilot_xds_push_time{type}
	sendTime     metric.Float64Histogram // pilot_xds_send_time
	convergence  metric.Float64Histogram // pilot_proxy_convergence_time
	configSize   metric.Float64Histogram // pilot_xds_config_size_bytes{type: the type URL}
	rejects      metric.Float64Counter   // pilot_total_xds_rejects{type}
	expiredNonce metric.Float64Counter   // pilot_xds_expired_nonce{type}
	writeTimeout metric.Float64Counter   // pilot_xds_write_timeout
}

func (m *istioMetrics) init(meter metric.Meter, version string) error {
	var err error
	wrap := func(name string, e error) error { return fmt.Errorf("metric %s: %w", name, e) }
	// The build, as pilot_info and istio_build{component="pilot"} (which
	// Istio's dashboard's "Pilot Versions" reads) say it: set once.
	info, err := meter.Float64Gauge("pilot_info", metric.WithDescription("Pilot version and build information."))
	if err != nil {
		return wrap("pilot_info", err)
	}
	info.Record(context.Background(), 1, metric.WithAttributes(attribute.String("version", version)))
	build, err := meter.Float64Gauge("istio_build", metric.WithDescription("Istio component build info"))
	if err != nil {
		return wrap("istio_build", err)
	}
	build.Record(context.Background(), 1, metric.WithAttributes(attribute.String("component", "pilot"), attribute.String("tag", version)))
	m.versions = boundedLabel{max: maxVersionLabels, seen: map[string]bool{}}
	if m.xds, err = meter.Int64UpDownCounter("pilot_xds",
		metric.WithDescription("Number of endpoints connected to this pilot using XDS.")); err != nil {
		return wrap("pilot_xds", err)
	}
	if m.pushes, err = meter.Float64Counter("pilot_xds_pushes",
		metric.WithDescription("Pilot build and send errors for lds, rds, cds and eds.")); err != nil {
		return wrap("pilot_xds_pushes", err)
	}
	pushBuckets := metric.WithExplicitBucketBoundaries(.01, .1, 1, 3, 5, 10, 20, 30)
	if m.pushTime, err = meter.Float64Histogram("pilot_xds_push_time", metric.WithUnit("s"), pushBuckets,
		metric.WithDescription("Total time in seconds Pilot takes to push lds, rds, cds and eds.")); err != nil {
		return wrap("pilot_xds_push_time", err)
	}
	if m.sendTime, err = meter.Float64Histogram("pilot_xds_send_time", metric.WithUnit("s"), pushBuckets,
		metric.WithDescription("Total time in seconds Pilot takes to send generated configuration.")); err != nil {
		return wrap("pilot_xds_send_time", err)
	}
	if m.convergence, err = meter.Float64Histogram("pilot_proxy_convergence_time", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.1, .5, 1, 3, 5, 10, 20, 30),
		metric.WithDescription("Delay in seconds between config change and a proxy receiving all required configuration.")); err != nil {
		return wrap("pilot_proxy_convergence_time", err)
	}
	if m.configSize, err = meter.Float64Histogram("pilot_xds_config_size_bytes", metric.WithUnit("By"),
		metric.WithExplicitBucketBoundaries(1, 10000, 1000000, 4000000, 10000000, 40000000),
		metric.WithDescription("Distribution of configuration sizes pushed to clients")); err != nil {
		return wrap("pilot_xds_config_size_bytes", err)
	}
	if m.rejects, err = meter.Float64Counter("pilot_total_xds_rejects",
		metric.WithDescription("Total number of XDS responses from pilot rejected by proxy.")); err != nil {
		return wrap("pilot_total_xds_rejects", err)
	}
	if m.expiredNonce, err = meter.Float64Counter("pilot_xds_expired_nonce",
		metric.WithDescription("Total number of XDS requests with an expired nonce.")); err != nil {
		return wrap("pilot_xds_expired_nonce", err)
	}
	if m.writeTimeout, err = meter.Float64Counter("pilot_xds_write_timeout",
		metric.WithDescription("Pilot XDS response write timeouts.")); err != nil {
		return wrap("pilot_xds_write_timeout", err)
	}
	return nil
}

// maxVersionLabels bounds pilot_xds's version label: the versions proxies
// claim beyond the first this many seen are counted as "other".
const maxVersionLabels = 32

// boundedLabel hands out a label value as given for the first max
// distinct values, and "other" for any later one, so a label a client
// chooses cannot grow the series without bound.
type boundedLabel struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func (b *boundedLabel) value(v string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[v] {
		return v
	}
	if len(b.seen) >= b.max || len(v) > 64 {
		return "other"
	}
	b.seen[v] = true
	return v
}

// istioType is Istio's label for an xDS type (pkg/model GetMetricType):
// cds, eds, lds, rds, sds; discovery serves no other.
func istioType(t string) string {
	if ty, ok := xdstype.Of(t); ok {
		return strings.ToLower(ty.Short)
	}
	return "other"
}

// typeLabels are an xDS type's labels as each family names it: Flotilla's
// (CDS, …), Istio's (cds, …) and the type URL (Istio's for config sizes).
// Made once per type served, since every response is counted under them.
type typeLabels struct {
	own, istio, url metric.MeasurementOption
}

func newTypeLabels(t string) typeLabels {
	return typeLabels{
		own:   metric.WithAttributes(attribute.String("type", xdstype.Short(t))),
		istio: metric.WithAttributes(attribute.String("type", istioType(t))),
		url:   metric.WithAttributes(attribute.String("type", t)),
	}
}

// labelsOf are t's labels: made at start for the types served, made
// again for any other (which discovery does not send).
func (m *metrics) labelsOf(t string) typeLabels {
	if l, ok := m.types[t]; ok {
		return l
	}
	return newTypeLabels(t)
}

// connected counts a proxy in (delta 1) or out (-1), by the version its
// metadata claims (pilot_xds's label: ISTIO_VERSION).
func (m *metrics) connected(ctx context.Context, version string, delta int64) {
	m.connectedN.Add(ctx, delta)
	m.istio.xds.Add(ctx, delta, metric.WithAttributes(attribute.String("version", m.istio.versions.value(version))))
}

// pushed records a push that reached a proxy (something was generated
// for it), from its change being seen: Istio's convergence time, which
// ends when the proxy's push is sent, not acknowledged
// (flotilla_discovery_convergence is to the ACK).
func (m *metrics) pushed(seen time.Time) {
	if !seen.IsZero() {
		m.istio.convergence.Record(context.Background(), time.Since(seen).Seconds())
	}
}

// sendFailed counts a response that could not be sent, as Istio does:
// not when the stream was closed or cancelled under it.
func (m *metrics) sendFailed(t string, err error) {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		return
	}
	m.istio.pushes.Add(context.Background(), 1, metric.WithAttributes(attribute.String("type", istioType(t)+"_senderr")))
}

// staleNonce counts a request naming a response superseded since.
func (m *metrics) staleNonce(t string) {
	m.istio.expiredNonce.Add(context.Background(), 1, m.labelsOf(t).istio)
}

// rejected counts a NACK.
func (m *metrics) rejected(t string) {
	l := m.labelsOf(t)
	m.nacks.Add(context.Background(), 1, l.own)
	m.istio.rejects.Add(context.Background(), 1, l.istio)
}

// timedOut counts a stream closed because its proxy took no response
// within the send timeout.
func (m *metrics) authenticated(method, result string) {
	m.authns.Add(context.Background(), 1, metric.WithAttributes(attribute.String("method", method), attribute.String("result", result)))
}

func (m *metrics) timedOut() {
	m.sendTimeouts.Add(context.Background(), 1)
	m.istio.writeTimeout.Add(context.Background(), 1)
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

// sent records a response of resources of type t, of size bytes,
// generated and sent in d, of which sending took send.
func (m *metrics) sent(t string, resources, size int, d, send time.Duration) {
	ctx := context.Background()
	l := m.labelsOf(t)
	m.responses.Add(ctx, 1, l.own)
	m.resources.Add(ctx, int64(resources), l.own)
	m.pushDuration.Record(ctx, d.Seconds(), l.own)
	m.istio.pushes.Add(ctx, 1, l.istio)
	m.istio.pushTime.Record(ctx, d.Seconds(), l.istio)
	m.istio.sendTime.Record(ctx, send.Seconds())
	m.istio.configSize.Record(ctx, float64(size), l.url)
}

func (m *metrics) converged(t string, d time.Duration) {
	m.convergence.Record(context.Background(), d.Seconds(), m.labelsOf(t).own)
}
