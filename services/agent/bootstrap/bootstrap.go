// Package bootstrap writes the Envoy bootstrap the agent starts its proxy
// with, as Istio's agent does: the node (id sidecar~IP~pod.ns~ns.svc.<domain>
// or router~…, and the metadata discovery reads), ADS through the agent's
// xDS socket, SDS through its workload socket, admin on 127.0.0.1:15000,
// Prometheus stats on :15090 (/stats/prometheus) and readiness on :15021
// (/healthz/ready, answered by the agent), and what the pod's
// proxy config sets (the zipkin tracer and its cluster, extra stat tags,
// the stats matcher, runtime values, the metrics and access log services;
// concurrency, drain duration and log flushing become Envoy's command
// line, EnvoyArgs; Unhonoured names the fields without effect). Build is
// pure
// and checks the result with go-control-plane's generated Validate.
package bootstrap

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	brotliv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/brotli/compressor/v3"
	gzipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/gzip/compressor/v3"
	zstdv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/compression/zstd/compressor/v3"
	compressorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/compressor/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Defaults: Istio's ports and paths.
const (
	XDSCluster  = "xds-grpc"
	SDSCluster  = proxycontract.SDSCluster
	AdminPort   = 15000
	AgentPort   = 15020
	HealthPort  = 15021
	StatsPort   = 15090
	XDSSocket   = "/etc/istio/proxy/XDS"
	SDSSocket   = "/var/run/secrets/workload-spiffe-uds/socket"
	ConfigPath  = "/etc/istio/proxy/envoy-rev.json"
	statsClustr = "prometheus_stats"
	agentClustr = "agent"
	zipkinClust = "zipkin"
)

// Node is who the proxy is.
type Node struct {
	// Type is proxycontract.Sidecar or proxycontract.Router (a gateway).
	Type string
	// IP is the pod's address; PodName and Namespace name it.
	IP, PodName, Namespace string
	// DomainSuffix is the cluster's DNS domain (cluster.local).
	DomainSuffix string
	// ServiceAccount, ClusterID and IstioVersion go to the metadata.
	ServiceAccount, ClusterID, IstioVersion string
	// Labels are the pod's labels.
	Labels map[string]string
	// Generator is the node's GENERATOR metadata:
	// proxycontract.GeneratorGRPC for a proxyless gRPC application, empty
	// for Envoy.
	Generator string
	// DNSCapture says the agent answers the workload's DNS (metadata
	// DNS_CAPTURE): discovery then gives it the name table and listeners
	// on the addresses allocated to ServiceEntries.
	DNSCapture bool
	// Metadata is the rest of the node's metadata, as Istio's agent passes
	// its ISTIO_META_* variables on (MetadataFromEnv); the fields above
	// take precedence over a key of the same name.
	Metadata map[string]string
}

// MetadataFromEnv is Istio's agent's node metadata from its environment
// (bootstrap.GetNodeMetaData): proxyMetadata's ISTIO_META_* entries, then
// the ISTIO_META_* variables of environ (which win), each without the
// prefix.
func MetadataFromEnv(proxyMetadata map[string]string, environ []string) map[string]string {
	const prefix = "ISTIO_META_"
	out := map[string]string{}
	for k, v := range proxyMetadata {
		if key, ok := strings.CutPrefix(k, prefix); ok && key != "" {
			out[key] = v
		}
	}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if key, isMeta := strings.CutPrefix(k, prefix); ok && isMeta && key != "" {
			out[key] = v
		}
	}
	return out
}

// ID is the node id: type~IP~pod.namespace~namespace.svc.domain.
func (n Node) ID() string {
	return proxycontract.NodeID{
		Type: n.Type, IP: n.IP,
		ID:        proxycontract.PodID(n.PodName, n.Namespace),
		DNSDomain: proxycontract.PodDNSDomain(n.Namespace, n.DomainSuffix),
	}.String()
}

