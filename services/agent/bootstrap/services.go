package bootstrap

import (
	"fmt"
	"net"
	"strconv"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// The clusters of the proxy config's remote services, named as Istio's
// bootstrap names them: discovery's envoyAccessLogService access logs
// (the mesh's enableEnvoyAccessLogService) send to the second.
const (
	MetricsServiceCluster   = "envoy_metrics_service"
	AccessLogServiceCluster = proxycontract.AccessLogServiceCluster
)

// remoteServices adds to b the proxy config's envoyMetricsService (a
// cluster and Envoy's metrics_service stats sink) and
// envoyAccessLogService (a cluster), as Istio's bootstrap template does
// (pkg/bootstrap/config.go, envoy_bootstrap.json). A service whose
// address or TLS mode cannot be written is reported and left out.
func remoteServices(b *bootstrapv3.Bootstrap, pc *meshv1alpha1.ProxyConfig) ([]string, error) {
	var problems []string
	for _, s := range []struct {
		field, cluster string
		svc            *meshv1alpha1.RemoteService
	}{
		{"envoyMetricsService", MetricsServiceCluster, pc.GetEnvoyMetricsService()},
		{"envoyAccessLogService", AccessLogServiceCluster, pc.GetEnvoyAccessLogService()},
	} {
		if s.svc.GetAddress() == "" {
			continue
		}
		c, problem, err := remoteServiceCluster(s.cluster, s.svc)
		if err != nil {
			return nil, fmt.Errorf("proxy config %s: %w", s.field, err)
		}
		if problem != "" {
			problems = append(problems, fmt.Sprintf("proxy config %s: %s; the service is left out", s.field, problem))
			continue
		}
		b.StaticResources.Clusters = append(b.StaticResources.Clusters, c)
		if s.cluster != MetricsServiceCluster {
			continue
		}
		sink, err := pack(&metricsv3.MetricsServiceConfig{
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcService:         &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: MetricsServiceCluster}}},
		})
		if err != nil {
			return nil, err
		}
		b.StatsSinks = append(b.StatsSinks, &metricsv3.StatsSink{Name: "envoy.stat_sinks.metrics_service", ConfigType: &metricsv3.StatsSink_TypedConfig{TypedConfig: sink}})
	}
	return problems, nil
}

// remoteServiceCluster is Istio's template cluster for a remote gRPC
// service: STRICT_DNS, respecting DNS TTLs, 1 s connect timeout, HTTP/2,
// the keepalive and the TLS the service's settings give. problem says why
// it cannot be written (then the cluster is nil).
func remoteServiceCluster(name string, svc *meshv1alpha1.RemoteService) (*clusterv3.Cluster, string, error) {
	host, portText, err := net.SplitHostPort(svc.GetAddress())
	if err != nil {
		return nil, fmt.Sprintf("address %q is not host:port", svc.GetAddress()), nil
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Sprintf("address %q: bad port", svc.GetAddress()), nil
	}
	c := staticCluster(name, host, uint32(port))
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
	c.RespectDnsTtl = true //nolint:staticcheck // Istio's bootstrap sets it; Envoy still reads it
	c.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
	c.AltStatName = name + ";"
	if c.TypedExtensionProtocolOptions, err = http2Options(); err != nil {
		return nil, "", err
	}
	if ka := svc.GetTcpKeepalive(); ka != nil {
		c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: keepalive(ka)}
	}
	tls := svc.GetTlsSettings()
	switch tls.GetMode() {
	case networkingv1alpha3.ClientTLSSettings_DISABLE:
	case networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL:
		// Istio's tlsContextConvert: the workload certificate and the
		// mesh's roots over SDS, ALPN istio and h2, the SNI given or the
		// cluster's name.
		sni := tls.GetSni()
		if sni == "" {
			sni = name
		}
		var sans []*matcherv3.StringMatcher
		for _, s := range tls.GetSubjectAltNames() {
			sans = append(sans, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}})
		}
		ctx, err := pack(&tlsv3.UpstreamTlsContext{
			Sni: sni,
			CommonTlsContext: &tlsv3.CommonTlsContext{
				AlpnProtocols:                  []string{"istio", "h2"},
				TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(proxycontract.SecretWorkload)},
				ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
					DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchSubjectAltNames: sans}, //nolint:staticcheck // Istio's form, still read by Envoy
					ValidationContextSdsSecretConfig: sdsSecret(proxycontract.SecretRoot),
				}},
			},
		})
		if err != nil {
			return nil, "", err
		}
		c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: ctx}}
	default:
		// SIMPLE and MUTUAL name certificate files, which Istio's agent
		// serves over SDS by path; Flotilla's SDS serves the workload's
		// identity only.
		return nil, fmt.Sprintf("tlsSettings mode %s needs certificate files served over SDS, which Flotilla's agent does not do (ISTIO_MUTUAL and DISABLE are written)", tls.GetMode()), nil
	}
	return c, "", nil
}

// keepalive is Istio's keepaliveConverter: whole seconds, zero left to
// the system.
func keepalive(ka *networkingv1alpha3.ConnectionPoolSettings_TCPSettings_TcpKeepalive) *corev3.TcpKeepalive {
	out := &corev3.TcpKeepalive{}
	if ka.GetProbes() > 0 {
		out.KeepaliveProbes = wrapperspb.UInt32(ka.GetProbes())
	}
	if s := ka.GetTime().GetSeconds(); s > 0 {
		out.KeepaliveTime = wrapperspb.UInt32(uint32(min(s, 1<<31)))
	}
	if s := ka.GetInterval().GetSeconds(); s > 0 {
		out.KeepaliveInterval = wrapperspb.UInt32(uint32(min(s, 1<<31)))
	}
	return out
}

// sdsSecret is a secret of the agent's SDS server, from the source
// discovery's TLS contexts name.
func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: SDSCluster}}}},
		}},
	}}
}
