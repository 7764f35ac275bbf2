package translate

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	proxyprotocolv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/proxy_protocol/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
)

const (
	defaultConnectTimeout = 10 * time.Second
	http2Options          = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// clusterCandidates names every cluster the proxy may have: outbound
// clusters for every visible service port and DestinationRule subset
// (a DYNAMIC_DNS host has no subsets, and clusters only for the
// protocols Envoy's dynamic forward proxy serves), and its flavour's own
// (clusterNames).
func (g *gen) clusterCandidates() []string {
	var names []string
	for _, svc := range g.scope.Services() {
		dr := g.scope.DestinationRule(g.p, svc)
		for _, port := range svc.GetPorts() {
			if dynamicDNS(svc) {
				if dfpProtocol(port.GetProtocol()) {
					names = append(names, ClusterName(outbound, port.GetNumber(), "", svc.GetHostname()))
				}
				continue
			}
			names = append(names, ClusterName(outbound, port.GetNumber(), "", svc.GetHostname()))
			for _, ss := range drSpec(dr).GetSubsets() {
				if ss.GetName() != "" {
					names = append(names, ClusterName(outbound, port.GetNumber(), ss.GetName(), svc.GetHostname()))
				}
			}
		}
	}
	return append(names, g.fl.clusterNames(g)...)
}

// cluster builds, validates and remembers one cluster: nil when the proxy
// has no such cluster, or when it failed validation (reported). Outbound
// clusters are shared through the push context by every proxy that sees
// the same service through the same DestinationRule.
func (g *gen) cluster(name string) *builtCluster {
	if b, ok := g.clusters[name]; ok {
		return b
	}
	var b *builtCluster
	if portNum, subset, host, ok := ParseClusterName(name); ok {
		b = g.sharedOutbound(name, portNum, subset, host)
	} else {
		b = g.fl.localCluster(g, name)
	}
	g.clusters[name] = b
	return b
}

func (g *gen) clusterOK(name string) bool { return g.cluster(name) != nil }

func drKey(dr *model.DestinationRule) string {
	if dr == nil {
		return "-"
	}
	return dr.Namespace + "/" + dr.Name
}

// outboundKey names what an outbound cluster's content depends on besides
// the push context: its name, flavour, service and DestinationRule, and
// for a DYNAMIC_DNS host the address family the proxy resolves in.
func (g *gen) outboundKey(kind, name string, svc *registryv1.Service, dr *model.DestinationRule) string {
	key := kind + "|" + g.client.name + "|" + name + "|" + svc.GetNamespace() + "|" + drKey(dr)
	if dynamicDNS(svc) {
		key += "|" + g.dnsLookupFamily().String()
	}
	return key
}

func (g *gen) sharedOutbound(name string, portNum uint32, subset, host string) *builtCluster {
	svc := g.scope.Service(host)
	if svc == nil {
		return nil
	}
	port := servicePort(svc, portNum)
	if port == nil {
		return nil
	}
	dr := g.scope.DestinationRule(g.p, svc)
	var ss *networking.Subset
	if subset != "" {
		if ss = dr.Subset(subset); ss == nil || dynamicDNS(svc) {
			return nil
		}
	}
	v := g.pc.Memo(g.outboundKey("cluster", name, svc, dr), func() any {
		sub := g.isolated()
		var b *builtCluster
		if c := sub.outboundCluster(svc, port, dr, ss); c != nil {
			sub.applyMetadataExchange(c)
			if err := sub.valid(c, 0); err != nil {
				sub.problem("cluster %s dropped: %v", name, err)
			} else {
				b = &builtCluster{c: c, svc: svc, port: port, subset: ss, dr: dr}
				g.pc.Share(c)
			}
		}
		return &shared{value: b, problems: sub.problems}
	}).(*shared)
	for _, p := range v.problems {
		g.problem("%s", p)
	}
	b, _ := v.value.(*builtCluster)
	return b
}

// sharedBlackHole is the black hole, the same for every proxy of a push
// (sharedLocal).
func (g *gen) sharedBlackHole() *builtCluster {
	return g.sharedLocal(BlackHoleCluster, func(*gen) *clusterv3.Cluster { return blackHole() })
}

// sharedLocal is a local cluster whose content follows from key alone
// (besides the push context): built, checked and encoded once per push
// context, and the same for every proxy that asks.
func (g *gen) sharedLocal(key string, build func(*gen) *clusterv3.Cluster) *builtCluster {
	v := g.pc.Memo("local|"+key, func() any {
		sub := g.isolated()
		c := build(sub)
		if err := sub.valid(c, 0); err != nil {
			sub.problem("cluster %s dropped: %v", c.GetName(), err)
			return &shared{problems: sub.problems}
		}
		g.pc.Share(c)
		return &shared{value: &builtCluster{c: c}, problems: sub.problems}
	}).(*shared)
	for _, p := range v.problems {
		g.problem("%s", p)
	}
	b, _ := v.value.(*builtCluster)
	return b
}

// endpoints builds, validates and remembers the load assignment of an EDS
// cluster (shared like the cluster); nil when the proxy has no such EDS
// cluster.
func (g *gen) endpoints(name string) *endpointv3.ClusterLoadAssignment {
	if la, ok := g.las[name]; ok {
		return la
	}
	var la *endpointv3.ClusterLoadAssignment
	if b := g.cluster(name); b != nil && b.port != nil && b.c.GetType() == clusterv3.Cluster_EDS {
		key := g.outboundKey("eds", name, b.svc, b.dr)
		pol := EffectivePolicy(drSpec(b.dr), b.subset.GetName(), b.port.GetNumber())
		loc := g.localitySetting(pol.LoadBalancer)
		// Istio sends unhealthy endpoints (PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS,
		// on by default) unless outlier detection's minHealthPercent would
		// let Envoy's panic mode use them (supportsUnhealthyEndpoints).
		unhealthy := pol.OutlierDetection.GetMinHealthPercent() <= 0
		if !localityApplies(loc, b.c) {
			loc = nil
		} else {
			// Shaped for where the proxy runs: shared by the proxies
			// that run there.
			key += "|" + g.localityKey(loc)
		}
		v := g.pc.Memo(key, func() any {
			sub := g.isolated()
			la := sub.loadAssignment(name, b.svc, b.port, b.subset, loc, b.c.GetOutlierDetection() != nil, unhealthy)
			if err := sub.valid(la, 0); err != nil {
				sub.problem("load assignment %s dropped: %v", name, err)
				la = nil
			} else {
				g.pc.Share(la)
			}
			return &shared{value: la, problems: sub.problems}
		}).(*shared)
		for _, p := range v.problems {
			g.problem("%s", p)
		}
		la, _ = v.value.(*endpointv3.ClusterLoadAssignment)
	}
	g.las[name] = la
	return la
}

// outboundCluster builds outbound|port|subset|host, and its load assignment
// when it is an EDS cluster.
func (g *gen) outboundCluster(svc *registryv1.Service, port *registryv1.ServicePort, dr *model.DestinationRule, ss *networking.Subset) *clusterv3.Cluster {
	name := ClusterName(outbound, port.GetNumber(), ss.GetName(), svc.GetHostname())
	pol := EffectivePolicy(drSpec(dr), ss.GetName(), port.GetNumber())
	c := &clusterv3.Cluster{
		Name:           name,
		ConnectTimeout: dur(defaultConnectTimeout),
		LbPolicy:       clusterv3.Cluster_LEAST_REQUEST,
	}
	if ct := g.pc.Mesh.GetConnectTimeout(); ct != nil {
		c.ConnectTimeout = ct
	}
	c.LbPolicy = g.client.defaultLB
	switch svc.GetResolution() {
	case registryv1.Resolution_RESOLUTION_DNS, registryv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN:
		t := clusterv3.Cluster_STRICT_DNS
		if !g.client.envoyClusters || svc.GetResolution() == registryv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN {
			t = clusterv3.Cluster_LOGICAL_DNS
		}
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: t}
		c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
		if g.client.envoyClusters {
			// As Istio: the mesh's refresh rate (60 s by default), and the
			// records' TTL respected.
			c.DnsRefreshRate = dur(60 * time.Second) //nolint:staticcheck // deprecated in favour of a typed resolver config, still read
			if r := g.pc.Mesh.GetDnsRefreshRate(); r != nil {
				c.DnsRefreshRate = r //nolint:staticcheck // as above
			}
			c.RespectDnsTtl = true //nolint:staticcheck // as above
		}
		c.LoadAssignment = g.dnsLoadAssignment(name, svc, port, ss, t == clusterv3.Cluster_LOGICAL_DNS)
	case registryv1.Resolution_RESOLUTION_NONE:
		if !g.client.envoyClusters {
			g.problem("cluster %s: resolution NONE (passthrough) is not available to proxyless gRPC clients; left out", name)
			return nil
		}
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
	case registryv1.Resolution_RESOLUTION_DYNAMIC_DNS:
		switch {
		case !g.client.envoyClusters:
			g.problem("cluster %s: resolution DYNAMIC_DNS (Envoy's dynamic forward proxy) is not available to proxyless gRPC clients; left out", name)
			return nil
		case !dynamicDNS(svc) || !dfpProtocol(port.GetProtocol()):
			return nil
		}
		g.dfpCluster(c, svc.GetHostname())
	default:
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: name}
	}
	if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
		g.applyLB(c, pol.LoadBalancer)
		if g.client.envoyClusters {
			slowStart(c, pol.LoadBalancer)
		}
	}
	c.CircuitBreakers = circuitBreakers(pol.ConnectionPool, pol.RetryBudget)
	if g.client.envoyClusters {
		g.tcpKeepalive(c, pol.ConnectionPool.GetTcp().GetTcpKeepalive())
	}
	if pool := pol.ConnectionPool; pool.GetTcp().GetConnectTimeout() != nil {
		c.ConnectTimeout = pool.GetTcp().GetConnectTimeout()
	}
	if od := outlierDetection(pol.OutlierDetection); od != nil {
		c.OutlierDetection = od
		// Istio sets the panic threshold whenever outlier detection is on:
		// minHealthPercent, 0 unless set (Envoy's own default, 50 %, would
		// send traffic to ejected hosts once half are ejected).
		if mh := pol.OutlierDetection.GetMinHealthPercent(); mh >= 0 && g.client.envoyClusters {
			c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: float64(mh)}}
		}
	}
	if g.client.envoyClusters && c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED && c.GetCommonLbConfig().GetHealthyPanicThreshold() == nil {
		// Without outlier detection, Istio turns Envoy's panic mode off:
		// it sends unhealthy endpoints (PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS,
		// on by default), which panic mode would route to (Istio's
		// applyLoadBalancer, Service.SupportsUnhealthyEndpoints).
		c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}}
	}
	if g.client.envoyClusters && c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
		// Not for a cluster that picks its hosts itself (Istio's
		// applyLoadBalancer).
		localityLbConfig(c, g.localitySetting(pol.LoadBalancer))
	}
	if g.client.envoyClusters {
		if opts := httpOptions(port.GetProtocol(), pol.ConnectionPool); opts != nil {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{http2Options: g.pack(opts)}
		}
	}
	if !g.client.certProviderTLS {
		g.applyTLS(c, svc, port, ss, dr, pol.TLS)
	} else if !g.grpcClusterTLS(c, svc, port, ss, pol.TLS) {
		return nil
	}
	if !g.client.envoyClusters {
		return c
	}
	if dr != nil {
		c.Metadata = destinationRuleMetadata(dr, ss, pol.TLS)
	}
	if pp := pol.ProxyProtocol; pp != nil {
		g.upstreamProxyProtocol(c, pp)
	}
	if pol.Tunnel != nil {
		g.problem("cluster %s: trafficPolicy.tunnel is not applied (Flotilla has no tunnelling listeners); traffic goes to the destination directly", name)
	}
	return c
}