func (n Node) check() error {
	var errs []error
	if n.Type != proxycontract.Sidecar && n.Type != proxycontract.Router {
		errs = append(errs, fmt.Errorf("proxy type %q: want %s or %s", n.Type, proxycontract.Sidecar, proxycontract.Router))
	}
	if net.ParseIP(n.IP) == nil {
		errs = append(errs, fmt.Errorf("pod IP %q is not an IP address (INSTANCE_IP)", n.IP))
	}
	if n.PodName == "" || n.Namespace == "" {
		errs = append(errs, errors.New("pod name and namespace are needed (POD_NAME, POD_NAMESPACE)"))
	}
	if n.DomainSuffix == "" {
		errs = append(errs, errors.New("no DNS domain suffix"))
	}
	return errors.Join(errs...)
}

// Options say what to write.
type Options struct {
	Node Node
	// ProxyConfig is the pod's proxy.istio.io/config (nil: none).
	ProxyConfig *meshv1alpha1.ProxyConfig
	// Delta makes ADS incremental (Istio's default) instead of
	// state-of-the-world.
	Delta bool
	// XDSSocket and SDSSocket are the agent's sockets (defaults above).
	XDSSocket, SDSSocket string
	// Admin is Envoy's admin address, host:port (default
	// 127.0.0.1:15000); /stats/prometheus on StatsPort reads it.
	Admin string
	// Annotations are the pod's (the downward API's file): Istio's agent
	// reads the sidecar.istio.io/stats* and extraStatTags ones into the
	// bootstrap's stats.
	Annotations map[string]string
	// StatusPort is the agent's status port on loopback (default
	// AgentPort), which /healthz/ready on HealthPort reads.
	StatusPort uint32
}

