package translate

import (
	"maps"
	"slices"

	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"istio.io/api/envoy/extensions/stats"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Istio's standard metrics, as istiod configures them (pilot/pkg/model/
// telemetry.go buildHTTPTelemetryFilter and buildTCPTelemetryFilter,
// pilot/pkg/xds/filters): the stats filter per Prometheus provider the
// Telemetry API (or the mesh's defaultProviders) names, after the
// connection manager's other filters or before the TCP proxy; the peer
// metadata exchange first on HTTP, on inbound TCP, and on outbound
// clusters. Only Istio's build of Envoy has these filters
// (client.istioTelemetry); other proxies get neither.

// Names and types of Istio's telemetry filters.
const (
	statsFilter                   = "istio.stats"
	metadataExchangeFilter        = "istio.metadata_exchange"
	peerMetadataTypeURL           = "type.googleapis.com/io.istio.http.peer_metadata.Config"
	metadataExchangeTCPTypeURL    = "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange"
	istioPeerExchangeALPNProtocol = "istio-peer-exchange"
)

// prometheusMetricName is the name Istio's stats filter gives a standard
// metric (Istio's metricToPrometheusMetric); a custom metric keeps its
// own.
var prometheusMetricName = map[string]string{
	"REQUEST_COUNT":          "requests_total",
	"REQUEST_DURATION":       "request_duration_milliseconds",
	"REQUEST_SIZE":           "request_bytes",
	"RESPONSE_SIZE":          "response_bytes",
	"TCP_OPENED_CONNECTIONS": "tcp_connections_opened_total",
	"TCP_CLOSED_CONNECTIONS": "tcp_connections_closed_total",
	"TCP_SENT_BYTES":         "tcp_sent_bytes_total",
	"TCP_RECEIVED_BYTES":     "tcp_received_bytes_total",
	"GRPC_REQUEST_MESSAGES":  "request_messages_total",
	"GRPC_RESPONSE_MESSAGES": "response_messages_total",
}

// statsConfigs are the stats filters' configurations for side, one per
// Prometheus provider in provider-name order, built once per generator.
func (g *gen) statsConfigs(side model.WorkloadMode) []*anypb.Any {
	if !g.client.istioTelemetry {
		return nil
	}
	if cfgs, ok := g.tel.stats[side]; ok {
		return cfgs
	}
	merged := g.appliedTelemetry().MergeMetrics(g.pc.Mesh)
	var out []*anypb.Any
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		p := g.pc.ExtensionProvider(name)
		if p == nil {
			continue
		}
		if _, ok := p.GetProvider().(*meshv1alpha1.MeshConfig_ExtensionProvider_Prometheus); !ok {
			if _, metrics := p.GetProvider().(*meshv1alpha1.MeshConfig_ExtensionProvider_Stackdriver); metrics {
				g.problem("Telemetry metrics: provider %q (stackdriver) is not supported; Istio's Prometheus metrics only", name)
			}
			continue
		}
		cfg := merged[name]
		sideCfg := cfg.Side(side)
		if sideCfg.Disabled {
			continue
		}
		pc := &stats.PluginConfig{
			// Inbound and gateway listeners do not fall back to the Host
			// header for the destination service (Istio's
			// disableHostHeaderFallback).
			DisableHostHeaderFallback: side == model.ServerMode || g.p.Type == model.RouterProxy,
			TcpReportingDuration:      cfg.ReportingInterval,
		}
		for _, o := range sideCfg.Overrides {
			mc := &stats.MetricConfig{Name: o.Name, Drop: o.Disabled, Dimensions: map[string]string{}}
			if n, ok := prometheusMetricName[o.Name]; ok {
				mc.Name = n
			}
			for _, t := range o.Tags {
				if t.Remove {
					mc.TagsToRemove = append(mc.TagsToRemove, t.Name)
				} else {
					mc.Dimensions[t.Name] = t.Value
				}
			}
			pc.Metrics = append(pc.Metrics, mc)
		}
		out = append(out, g.pack(pc))
	}
	if g.tel.stats == nil {
		g.tel.stats = map[model.WorkloadMode][]*anypb.Any{}
	}
	g.tel.stats[side] = out
	return out
}