// destinationRuleMetadata names the DestinationRule an Envoy cluster
// follows, as Istio's cluster builder (buildDefaultCluster and
// buildSubsetCluster: AddConfigInfoMetadata, AddSubsetToMetadata,
// AddALPNOverrideToMetadata): the rule's path, the subset's name, and
// alpn_override "false" when the rule's own TLS (SIMPLE or MUTUAL) must
// not be given Istio's ALPN. Proxyless clusters carry none, as Istio's
// grpcgen.
func destinationRuleMetadata(dr *model.DestinationRule, ss *networking.Subset, tls *networking.ClientTLSSettings) *corev3.Metadata {
	md := configMetadata("destination-rule", dr.Namespace, dr.Name)
	f := md.GetFilterMetadata()[istioMetadata].GetFields()
	if ss != nil {
		f["subset"] = structpb.NewStringValue(ss.GetName())
	}
	if m := tls.GetMode(); m == networking.ClientTLSSettings_SIMPLE || m == networking.ClientTLSSettings_MUTUAL {
		f["alpn_override"] = structpb.NewStringValue("false")
	}
	return md
}

// slowStart ramps new endpoints' share up over the warmup window, as
// Istio's applyRoundRobinLoadBalancer and applyLeastRequestLoadBalancer:
// warmup (aggression 1 and minimum 10 % unless set) before the older
// warmupDurationSecs. Other policies have no slow start in Envoy.
func slowStart(c *clusterv3.Cluster, lb *networking.LoadBalancerSettings) {
	var cfg *clusterv3.Cluster_SlowStartConfig
	switch w := lb.GetWarmup(); {
	case w != nil:
		cfg = &clusterv3.Cluster_SlowStartConfig{
			SlowStartWindow:  w.GetDuration(),
			Aggression:       &corev3.RuntimeDouble{DefaultValue: 1, RuntimeKey: "("}, // a key no runtime has: the value stays fixed
			MinWeightPercent: &typev3.Percent{Value: 10},
		}
		if a := w.GetAggression(); a != nil {
			cfg.Aggression.DefaultValue = a.GetValue()
		}
		if m := w.GetMinimumPercent(); m != nil {
			cfg.MinWeightPercent.Value = m.GetValue()
		}
	case lb.GetWarmupDurationSecs() != nil:
		cfg = &clusterv3.Cluster_SlowStartConfig{SlowStartWindow: lb.GetWarmupDurationSecs()}
	default:
		return
	}
	switch c.GetLbPolicy() {
	case clusterv3.Cluster_ROUND_ROBIN:
		c.LbConfig = &clusterv3.Cluster_RoundRobinLbConfig_{RoundRobinLbConfig: &clusterv3.Cluster_RoundRobinLbConfig{SlowStartConfig: cfg}}
	case clusterv3.Cluster_LEAST_REQUEST:
		c.LbConfig = &clusterv3.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &clusterv3.Cluster_LeastRequestLbConfig{SlowStartConfig: cfg}}
	default:
	}
}