// Build returns the bootstrap, and what of the proxy config it could not
// honour (it is left out, never guessed).
func Build(o Options) (*bootstrapv3.Bootstrap, []string, error) {
	if err := o.Node.check(); err != nil {
		return nil, nil, err
	}
	o.XDSSocket = orDefault(o.XDSSocket, XDSSocket)
	o.SDSSocket = orDefault(o.SDSSocket, SDSSocket)
	adminHost, adminPortText, err := net.SplitHostPort(orDefault(o.Admin, "127.0.0.1:"+strconv.Itoa(AdminPort)))
	if err != nil {
		return nil, nil, fmt.Errorf("envoy admin address: %w", err)
	}
	adminPort, err := strconv.ParseUint(adminPortText, 10, 16)
	if err != nil {
		return nil, nil, fmt.Errorf("envoy admin address %q: bad port", o.Admin)
	}
	var problems []string
	md, err := metadata(o.Node, o.ProxyConfig)
	if err != nil {
		return nil, nil, err
	}
	api := corev3.ApiConfigSource_GRPC
	if o.Delta {
		api = corev3.ApiConfigSource_DELTA_GRPC
	}
	ads := func() *corev3.ConfigSource {
		return &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			ResourceApiVersion:    corev3.ApiVersion_V3,
			InitialFetchTimeout:   durationpb.New(0),
		}
	}
	b := &bootstrapv3.Bootstrap{
		Node:  &corev3.Node{Id: o.Node.ID(), Cluster: serviceCluster(o.Node), Metadata: md},
		Admin: &bootstrapv3.Admin{Address: socketAddress(adminHost, uint32(adminPort))},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			AdsConfig: &corev3.ApiConfigSource{
				ApiType: api, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: XDSCluster}}}},
			},
			CdsConfig: ads(),
			LdsConfig: ads(),
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{},
	}
	sr := b.StaticResources
	for _, c := range []struct{ name, path string }{{XDSCluster, o.XDSSocket}, {SDSCluster, o.SDSSocket}} {
		cl, err := grpcPipeCluster(c.name, c.path)
		if err != nil {
			return nil, nil, err
		}
		sr.Clusters = append(sr.Clusters, cl)
	}
	sr.Clusters = append(sr.Clusters,
		staticCluster(statsClustr, adminHost, uint32(adminPort)),
		staticCluster(agentClustr, "127.0.0.1", cmp.Or(o.StatusPort, AgentPort)),
	)
	pc := o.ProxyConfig
	// Istio's statsCompression (default on): the Prometheus listener
	// compresses what it serves, as the client accepts.
	statsFilters, err := statsCompressors(pc.GetStatsCompression() == nil || pc.GetStatsCompression().GetValue())
	if err != nil {
		return nil, nil, err
	}
	for _, l := range []struct {
		name, prefix, cluster string
		port                  uint32
		filters               []*hcmv3.HttpFilter
	}{
		{"prometheus", "/stats/prometheus", statsClustr, StatsPort, statsFilters},
		{"health", "/healthz/ready", agentClustr, HealthPort, nil},
	} {
		lis, err := httpListener(l.name, l.port, l.prefix, l.cluster, l.filters...)
		if err != nil {
			return nil, nil, err
		}
		sr.Listeners = append(sr.Listeners, lis)
	}
	if b.LayeredRuntime, err = runtime(pc); err != nil {
		return nil, nil, fmt.Errorf("bootstrap runtime: %w", err)
	}
	b.StatsConfig = &metricsv3.StatsConfig{StatsMatcher: statsMatcher(pc, o.Node.IP, o.Annotations)}
	problems = append(problems, statsIntervals(b, o.Annotations)...)
	remote, err := remoteServices(b, pc)
	if err != nil {
		return nil, nil, err
	}
	problems = append(problems, remote...)
	problems = append(problems, Unhonoured(pc)...)
	for _, tag := range extraStatTags(pc, o.Annotations) {
		// Istio's form: the tag's value travels in the stat name as
		// "<tag>=.=<value>;.;".
		b.StatsConfig.StatsTags = append(b.StatsConfig.StatsTags, &metricsv3.TagSpecifier{
			TagName: tag, TagValue: &metricsv3.TagSpecifier_Regex{Regex: "(" + tag + `=\.=(.*?);\.;)`},
		})
	}
	if t := pc.GetTracing(); t != nil {
		switch {
		case t.GetZipkin() != nil:
			host, port, err := net.SplitHostPort(t.GetZipkin().GetAddress())
			if err != nil {
				return nil, nil, fmt.Errorf("proxy config tracing.zipkin.address %q: %w", t.GetZipkin().GetAddress(), err)
			}
			n, err := strconv.ParseUint(port, 10, 16)
			if err != nil {
				return nil, nil, fmt.Errorf("proxy config tracing.zipkin.address %q: bad port", t.GetZipkin().GetAddress())
			}
			// As in Istio's bootstrap: the collector's cluster, and the
			// tracer of the HTTP connection managers whose tracing names
			// none (discovery sends sampling and tags only when no
			// Telemetry names a tracing provider and the mesh's
			// enableTracing is on).
			zcl := staticCluster(zipkinClust, host, uint32(n))
			zcl.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
			zcl.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
			sr.Clusters = append(sr.Clusters, zcl)
			zc, err := anypb.New(&tracev3.ZipkinConfig{
				CollectorCluster:         zipkinClust,
				CollectorEndpoint:        "/api/v2/spans",
				CollectorEndpointVersion: tracev3.ZipkinConfig_HTTP_JSON,
				TraceId_128Bit:           true,
				SharedSpanContext:        wrapperspb.Bool(false),
			})
			if err != nil {
				return nil, nil, fmt.Errorf("bootstrap tracing: %w", err)
			}
			// Deprecated in Envoy's API, still read, and what Istio's
			// bootstrap writes: the pod's own proxy config names the
			// tracer, which discovery does not see.
			b.Tracing = &tracev3.Tracing{Http: &tracev3.Tracing_Http{Name: "envoy.tracers.zipkin", ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: zc}}} //nolint:staticcheck // see above
		default:
			problems = append(problems, "proxy config tracing: only zipkin is written into the bootstrap; the tracer given is left out")
		}
	}
	if err := b.ValidateAll(); err != nil {
		return nil, nil, fmt.Errorf("bootstrap: %w", err)
	}
	return b, problems, nil
}

