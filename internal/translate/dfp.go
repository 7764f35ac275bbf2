package translate

import (
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	dfpclusterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/dynamic_forward_proxy/v3"
	dfpcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/dynamic_forward_proxy/v3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// Envoy's dynamic forward proxy, for the wildcard hosts of ServiceEntries
// of resolution DYNAMIC_DNS: the sidecar resolves the name the client
// asked for (the HTTP Host, the TLS SNI) itself, per request, into a DNS
// cache named for the host (Istio's buildDFPCluster,
// BuildSidecarOutboundDynamicForwardProxyFilter and buildSNIDFPFilter).
// Envoy requires the filter that fills a cache and the cluster that reads
// it to name the same cache: one filter per connection manager, so one
// such host per shared HTTP port.
const (
	dfpClusterType = "envoy.clusters.dynamic_forward_proxy"
	dfpHTTPFilter  = "envoy.filters.http.dynamic_forward_proxy"
	sniDFPFilter   = "envoy.filters.network.sni_dynamic_forward_proxy"
	// dnsCacheSuffix ends a host's DNS cache name (Istio's
	// BuildDNSCacheName).
	dnsCacheSuffix = "_dfp_dns_cache"
	// statPrefixDelimiter ends an alternative stat name (Istio's
	// DelimitedStatsPrefix).
	statPrefixDelimiter = ";"
)

// dynamicDNS reports whether a service is resolved by the proxy per
// request: a wildcard host of resolution DYNAMIC_DNS (validation admits no
// other host for it).
func dynamicDNS(svc *registryv1.Service) bool {
	return svc.GetResolution() == registryv1.Resolution_RESOLUTION_DYNAMIC_DNS && strings.HasPrefix(svc.GetHostname(), "*")
}

// dfpProtocol reports whether a port of such a service gets a cluster:
// HTTP, HTTP/2, gRPC and TLS, the protocols Istio's buildOutboundClusters
// builds one for (and validation admits).
func dfpProtocol(p registryv1.Protocol) bool {
	switch p {
	case registryv1.Protocol_PROTOCOL_HTTP, registryv1.Protocol_PROTOCOL_HTTP2, registryv1.Protocol_PROTOCOL_GRPC, registryv1.Protocol_PROTOCOL_TLS:
		return true
	default:
		return false
	}
}

// dnsLookupFamily is the address family the proxy resolves in: IPv6 when
// all its addresses are IPv6, else IPv4 (Istio's SelectDNSLookupFamily,
// dual stack off).
func (g *gen) dnsLookupFamily() clusterv3.Cluster_DnsLookupFamily {
	if v4, v6 := g.addressFamilies(); v6 && !v4 {
		return clusterv3.Cluster_V6_ONLY
	}
	return clusterv3.Cluster_V4_ONLY
}

// dnsCache is the DNS cache of a host, which its cluster and filters share.
func (g *gen) dnsCache(host string) *dfpcommonv3.DnsCacheConfig {
	return &dfpcommonv3.DnsCacheConfig{Name: host + dnsCacheSuffix, DnsLookupFamily: g.dnsLookupFamily()}
}

// dfpCluster makes c a dynamic forward proxy cluster of host: the cluster
// picks the address, so no load balancer, endpoints or subsets.
func (g *gen) dfpCluster(c *clusterv3.Cluster, host string) {
	c.ClusterDiscoveryType = &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
		Name: dfpClusterType,
		TypedConfig: g.pack(&dfpclusterv3.ClusterConfig{
			ClusterImplementationSpecifier: &dfpclusterv3.ClusterConfig_DnsCacheConfig{DnsCacheConfig: g.dnsCache(host)},
		}),
	}}
	c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	c.AltStatName = c.GetName() + statPrefixDelimiter
}

// isDFPCluster reports whether c is a dynamic forward proxy cluster.
func isDFPCluster(c *clusterv3.Cluster) bool {
	return c.GetClusterType().GetName() == dfpClusterType
}

// allowInsecureDFP sets the cluster's allow_insecure_cluster_options,
// which Envoy requires of a dynamic forward proxy cluster whose TLS does
// not both send the requested host as SNI and verify the certificate
// against it (Istio's setAutoSniAndAutoSanValidation).
func (g *gen) allowInsecureDFP(c *clusterv3.Cluster) {
	cfg := &dfpclusterv3.ClusterConfig{}
	if err := c.GetClusterType().GetTypedConfig().UnmarshalTo(cfg); err != nil {
		g.problem("cluster %s: %v", c.GetName(), err)
		return
	}
	cfg.AllowInsecureClusterOptions = true
	c.GetClusterType().TypedConfig = g.pack(cfg)
}