// tcpKeepalive sets TCP keepalive on upstream connections, as Istio's
// applyTCPKeepalive: the mesh's tcpKeepalive, each field overridden by
// the DestinationRule's; an empty setting turns keepalive on with the
// system's timings.
func (g *gen) tcpKeepalive(c *clusterv3.Cluster, dr *networking.ConnectionPoolSettings_TCPSettings_TcpKeepalive) {
	for _, ka := range []*networking.ConnectionPoolSettings_TCPSettings_TcpKeepalive{g.pc.Mesh.GetTcpKeepalive(), dr} {
		if ka == nil {
			continue
		}
		if c.UpstreamConnectionOptions == nil {
			c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: &corev3.TcpKeepalive{}}
		}
		k := c.UpstreamConnectionOptions.TcpKeepalive
		if ka.GetProbes() > 0 {
			k.KeepaliveProbes = wrapperspb.UInt32(ka.GetProbes())
		}
		if t := ka.GetTime(); t != nil {
			k.KeepaliveTime = wrapperspb.UInt32(uint32(t.GetSeconds())) //nolint:gosec // validated as a positive duration
		}
		if t := ka.GetInterval(); t != nil {
			k.KeepaliveInterval = wrapperspb.UInt32(uint32(t.GetSeconds())) //nolint:gosec // as above
		}
	}
}