// EnvoyArgs is Envoy's command line for the bootstrap at configPath, with
// the proxy config's concurrency (Istio's default 2; 0 lets Envoy use
// every core), drain duration (default 45 s) and access log flushing
// (fileFlushInterval, default 1 s; fileFlushMinSizeKb), as Istio's
// envoy.Proxy.args.
func EnvoyArgs(pc *meshv1alpha1.ProxyConfig, configPath, logLevel string) []string {
	drain := 45 * time.Second
	if d := pc.GetDrainDuration(); d != nil {
		drain = d.AsDuration()
	}
	flush := time.Second
	if d := pc.GetFileFlushInterval(); d != nil {
		flush = d.AsDuration()
	}
	args := []string{
		"-c", configPath,
		"--drain-time-s", strconv.Itoa(int(drain / time.Second)),
		"--drain-strategy", "immediate",
		"--local-address-ip-version", "v4",
		"--file-flush-interval-msec", strconv.FormatInt(flush.Milliseconds(), 10),
		"--disable-hot-restart",
		"--allow-unknown-static-fields",
		"--log-level", orDefault(logLevel, "warning"),
	}
	if kb := pc.GetFileFlushMinSizeKb(); kb > 0 {
		args = append(args, "--file-flush-min-size-kb", strconv.FormatUint(uint64(kb), 10))
	}
	switch c := pc.GetConcurrency(); {
	case c == nil:
		args = append(args, "--concurrency", "2")
	case c.GetValue() > 0:
		args = append(args, "--concurrency", strconv.Itoa(int(c.GetValue())))
	}
	return args
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// serviceCluster is Istio's node cluster: the canonical service (the
// service.istio.io/canonical-name label, else app, else the pod's name)
// and namespace.
func serviceCluster(n Node) string {
	for _, k := range []string{"service.istio.io/canonical-name", "app.kubernetes.io/name", "app"} {
		if v := n.Labels[k]; v != "" {
			return v + "." + n.Namespace
		}
	}
	return n.PodName + "." + n.Namespace
}

// metadata is what discovery reads of the node, under the keys of the
// contract (Istio's node metadata).
func metadata(n Node, pc *meshv1alpha1.ProxyConfig) (*structpb.Struct, error) {
	labels := map[string]any{}
	for k, v := range n.Labels {
		labels[k] = v
	}
	fields := map[string]any{}
	for k, v := range n.Metadata {
		fields[k] = v
	}
	for k, v := range map[string]any{
		proxycontract.MetadataName:         n.PodName,
		proxycontract.MetadataNamespace:    n.Namespace,
		proxycontract.MetadataInstanceIPs:  n.IP,
		proxycontract.MetadataLabels:       labels,
		proxycontract.MetadataClusterID:    n.ClusterID,
		proxycontract.MetadataIstioVersion: n.IstioVersion,
	} {
		fields[k] = v
	}
	// What the agent does, not what its environment asked: no DNS proxy
	// (a gateway, a proxyless pod), no DNS_CAPTURE.
	delete(fields, proxycontract.MetadataDNSCapture)
	delete(fields, proxycontract.MetadataServiceAccount)
	delete(fields, proxycontract.MetadataGenerator)
	delete(fields, proxycontract.MetadataProxyConfig)
	if n.ServiceAccount != "" {
		fields[proxycontract.MetadataServiceAccount] = n.ServiceAccount
	}
	if n.Generator != "" {
		fields[proxycontract.MetadataGenerator] = n.Generator
	}
	if n.DNSCapture {
		fields[proxycontract.MetadataDNSCapture] = "true"
	}
	md, err := structpb.NewStruct(fields)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	if pc != nil {
		// The pod's proxy config, as Istio's agent sends it: what
		// discovery configures from it (a gateway's topology).
		js, err := protojson.Marshal(pc)
		if err != nil {
			return nil, fmt.Errorf("node metadata %s: %w", proxycontract.MetadataProxyConfig, err)
		}
		st := &structpb.Struct{}
		if err := protojson.Unmarshal(js, st); err != nil {
			return nil, fmt.Errorf("node metadata %s: %w", proxycontract.MetadataProxyConfig, err)
		}
		md.Fields[proxycontract.MetadataProxyConfig] = structpb.NewStructValue(st)
	}
	return md, nil
}

func socketAddress(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func staticCluster(name, host string, port uint32) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name: name, ConnectTimeout: durationpb.New(time.Second),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(host, port)}}}},
		}}},
	}
}

