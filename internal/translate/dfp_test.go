package translate

import (
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	dfpclusterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/dynamic_forward_proxy/v3"
	dfpcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/dynamic_forward_proxy/v3"
	dfphttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_forward_proxy/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	snidfpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/sni_dynamic_forward_proxy/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
)

// checkDNSCaches holds an output to what Envoy requires of its dynamic
// forward proxy, which no generated Validate() checks: a DNS cache name
// stands for one configuration wherever it appears (Envoy's
// DnsCacheManagerImpl refuses a second, different one), and a connection
// manager or a tcp_proxy that forwards to a dynamic forward proxy cluster
// has the filter of that cluster's cache before it (the filter resolves,
// the cluster only looks up) — unless a problem says which host cannot
// have it.
func checkDNSCaches(tb testing.TB, out *Output) {
	tb.Helper()
	caches := map[string]*dfpcommonv3.DnsCacheConfig{}
	see := func(where string, c *dfpcommonv3.DnsCacheConfig) {
		if prev, ok := caches[c.GetName()]; ok && !proto.Equal(prev, c) {
			tb.Errorf("%s: DNS cache %q configured twice, differently: %v and %v", where, c.GetName(), prev, c)
		}
		caches[c.GetName()] = c
	}
	clusterCache := map[string]string{}
	for _, c := range out.Clusters {
		if !isDFPCluster(c) {
			continue
		}
		cfg := &dfpclusterv3.ClusterConfig{}
		if err := c.GetClusterType().GetTypedConfig().UnmarshalTo(cfg); err != nil {
			tb.Fatalf("cluster %s: %v", c.GetName(), err)
		}
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			tb.Errorf("cluster %s: a dynamic forward proxy cluster's LB policy must be CLUSTER_PROVIDED, is %v", c.GetName(), c.GetLbPolicy())
		}
		see("cluster "+c.GetName(), cfg.GetDnsCacheConfig())
		clusterCache[c.GetName()] = cfg.GetDnsCacheConfig().GetName()
	}
	routes := map[string]*routev3.RouteConfiguration{}
	for _, rc := range out.Routes {
		routes[rc.GetName()] = rc
	}
	reported := func(cache string) bool {
		host := strings.TrimSuffix(cache, dnsCacheSuffix)
		return slices.ContainsFunc(out.Problems, func(p string) bool { return strings.Contains(p, "requests to "+host+" fail") })
	}
	for _, l := range out.Listeners {
		for _, fc := range l.GetFilterChains() {
			var sniCache string
			for _, f := range fc.GetFilters() {
				switch f.GetName() {
				case sniDFPFilter:
					cfg := &snidfpv3.FilterConfig{}
					if err := f.GetTypedConfig().UnmarshalTo(cfg); err != nil {
						tb.Fatal(err)
					}
					see("listener "+l.GetName(), cfg.GetDnsCacheConfig())
					sniCache = cfg.GetDnsCacheConfig().GetName()
				case tcpProxyFilter:
					tp := &tcpproxyv3.TcpProxy{}
					if err := f.GetTypedConfig().UnmarshalTo(tp); err != nil {
						tb.Fatal(err)
					}
					if want, ok := clusterCache[tp.GetCluster()]; ok && want != sniCache {
						tb.Errorf("listener %s chain %s: tcp_proxy to %s (cache %q) without the SNI dynamic forward proxy filter of that cache (has %q)", l.GetName(), fc.GetName(), tp.GetCluster(), want, sniCache)
					}
				case hcmFilter:
					hcm := &hcmv3.HttpConnectionManager{}
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						tb.Fatal(err)
					}
					var httpCache string
					for _, hf := range hcm.GetHttpFilters() {
						if hf.GetName() != dfpHTTPFilter {
							continue
						}
						cfg := &dfphttpv3.FilterConfig{}
						if err := hf.GetTypedConfig().UnmarshalTo(cfg); err != nil {
							tb.Fatal(err)
						}
						see("listener "+l.GetName(), cfg.GetDnsCacheConfig())
						httpCache = cfg.GetDnsCacheConfig().GetName()
					}
					rc := hcm.GetRouteConfig()
					if rds := hcm.GetRds(); rds != nil {
						rc = routes[rds.GetRouteConfigName()]
					}
					for _, vh := range rc.GetVirtualHosts() {
						for _, r := range vh.GetRoutes() {
							names := []string{r.GetRoute().GetCluster()}
							for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
								names = append(names, wc.GetName())
							}
							for _, n := range names {
								if want, ok := clusterCache[n]; ok && want != httpCache && !reported(want) {
									tb.Errorf("listener %s: route %s of %s goes to %s (cache %q), the connection manager's dynamic forward proxy filter has %q", l.GetName(), r.GetName(), rc.GetName(), n, want, httpCache)
								}
							}
						}
					}
				}
			}
		}
	}
}