// upstreamProxyProtocol sends a PROXY protocol header first on every
// upstream connection, wrapping whatever transport the cluster has (plain,
// TLS, or each auto-mTLS match), as Istio's applyUpstreamProxyProtocol.
func (g *gen) upstreamProxyProtocol(c *clusterv3.Cluster, pp *networking.TrafficPolicy_ProxyProtocol) {
	version := corev3.ProxyProtocolConfig_V1
	if pp.GetVersion() == networking.TrafficPolicy_ProxyProtocol_V2 {
		version = corev3.ProxyProtocolConfig_V2
	}
	wrap := func(inner *corev3.TransportSocket) *corev3.TransportSocket {
		if inner == nil {
			inner = &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: g.pack(&rawbufferv3.RawBuffer{})}}
		}
		return &corev3.TransportSocket{Name: "envoy.transport_sockets.upstream_proxy_protocol", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: g.pack(&proxyprotocolv3.ProxyProtocolUpstreamTransport{
			Config:          &corev3.ProxyProtocolConfig{Version: version},
			TransportSocket: inner,
		})}}
	}
	if len(c.GetTransportSocketMatches()) == 0 {
		c.TransportSocket = wrap(c.GetTransportSocket())
		return
	}
	for _, m := range c.GetTransportSocketMatches() {
		m.TransportSocket = wrap(m.GetTransportSocket())
	}
}

// drSpec is a DestinationRule's spec, nil when there is none.
func drSpec(dr *model.DestinationRule) *networking.DestinationRule {
	if dr == nil {
		return nil
	}
	return dr.Spec
}

func (g *gen) applyLB(c *clusterv3.Cluster, lb *networking.LoadBalancerSettings) {
	if lb == nil {
		return
	}
	switch s := lb.GetLbPolicy().(type) {
	case *networking.LoadBalancerSettings_Simple:
		switch s.Simple {
		case networking.LoadBalancerSettings_ROUND_ROBIN:
			c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
		case networking.LoadBalancerSettings_LEAST_REQUEST:
			c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		case networking.LoadBalancerSettings_RANDOM:
			c.LbPolicy = clusterv3.Cluster_RANDOM
			if !g.client.envoyClusters {
				g.problem("cluster %s: RANDOM load balancing is not available to proxyless gRPC clients; ROUND_ROBIN used", c.GetName())
				c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
			}
		case networking.LoadBalancerSettings_PASSTHROUGH:
			if !g.client.envoyClusters || c.GetType() != clusterv3.Cluster_EDS {
				g.problem("cluster %s: PASSTHROUGH load balancing applies to sidecars' EDS clusters only; ignored", c.GetName())
				return
			}
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
			c.EdsClusterConfig = nil
			c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		}
	case *networking.LoadBalancerSettings_ConsistentHash:
		ch := s.ConsistentHash
		if m := ch.GetMaglev(); m != nil && g.client.envoyClusters {
			c.LbPolicy = clusterv3.Cluster_MAGLEV
			if m.GetTableSize() > 0 {
				c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{TableSize: wrapperspb.UInt64(m.GetTableSize())}}
			}
			return
		}
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		size := ch.GetRingHash().GetMinimumRingSize()
		if size == 0 {
			size = ch.GetMinimumRingSize() //nolint:staticcheck // still the field older configs use
		}
		rh := &clusterv3.Cluster_RingHashLbConfig{}
		if size > 0 {
			rh.MinimumRingSize = wrapperspb.UInt64(size)
		}
		c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: rh}
	}
}