// grpcPipeCluster is an HTTP/2 cluster to one of the agent's Unix
// sockets.
func grpcPipeCluster(name, path string) (*clusterv3.Cluster, error) {
	h2, err := http2Options()
	if err != nil {
		return nil, err
	}
	c := staticCluster(name, "", 0)
	c.LoadAssignment.Endpoints[0].LbEndpoints[0].HostIdentifier = &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}},
	}}
	c.TypedExtensionProtocolOptions = h2
	return c, nil
}

// http2Options are a cluster's protocol options for HTTP/2 upstreams
// (gRPC services).
func http2Options() (map[string]*anypb.Any, error) {
	h2, err := pack(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		},
	}})
	if err != nil {
		return nil, err
	}
	return map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2}, nil
}

// httpListener serves one path prefix on 0.0.0.0:port from a cluster,
// through filters and the router.
func httpListener(name string, port uint32, prefix, cluster string, filters ...*hcmv3.HttpFilter) (*listenerv3.Listener, error) {
	router, err := pack(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: name, CodecType: hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{Name: "backend", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
			}}}},
		}},
		HttpFilters: append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}),
	}
	cfg, err := pack(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name: name, Address: socketAddress("0.0.0.0", port),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: cfg},
		}}}},
	}, nil
}

// statsCompressors are the compressors of Istio's Prometheus listener
// (its bootstrap template's envoy_metrics_stats_compression): brotli,
// zstd and gzip, for the content types of Envoy's stats; none when off.
func statsCompressors(on bool) ([]*hcmv3.HttpFilter, error) {
	if !on {
		return nil, nil
	}
	var out []*hcmv3.HttpFilter
	for _, c := range []struct {
		name    string
		library proto.Message
	}{
		{"brotli", &brotliv3.Brotli{}},
		{"zstd", &zstdv3.Zstd{}},
		{"gzip", &gzipv3.Gzip{}},
	} {
		lib, err := anypb.New(c.library)
		if err != nil {
			return nil, err
		}
		cfg, err := pack(&compressorv3.Compressor{
			CompressorLibrary: &corev3.TypedExtensionConfig{Name: "stats_" + c.name, TypedConfig: lib},
			ResponseDirectionConfig: &compressorv3.Compressor_ResponseDirectionConfig{CommonConfig: &compressorv3.Compressor_CommonDirectionConfig{
				ContentType: []string{"text/plain", "application/vnd.google.protobuf", "application/openmetrics-text", "application/openmetrics-protobuf"}, //nolint:staticcheck // Istio's bootstrap writes it; Envoy still reads it
			}},
		})
		if err != nil {
			return nil, err
		}
		out = append(out, &hcmv3.HttpFilter{Name: "envoy.filters.http.compressor." + c.name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: cfg}})
	}
	return out, nil
}

// pack validates a typed config (Validate does not look inside an Any)
// and packs it.
func pack(m interface {
	proto.Message
	ValidateAll() error
},
) (*anypb.Any, error) {
	if err := m.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%T: %w", m, err)
	}
	a, err := anypb.New(m)
	if err != nil {
		return nil, fmt.Errorf("%T: %w", m, err)
	}
	return a, nil
}