// statsHTTPFilters are the HTTP stats filters of side.
func (g *gen) statsHTTPFilters(side model.WorkloadMode) []*hcmv3.HttpFilter {
	var out []*hcmv3.HttpFilter
	for _, a := range g.statsConfigs(side) {
		out = append(out, &hcmv3.HttpFilter{Name: statsFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}})
	}
	return out
}

// statsNetworkFilters are the TCP stats filters of side.
func (g *gen) statsNetworkFilters(side model.WorkloadMode) []*listenerv3.Filter {
	var out []*listenerv3.Filter
	for _, a := range g.statsConfigs(side) {
		out = append(out, &listenerv3.Filter{Name: statsFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}})
	}
	return out
}

// peerMetadataHTTPFilter is the HTTP peer-metadata exchange of side
// (Istio's SidecarInboundMetadataFilter and
// SidecarOutboundMetadataFilter): the peer's metadata from Istio's
// headers or the workload registry, and the proxy's own sent in Istio's
// headers. Gateways exchange as clients.
func (g *gen) peerMetadataHTTPFilter(side model.WorkloadMode) []*hcmv3.HttpFilter {
	if !g.client.istioTelemetry {
		return nil
	}
	dir := "upstream"
	if side == model.ServerMode {
		dir = "downstream"
	}
	discovery := []any{map[string]any{"istio_headers": map[string]any{}}, map[string]any{"workload_discovery": map[string]any{}}}
	propagation := []any{map[string]any{"istio_headers": map[string]any{}}}
	return []*hcmv3.HttpFilter{{Name: metadataExchangeFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{
		TypedConfig: g.typedStruct(peerMetadataTypeURL, map[string]any{dir + "_discovery": discovery, dir + "_propagation": propagation}),
	}}}
}

// metadataExchangeConfig is the TCP metadata exchange (Istio's
// TCPListenerMx and TCPClusterMx): over the istio-peer-exchange ALPN,
// with workload discovery.
// It is the same for every proxy: built once per push context.
func (g *gen) metadataExchangeConfig() *anypb.Any {
	return g.pc.Memo("translate|tcp-metadata-exchange", func() any {
		return g.typedStruct(metadataExchangeTCPTypeURL, map[string]any{"protocol": istioPeerExchangeALPNProtocol, "enable_discovery": true})
	}).(*anypb.Any)
}

// peerMetadataNetworkFilters is an inbound TCP chain's metadata exchange.
func (g *gen) peerMetadataNetworkFilters() []*listenerv3.Filter {
	if !g.client.istioTelemetry {
		return nil
	}
	return []*listenerv3.Filter{{Name: metadataExchangeFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: g.metadataExchangeConfig()}}}
}

// applyMetadataExchange adds the metadata exchange to an outbound
// cluster (Istio's applyMetadataExchange).
func (g *gen) applyMetadataExchange(c *clusterv3.Cluster) {
	if g.client.istioTelemetry {
		c.Filters = append(c.Filters, &clusterv3.Filter{Name: metadataExchangeFilter, TypedConfig: g.metadataExchangeConfig()})
	}
}

// typedStruct packs an untyped configuration of a type go-control-plane
// does not know (Istio's own filters) as xDS's TypedStruct.
func (g *gen) typedStruct(typeURL string, fields map[string]any) *anypb.Any {
	v, err := structpb.NewStruct(fields)
	if err != nil {
		g.packErrs++
		return &anypb.Any{TypeUrl: "type.googleapis.com/xds.type.v3.TypedStruct"}
	}
	return g.pack(&xdstypev3.TypedStruct{TypeUrl: typeURL, Value: v})
}