// circuitBreakers maps a connection pool to thresholds. Unset limits are
// effectively unlimited, as in Istio (Envoy's own defaults of 1024 are too
// low for a mesh).
func circuitBreakers(pool *networking.ConnectionPoolSettings, rb *networking.TrafficPolicy_RetryBudget) *clusterv3.CircuitBreakers {
	unlimited := wrapperspb.UInt32(math.MaxUint32)
	t := &clusterv3.CircuitBreakers_Thresholds{
		MaxConnections:     unlimited,
		MaxPendingRequests: unlimited,
		MaxRequests:        unlimited,
		MaxRetries:         unlimited,
		TrackRemaining:     true,
	}
	if n := pool.GetTcp().GetMaxConnections(); n > 0 {
		t.MaxConnections = wrapperspb.UInt32(uint32(n))
	}
	if n := pool.GetHttp().GetHttp1MaxPendingRequests(); n > 0 {
		t.MaxPendingRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := pool.GetHttp().GetHttp2MaxRequests(); n > 0 {
		t.MaxRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := pool.GetHttp().GetMaxRetries(); n > 0 {
		t.MaxRetries = wrapperspb.UInt32(uint32(n))
	}
	if rb != nil {
		// Istio's applyRetryBudget: 20 % and at least 3 concurrent
		// retries unless set.
		t.RetryBudget = &clusterv3.CircuitBreakers_Thresholds_RetryBudget{
			BudgetPercent:       &typev3.Percent{Value: 20},
			BudgetInterval:      rb.GetBudgetInterval(),
			MinRetryConcurrency: wrapperspb.UInt32(3),
		}
		if p := rb.GetPercent(); p != nil {
			t.RetryBudget.BudgetPercent.Value = p.GetValue()
		}
		if n := rb.GetMinRetryConcurrency(); n > 0 {
			t.RetryBudget.MinRetryConcurrency = wrapperspb.UInt32(n)
		}
	}
	return &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{t}}
}

// outlierDetection maps Istio's outlier detection: only the errors it
// names are enforced.
func outlierDetection(od *networking.OutlierDetection) *clusterv3.OutlierDetection {
	if od == nil {
		return nil
	}
	out := &clusterv3.OutlierDetection{
		Interval:                 od.GetInterval(),
		BaseEjectionTime:         od.GetBaseEjectionTime(),
		EnforcingConsecutive_5Xx: wrapperspb.UInt32(0),
		EnforcingSuccessRate:     wrapperspb.UInt32(0),
	}
	if pct := od.GetMaxEjectionPercent(); pct > 0 {
		out.MaxEjectionPercent = wrapperspb.UInt32(uint32(pct))
	}
	if v := od.GetConsecutive_5XxErrors(); v != nil {
		out.Consecutive_5Xx = wrapperspb.UInt32(v.GetValue())
		if v.GetValue() > 0 {
			out.EnforcingConsecutive_5Xx = wrapperspb.UInt32(100)
		}
	}
	if v := od.GetConsecutiveGatewayErrors(); v != nil {
		out.ConsecutiveGatewayFailure = wrapperspb.UInt32(v.GetValue())
		if v.GetValue() > 0 {
			out.EnforcingConsecutiveGatewayFailure = wrapperspb.UInt32(100)
		}
	}
	if od.GetSplitExternalLocalOriginErrors() {
		out.SplitExternalLocalOriginErrors = true
		if v := od.GetConsecutiveLocalOriginFailures(); v != nil {
			out.ConsecutiveLocalOriginFailure = wrapperspb.UInt32(v.GetValue())
			out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(100)
		}
	}
	return out
}

// httpOptions are a sidecar cluster's HTTP protocol options, as Istio's
// setUpstreamProtocol and applyConnectionPool: HTTP/2 upstream for HTTP/2
// and gRPC ports (or when the pool asks to upgrade an HTTP port), the
// downstream's protocol for sniffed ports and useClientProtocol (h2c in,
// HTTP/2 out), and the pool's per-connection limits. Nil when there is
// nothing to set: Envoy then speaks HTTP/1.1.
func httpOptions(proto registryv1.Protocol, pool *networking.ConnectionPoolSettings) *httpv3.HttpProtocolOptions {
	h := pool.GetHttp()
	common := &corev3.HttpProtocolOptions{}
	set := false
	if t := cmp.Or(h.GetIdleTimeout(), pool.GetTcp().GetIdleTimeout()); t != nil {
		// Istio's applyConnectionPool: the HTTP idle timeout, else the
		// TCP one.
		common.IdleTimeout = t
		set = true
	}
	if n := h.GetMaxRequestsPerConnection(); n > 0 {
		common.MaxRequestsPerConnection = wrapperspb.UInt32(uint32(n))
		set = true
	}
	if d := pool.GetTcp().GetMaxConnectionDuration(); d != nil {
		common.MaxConnectionDuration = d
		set = true
	}
	h2 := isHTTP2(proto) || (h.GetH2UpgradePolicy() == networking.ConnectionPoolSettings_HTTPSettings_UPGRADE && isHTTP(proto))
	downstream := !h2 && (sniffed(proto) || h.GetUseClientProtocol())
	if !h2 && !downstream && !set {
		return nil
	}
	opts := &httpv3.HttpProtocolOptions{}
	if set {
		opts.CommonHttpProtocolOptions = common
	}
	http2 := &corev3.Http2ProtocolOptions{}
	if n := h.GetMaxConcurrentStreams(); n > 0 {
		http2.MaxConcurrentStreams = wrapperspb.UInt32(uint32(n))
	}
	if ka := h.GetHttp2KeepAlive(); ka != nil && h2 {
		http2.ConnectionKeepalive = &corev3.KeepaliveSettings{Interval: ka.GetInterval(), Timeout: ka.GetTimeout()}
	}
	switch {
	case h2:
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: http2},
		}}
	case downstream:
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_UseDownstreamProtocolConfig{UseDownstreamProtocolConfig: &httpv3.HttpProtocolOptions_UseDownstreamHttpConfig{
			HttpProtocolOptions:  &corev3.Http1ProtocolOptions{},
			Http2ProtocolOptions: http2,
		}}
	default:
		// Only limits to set: the protocol stays HTTP/1.1, said explicitly
		// (Envoy requires one of the protocol choices).
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}},
		}}
	}
	return opts
}

// applyTLS sets the upstream transport socket: the DestinationRule's TLS
// mode when it has one, else auto mTLS (mTLS to endpoints labelled as
// running a sidecar, plaintext to the rest). A dynamic forward proxy
// cluster has no fixed SNI: mesh mTLS to it sends the requested host, as
// originated TLS does (Istio's buildUpstreamTLSContext).
func (g *gen) applyTLS(c *clusterv3.Cluster, svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset, dr *model.DestinationRule, tls *networking.ClientTLSSettings) {
	sni := "outbound_." + itoa(port.GetNumber()) + "_." + ss.GetName() + "_." + svc.GetHostname()
	dfp := isDFPCluster(c)
	if dfp {
		sni = ""
	}
	h2 := isHTTP2(port.GetProtocol())
	if tls == nil {
		if !g.pc.AutoMTLS() || svc.GetLocation() == registryv1.Location_LOCATION_MESH_EXTERNAL {
			return
		}
		if dfp {
			g.autoSNI(c, &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL})
		}
		c.TransportSocketMatches = []*clusterv3.Cluster_TransportSocketMatch{
			{
				Name:            "tlsMode-istio",
				Match:           &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue(tlsModeIstio)}},
				TransportSocket: g.istioMutual(g.spiffeSANs(svc), sni, h2),
			},
			{
				Name:            "tlsMode-disabled",
				Match:           &structpb.Struct{},
				TransportSocket: &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: g.pack(&rawbufferv3.RawBuffer{})}},
			},
		}
		return
	}
	switch tls.GetMode() {
	case networking.ClientTLSSettings_DISABLE:
	case networking.ClientTLSSettings_ISTIO_MUTUAL:
		// As Istio's buildUpstreamTLSSettings: the rule's sni and
		// subjectAltNames replace the computed ones when set (useful
		// when routing through gateways).
		sans := g.spiffeSANs(svc)
		if names := tls.GetSubjectAltNames(); len(names) > 0 {
			sans = sanMatchers(names)
		}
		c.TransportSocket = g.istioMutual(sans, cmp.Or(tls.GetSni(), sni), h2)
		if dfp {
			g.autoSNI(c, tls)
		}
	case networking.ClientTLSSettings_SIMPLE, networking.ClientTLSSettings_MUTUAL:
		if privilegedCredential(tls.GetCredentialName()) && len(drSpec(dr).GetWorkloadSelector().GetMatchLabels()) == 0 {
			// Istio's rule (buildUpstreamClusterTLSContext): a sidecar takes
			// a credentialName only from a DestinationRule with a
			// workloadSelector, so that a Secret is not handed to every
			// sidecar the rule reaches; otherwise the cluster gets no TLS.
			g.problem("cluster %s: credentialName %q applies to sidecars only in a DestinationRule with a workloadSelector (as in Istio); TLS not originated", c.GetName(), tls.GetCredentialName())
			return
		}
		c.TransportSocket = g.originatedTLS(c.GetName(), tls, h2)
		g.autoSNI(c, tls)
	}
}

// privilegedCredential is whether a credentialName needs the proxy to be
// allowed a Secret: every one but a ConfigMap's CA, which is public
// (Istio's privilegedCredentialLookup), and the invalid one a Gateway API
// policy gives, which no proxy is served (Istio lets a sidecar send
// plain text there; Flotilla keeps the TLS, so that the traffic is
// refused as the policy's status says).
func privilegedCredential(cn string) bool {
	return cn != "" && !strings.HasPrefix(cn, registry.ConfigMapCredentialPrefix) && !strings.HasPrefix(cn, registry.InvalidCredentialPrefix)
}

// autoSNI sets what Istio's setAutoSniAndAutoSanValidation sets for TLS
// the sidecar originates: without an sni, the request's Host is sent as
// SNI (auto_sni), and, with no subjectAltNames either and verification
// on, the server certificate must match that Host (auto_san_validation).
// Both are HTTP options; TCP traffic is unaffected, as in Istio. A dynamic
// forward proxy cluster validates against the Host whenever verification
// is on, and is allowed to do less only by allow_insecure_cluster_options.
func (g *gen) autoSNI(c *clusterv3.Cluster, tls *networking.ClientTLSSettings) {
	insecure := tls.GetInsecureSkipVerify().GetValue()
	autoSNI := tls.GetSni() == ""
	autoSAN := autoSNI && len(tls.GetSubjectAltNames()) == 0 && !insecure
	if isDFPCluster(c) {
		autoSAN = !insecure
		if !autoSNI || !autoSAN {
			g.allowInsecureDFP(c)
		}
	}
	if !autoSNI && !autoSAN {
		return
	}
	opts := &httpv3.HttpProtocolOptions{}
	if a := c.GetTypedExtensionProtocolOptions()[http2Options]; a != nil {
		if err := a.UnmarshalTo(opts); err != nil {
			g.problem("cluster %s: %v", c.GetName(), err)
			return
		}
	}
	if opts.UpstreamProtocolOptions == nil {
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}},
		}}
	}
	opts.UpstreamHttpProtocolOptions = &corev3.UpstreamHttpProtocolOptions{AutoSni: autoSNI, AutoSanValidation: autoSAN}
	if c.TypedExtensionProtocolOptions == nil {
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{}
	}
	c.TypedExtensionProtocolOptions[http2Options] = g.pack(opts)
}

// istioMutual is mesh mTLS: the workload certificate and root from the
// agent over SDS, and the server must present one of sans. HTTP/2
// clusters also offer h2 (Istio's ALPNInMeshH2WithMxc).
func (g *gen) istioMutual(sans []*tlsv3.SubjectAltNameMatcher, sni string, h2 bool) *corev3.TransportSocket {
	alpn := []string{"istio-peer-exchange", "istio"}
	if h2 {
		alpn = append(alpn, "h2")
	}
	ctx := &tlsv3.UpstreamTlsContext{
		Sni: sni,
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsParams:                      upstreamTLSParams(),
			AlpnProtocols:                  alpn,
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: SecretWorkload, SdsConfig: sdsSource()}},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sans},
				ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: SecretRoot, SdsConfig: sdsSource()},
			}},
		},
	}
	return g.tlsSocket(ctx)
}

// spiffeIDs are the identities a service's servers may present: those
// the service declares, else the service accounts of its endpoints; each
// SPIFFE ID also in every trust domain alias of the mesh, so that a
// server whose certificate is still (or already) of another trust domain
// is accepted during a migration (Istio's addServiceAccounts,
// spiffe.ExpandWithTrustDomains).
func (g *gen) spiffeIDs(svc *registryv1.Service) []string {
	ids := slices.Clone(svc.GetSubjectAltNames())
	if len(ids) == 0 {
		for _, ep := range g.pc.Endpoints(svc) {
			if sa := ep.GetServiceAccount(); sa != "" {
				ns := ep.GetWorkloadNamespace()
				if ns == "" {
					ns = svc.GetNamespace()
				}
				ids = append(ids, spiffe.ID{TrustDomain: g.pc.TrustDomain, Namespace: ns, ServiceAccount: sa}.String())
			}
		}
	}
	if aliases := g.pc.Mesh.GetTrustDomainAliases(); len(aliases) > 0 {
		for _, s := range slices.Clone(ids) {
			id, err := spiffe.Parse(s)
			if err != nil {
				continue // not a SPIFFE ID (a DNS name): kept as it is
			}
			for _, td := range aliases {
				id.TrustDomain = td
				ids = append(ids, id.String())
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// spiffeSANs matches the server's URI SAN against spiffeIDs.
func (g *gen) spiffeSANs(svc *registryv1.Service) []*tlsv3.SubjectAltNameMatcher {
	return sanMatchers(g.spiffeIDs(svc))
}

// upstreamTLSParams are Istio's for TLS a sidecar originates: 1.2 up to
// 1.3 (Envoy's client default stops at 1.2).
func upstreamTLSParams() *tlsv3.TlsParameters {
	return &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3}
}

// SystemRoots is the CA bundle a sidecar verifies servers with when a
// DestinationRule names none (Istio verifies against the system's roots,
// VERIFY_CERTIFICATE_AT_CLIENT): the bundle's place in the proxy image.
const SystemRoots = "/etc/ssl/certs/ca-certificates.crt"

// originatedTLS is TLS the sidecar originates to a server outside the
// mesh, as Istio's constructUpstreamTLS: the server verified against
// caCertificates (else the system's roots), its certificate revocation
// list and subjectAltNames, unless insecureSkipVerify; client
// certificates from files (MUTUAL) or from the credentialName Secret over
// SDS; the mesh's tlsDefaults; h2 offered on HTTP/2 clusters.
func (g *gen) originatedTLS(cluster string, tls *networking.ClientTLSSettings, h2 bool) *corev3.TransportSocket {
	common := &tlsv3.CommonTlsContext{TlsParams: upstreamTLSParams()}
	if h2 {
		common.AlpnProtocols = []string{"h2"}
	}
	if d := g.pc.Mesh.GetTlsDefaults(); d != nil {
		common.TlsParams.EcdhCurves = d.GetEcdhCurves()
		common.TlsParams.CipherSuites = d.GetCipherSuites()
	}
	validation := &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sanMatchers(tls.GetSubjectAltNames())}
	if crl := tls.GetCaCrl(); crl != "" {
		validation.Crl = &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: crl}}
	}
	if cred := tls.GetCredentialName(); cred != "" {
		// The Secret is served over ADS by discovery (sds.go), as Istio's
		// ApplyCustomSDSToClientCommonTLSContext: its certificate and key
		// for MUTUAL only, "<name>-cacert" (its CA) to verify the server.
		if tls.GetMode() == networking.ClientTLSSettings_MUTUAL {
			common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{{Name: credentialSDSName(cred), SdsConfig: adsSource()}}
		}
		if tls.GetInsecureSkipVerify().GetValue() {
			common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}}
		} else {
			common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         validation,
				ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: credentialSDSName(cred + credentialCASuffix), SdsConfig: adsSource()},
			}}
		}
		return g.tlsSocket(&tlsv3.UpstreamTlsContext{Sni: tls.GetSni(), CommonTlsContext: common})
	}
	if tls.GetMode() == networking.ClientTLSSettings_MUTUAL {
		common.TlsCertificates = []*tlsv3.TlsCertificate{{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: tls.GetClientCertificate()}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: tls.GetPrivateKey()}},
		}}
	}
	if tls.GetInsecureSkipVerify().GetValue() {
		validation = &tlsv3.CertificateValidationContext{}
	} else {
		validation.TrustedCa = &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: cmp.Or(tls.GetCaCertificates(), SystemRoots)}}
	}
	common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: validation}
	return g.tlsSocket(&tlsv3.UpstreamTlsContext{Sni: tls.GetSni(), CommonTlsContext: common})
}

func blackHole() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 BlackHoleCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       dur(defaultConnectTimeout),
	}
}

// unknownTarget is where traffic to destinations the mesh does not know
// goes, per outboundTrafficPolicy: its original destination (ALLOW_ANY),
// or the egressProxy's cluster when the Sidecar names one (Istio's
// GetDestinationCluster of it: "outbound|<port>|<subset>|<host>"), or
// nowhere (REGISTRY_ONLY).
func (g *gen) unknownTarget() string {
	if !g.scope.AllowAny() {
		return BlackHoleCluster
	}
	sc := g.scope.Sidecar
	if sc == nil {
		return PassthroughCluster
	}
	ep := sc.Spec.GetOutboundTrafficPolicy().GetEgressProxy()
	if ep == nil {
		return PassthroughCluster
	}
	host := model.ResolveHost(ep.GetHost(), sc.Namespace, g.pc.DomainSuffix)
	name := ClusterName(outbound, ep.GetPort().GetNumber(), ep.GetSubset(), host)
	if g.cluster(name) == nil {
		g.problem("Sidecar %s/%s: outboundTrafficPolicy.egressProxy %s is not a cluster this proxy has; unknown destinations pass through directly", sc.Namespace, sc.Name, name)
		return PassthroughCluster
	}
	return name
}

// grpcClusterTLS sets a proxyless client's upstream TLS, and reports
// false when the cluster must be left out. grpc-go's xDS credentials read
// certificate provider instances only (gRFC A29), and no transport socket
// matches, so TLS is decided for the whole cluster:
//
//   - ISTIO_MUTUAL: mesh mTLS with the agent's certificate provider, the
//     server held to the service's SPIFFE identities (Istio's grpcgen does
//     the same);
//   - DISABLE: plaintext;
//   - SIMPLE and MUTUAL name files or Secrets grpc-go cannot use: the
//     cluster is left out (reported) rather than sent in plaintext;
//   - no TLS setting, with auto mTLS on: mTLS when every endpoint of the
//     cluster runs in the mesh (tlsMode istio) and accepts mTLS only on
//     its port (STRICT), else plaintext. Istio's grpcgen leaves proxyless
//     clients in plaintext unless a DestinationRule says ISTIO_MUTUAL;
//     Flotilla goes as far as is safe: a STRICT port refuses plaintext,
//     and a PERMISSIVE proxyless server serves plaintext only
//     (grpcInbound), so mTLS anywhere else could fail.
func (g *gen) grpcClusterTLS(c *clusterv3.Cluster, svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset, tls *networking.ClientTLSSettings) bool {
	switch {
	case tls == nil:
		if !g.pc.AutoMTLS() || svc.GetLocation() == registryv1.Location_LOCATION_MESH_EXTERNAL || !g.strictMeshEndpoints(svc, port, ss) {
			return true
		}
	case tls.GetMode() == networking.ClientTLSSettings_DISABLE:
		return true
	case tls.GetMode() != networking.ClientTLSSettings_ISTIO_MUTUAL:
		g.problem("cluster %s: TLS mode %s is not available to proxyless gRPC clients (they read certificate providers only); left out", c.GetName(), tls.GetMode())
		return false
	}
	c.TransportSocket = g.tlsSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: grpcCommonTLS(g.spiffeIDs(svc))})
	return true
}

// strictMeshEndpoints reports whether the cluster of port (and subset)
// has endpoints and all of them are mesh workloads whose port accepts
// mTLS only, by the PeerAuthentication selecting each workload.
func (g *gen) strictMeshEndpoints(svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset) bool {
	n := 0
	for _, ep := range g.pc.Endpoints(svc) {
		if !model.LabelsMatch(ss.GetLabels(), ep.GetLabels()) {
			continue
		}
		target, ok := endpointPort(ep, port)
		if !ok {
			continue
		}
		ns := ep.GetWorkloadNamespace()
		if ns == "" {
			ns = svc.GetNamespace()
		}
		if ep.GetTlsMode() != registryv1.TLSMode_TLS_MODE_ISTIO || g.pc.WorkloadMTLS(ns, ep.GetLabels(), target) != model.Strict {
			return false
		}
		n++
	}
	return n > 0
}

// grpcCommonTLS names the agent's certificate provider for the workload
// certificate and the roots, and holds the peer to one of sans (none on
// the server side, where grpc-go refuses SAN matchers).
func grpcCommonTLS(sans []string) *tlsv3.CommonTlsContext {
	validation := &tlsv3.CertificateValidationContext{
		CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: GRPCCertProvider, CertificateName: grpcRootName},
	}
	for _, id := range sans {
		// grpc-go reads match_subject_alt_names, not the typed field
		// Envoy prefers; it matches the string against the URI SANs.
		validation.MatchSubjectAltNames = append(validation.MatchSubjectAltNames, //nolint:staticcheck // the field grpc-go reads
			&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}})
	}
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: GRPCCertProvider, CertificateName: grpcCertName},
		ValidationContextType:          &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: validation},
	}
}
