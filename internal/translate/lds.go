package translate

import (
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	dfphttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_forward_proxy/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	snidfpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/sni_dynamic_forward_proxy/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// httpFilters are the HTTP filters whose per-route settings routes may
// carry, the side's stats filters, then the router: fault, then CORS for
// sidecars (Istio's order; grpc-go would reject a listener naming the
// CORS filter, so proxyless clients get fault and router only). The
// router adds Envoy's x-envoy-* headers unless suppressDebug (the proxy
// headers' envoyDebugHeaders disabled).
func (g *gen) httpFilters(side model.WorkloadMode, suppressDebug bool) []*hcmv3.HttpFilter {
	fs := []*hcmv3.HttpFilter{{Name: faultFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&faultv3.HTTPFault{})}}}
	if g.client.envoyHTTP {
		fs = append(fs, &hcmv3.HttpFilter{Name: corsFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&corsv3.Cors{})}})
	}
	fs = append(fs, g.statsHTTPFilters(side)...)
	return append(fs, &hcmv3.HttpFilter{Name: routerFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&routerv3.Router{SuppressEnvoyHeaders: suppressDebug})}})
}

// httpConnectionManager is the connection manager of an outbound or a
// gateway listener's port (0: none) routing by RDS, with the workload's
// authorization w (nil: none, outbound) and the extensions of the port.
func (g *gen) httpConnectionManager(statPrefix, routeName string, port uint32, w *workloadAuthz) *hcmv3.HttpConnectionManager {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: routeName,
		}},
		HttpFilters: slices.Concat(g.peerMetadataHTTPFilter(model.ClientMode), g.policyHTTPFilters(w, model.ClientMode, port), g.httpFilters(model.ClientMode, g.proxyHeaders(outboundClass).suppressDebug)),
		AccessLog:   g.accessLogs(model.ClientMode, httpLog),
	}
	if g.client.envoyHTTP {
		g.sidecarHCM(hcm, outboundClass)
	}
	g.setTracing(hcm, model.ClientMode)
	return hcm
}

// sidecarHCM sets what Istio's buildHTTPConnectionManager sets on every
// sidecar HTTP connection manager: websocket upgrades allowed, no stream
// idle timeout (Envoy's 5-minute default would reset long-lived gRPC
// streams), paths normalised per the mesh's pathNormalization (by default
// normalised, escaped slashes kept), the client's address not trusted from the
// connection (use_remote_address false, inbound and outbound),
// 100-continue answered by the proxy (ENABLE_100_CONTINUE_HEADERS, on by
// default), and the proxy headers of its class (proxyHeaders).
func (g *gen) sidecarHCM(hcm *hcmv3.HttpConnectionManager, class headerClass) {
	hcm.UpgradeConfigs = []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}}
	hcm.StreamIdleTimeout = dur(0)
	hcm.NormalizePath = wrapperspb.Bool(true)
	hcm.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	switch g.pc.Mesh.GetPathNormalization().GetNormalization() {
	case meshv1alpha1.MeshConfig_ProxyPathNormalization_NONE:
		hcm.NormalizePath = wrapperspb.Bool(false)
	case meshv1alpha1.MeshConfig_ProxyPathNormalization_MERGE_SLASHES:
		hcm.MergeSlashes = true
	case meshv1alpha1.MeshConfig_ProxyPathNormalization_DECODE_AND_MERGE_SLASHES:
		hcm.MergeSlashes = true
		hcm.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD
	default: // DEFAULT and BASE
	}
	hcm.UseRemoteAddress = wrapperspb.Bool(false)
	hcm.Proxy_100Continue = true
	ph := g.proxyHeaders(class)
	hcm.ServerName, hcm.ServerHeaderTransformation = ph.serverName, ph.serverTransformation
	hcm.GenerateRequestId = ph.requestID
	hcm.AppendXForwardedPort = ph.xForwardedPort
}

// tcpProxy forwards a connection to clusters; side is whether the
// proxy is its client (outbound, gateways) or its server (inbound), for
// its access logs.
func (g *gen) tcpProxy(side model.WorkloadMode, statPrefix string, clusters []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight) *listenerv3.Filter {
	tp := &tcpproxyv3.TcpProxy{StatPrefix: statPrefix, AccessLog: g.accessLogs(side, tcpLog)}
	if len(clusters) == 1 {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_Cluster{Cluster: clusters[0].GetName()}
	} else {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_WeightedClusters{WeightedClusters: &tcpproxyv3.TcpProxy_WeightedCluster{Clusters: clusters}}
	}
	return g.networkFilter(tcpProxyFilter, tp)
}

// tcpForward is a TCP proxy to clusters after the side's stats filters
// (Istio's buildMetricsNetworkFilters before the tcp_proxy).
func (g *gen) tcpForward(side model.WorkloadMode, statPrefix string, clusters []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight) []*listenerv3.Filter {
	return append(slices.Clip(g.statsNetworkFilters(side)), g.tcpProxy(side, statPrefix, clusters))
}

// blackHoleFilters drop a connection to a capture listener's own port,
// which would loop: no access log, as Istio's blackhole chains; the
// outbound one counts it in the stats (Istio's blackholeFilterChain), the
// inbound one does not.
func (g *gen) blackHoleFilters(side model.WorkloadMode) []*listenerv3.Filter {
	tp := g.networkFilter(tcpProxyFilter, &tcpproxyv3.TcpProxy{StatPrefix: BlackHoleCluster, ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: BlackHoleCluster}})
	if side == model.ServerMode {
		return []*listenerv3.Filter{tp}
	}
	return append(slices.Clip(g.statsNetworkFilters(side)), tp)
}

// virtualOutbound receives everything the pod sends (iptables) and hands
// each connection to the listener of its original destination; what no
// listener claims is passed through or dropped per outboundTrafficPolicy.
func (g *gen) virtualOutbound() *listenerv3.Listener {
	catchAll := g.unknownTarget()
	return &listenerv3.Listener{
		Name:             VirtualOutbound,
		Address:          socketAddress("0.0.0.0", OutboundPort),
		UseOriginalDst:   wrapperspb.Bool(true),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		AccessLog:        g.accessLogs(model.ClientMode, listenerLog),
		FilterChains: []*listenerv3.FilterChain{
			{
				// A connection to the listener's own port would loop (Istio's
				// virtualOutbound-blackhole).
				Name:             "virtualOutbound-blackhole",
				FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(OutboundPort)},
				Filters:          g.blackHoleFilters(model.ClientMode),
			},
			{
				Name:    "virtualOutbound-catchall-tcp",
				Filters: g.tcpForward(model.ClientMode, catchAll, single(catchAll)),
			},
		},
	}
}

func (g *gen) inboundChains(port uint32, proto registryv1.Protocol) []*listenerv3.FilterChain {
	if sniffed(proto) {
		return g.inboundSniffedChains(port)
	}
	cluster := ClusterName(inbound, port, "", "")
	filters := func() []*listenerv3.Filter {
		if !isHTTP(proto) {
			return g.inboundTCP(port, cluster)
		}
		return []*listenerv3.Filter{g.networkFilter(hcmFilter, g.inboundHCM(port))}
	}
	match := func(transport string) *listenerv3.FilterChainMatch {
		return &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port), TransportProtocol: transport}
	}
	mtls := &listenerv3.FilterChain{
		Name:             "inbound|" + itoa(port) + "|mtls",
		FilterChainMatch: match("tls"),
		Filters:          filters(),
		TransportSocket:  g.downstreamMTLS(proto),
	}
	plain := &listenerv3.FilterChain{Name: "inbound|" + itoa(port) + "|plaintext", FilterChainMatch: match("raw_buffer"), Filters: filters()}
	switch g.pc.InboundMTLS(g.p, port) {
	case model.Strict:
		return []*listenerv3.FilterChain{mtls}
	case model.Disable:
		plain.FilterChainMatch.TransportProtocol = ""
		return []*listenerv3.FilterChain{plain}
	default:
		// PERMISSIVE, as Istio's getFilterChainMatchOptions: mesh mTLS is
		// told apart by its ALPN; other TLS (the application's own) goes
		// to the application untouched, plaintext as plaintext.
		mtls.FilterChainMatch.ApplicationProtocols = istioMTLSALPN()
		tls := &listenerv3.FilterChain{
			Name:             "inbound|" + itoa(port) + "|tls",
			FilterChainMatch: match("tls"),
			Filters:          g.inboundTCP(port, cluster),
		}
		return []*listenerv3.FilterChain{mtls, tls, plain}
	}
}

// inboundSniffedChains serve a port of no declared protocol, as Istio's
// inbound "auto" filter chain options: HTTP (plaintext as the HTTP
// inspector reports it, or mesh mTLS whose ALPN says the client sent
// HTTP) goes through the HTTP connection manager, everything else through
// tcp_proxy, under the port's mTLS mode.
func (g *gen) inboundSniffedChains(port uint32) []*listenerv3.FilterChain {
	p := itoa(port)
	return g.sniffedChains(port, ClusterName(inbound, port, "", ""), g.pc.InboundMTLS(g.p, port), func(name string, _ bool) string { return "inbound|" + p + "|" + name })
}

// inboundPassthroughChains are virtualInbound's catch-all chains for
// ports no service of the workload names, as Istio's
// buildInboundPassthroughChains: the same chains as a sniffed port's
// (HTTP, detected by the HTTP inspector or the mesh client's ALPN, through
// a connection manager; the rest through tcp_proxy), for any port, to
// InboundPassthroughCluster, under the workload's mTLS mode; named as
// Istio names them ("virtualInbound-catchall-http" for HTTP,
// "virtualInbound" for TCP).
func (g *gen) inboundPassthroughChains() []*listenerv3.FilterChain {
	return g.sniffedChains(0, InboundPassthroughCluster, g.pc.InboundMTLS(g.p, 0), func(_ string, http bool) string {
		if http {
			return VirtualInbound + "-catchall-http"
		}
		return VirtualInbound
	})
}

// sniffedChains are the chains of a port of no declared protocol (0: any
// port) to cluster, under the mTLS mode, named by name (the variant,
// and whether the chain is HTTP).
func (g *gen) sniffedChains(port uint32, cluster string, mode model.MTLSMode, name func(variant string, http bool) string) []*listenerv3.FilterChain {
	var dst *wrapperspb.UInt32Value
	if port != 0 {
		dst = wrapperspb.UInt32(port)
	}
	chain := func(variant, transport string, alpn []string, http bool, mtls registryv1.Protocol) *listenerv3.FilterChain {
		fc := &listenerv3.FilterChain{
			Name:             name(variant, http),
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: dst, TransportProtocol: transport, ApplicationProtocols: alpn},
			Filters:          g.inboundTCP(port, cluster),
		}
		if http {
			fc.Filters = []*listenerv3.Filter{g.networkFilter(hcmFilter, g.inboundHCMTo(port, cluster))}
		}
		if mtls != registryv1.Protocol_PROTOCOL_UNSPECIFIED {
			fc.TransportSocket = g.downstreamMTLS(mtls)
		}
		return fc
	}
	const none = registryv1.Protocol_PROTOCOL_UNSPECIFIED
	mtlsHTTP := chain("mtls-http", "tls", istioMTLSHTTPALPN(), true, registryv1.Protocol_PROTOCOL_HTTP)
	plainHTTP := chain("plaintext-http", "raw_buffer", plaintextHTTPALPN(), true, none)
	plainTCP := chain("plaintext", "raw_buffer", nil, false, none)
	switch mode {
	case model.Strict:
		return []*listenerv3.FilterChain{mtlsHTTP, chain("mtls", "tls", nil, false, registryv1.Protocol_PROTOCOL_TCP)}
	case model.Disable:
		return []*listenerv3.FilterChain{plainHTTP, plainTCP}
	default:
		return []*listenerv3.FilterChain{
			mtlsHTTP, plainHTTP,
			chain("mtls", "tls", []string{"istio-peer-exchange", "istio"}, false, registryv1.Protocol_PROTOCOL_TCP),
			plainTCP,
			chain("tls", "tls", nil, false, none),
		}
	}
}

// inboundTCP are the filters of an inbound TCP chain of a port (0:
// virtualInbound's catch-all): the peer metadata exchange, the
// workload's authorization and the port's extensions, then stats and
// tcp_proxy to cluster (Istio's buildInboundNetworkFilters).
func (g *gen) inboundTCP(port uint32, cluster string) []*listenerv3.Filter {
	return slices.Concat(g.peerMetadataNetworkFilters(), g.policyNetworkFilters(g.workloadAuthz(), model.ServerMode, port), g.tcpForward(model.ServerMode, cluster, single(cluster)))
}

// inboundHCM routes everything a port receives to the application, after
// the workload's authorization.
func (g *gen) inboundHCM(port uint32) *hcmv3.HttpConnectionManager {
	return g.inboundHCMTo(port, ClusterName(inbound, port, "", ""))
}

// inboundHCMTo routes everything to cluster (port 0: virtualInbound's
// catch-all), as Istio's buildSidecarInboundHTTPRouteConfig.
func (g *gen) inboundHCMTo(port uint32, cluster string) *hcmv3.HttpConnectionManager {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: cluster,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: cluster,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound|http|" + itoa(port),
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Name:   "default",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}, Timeout: dur(0)}},
				}},
			}},
			ValidateClusters: wrapperspb.Bool(false),
		}},
		HttpFilters:              slices.Concat(g.peerMetadataHTTPFilter(model.ServerMode), g.policyHTTPFilters(g.workloadAuthz(), model.ServerMode, port), g.httpFilters(model.ServerMode, g.proxyHeaders(inboundClass).suppressDebug)),
		ForwardClientCertDetails: hcmv3.HttpConnectionManager_APPEND_FORWARD,
		AccessLog:                g.accessLogs(model.ServerMode, httpLog),
	}
	g.sidecarHCM(hcm, inboundClass)
	// The client certificate's details the application gets (Istio's
	// buildSidecarInboundHTTPOpts: subject, URI and DNS names unless the
	// proxy headers say otherwise, the certificate and chain only when
	// they say so).
	ph := g.proxyHeaders(inboundClass)
	hcm.ForwardClientCertDetails = ph.forwardedClientCert
	set := ph.setCurrent
	hcm.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
		Subject: wrapperspb.Bool(set.GetSubject() == nil || set.GetSubject().GetValue()),
		Uri:     set.GetUri() == nil || set.GetUri().GetValue(),
		Dns:     set.GetDns() == nil || set.GetDns().GetValue(),
		Cert:    set.GetCert().GetValue(),
		Chain:   set.GetChain().GetValue(),
	}
	g.setTracing(hcm, model.ServerMode)
	return hcm
}

// istioMTLSALPN are the ALPN values mesh clients offer on mTLS (Istio's
// mtlsTCPWithMxcALPNs and mtlsHTTPALPNs): how a PERMISSIVE port tells
// mesh mTLS from other TLS.
func istioMTLSALPN() []string {
	return append([]string{"istio-peer-exchange", "istio"}, istioMTLSHTTPALPN()...)
}

// istioMTLSHTTPALPN are the ALPN values a mesh client offers on mTLS when
// it sent HTTP (Istio's mtlsHTTPALPNs).
func istioMTLSHTTPALPN() []string { return []string{"istio-http/1.0", "istio-http/1.1", "istio-h2"} }

// downstreamMTLS terminates mesh mTLS: the workload certificate and root
// from the agent, client certificates required.
func (g *gen) downstreamMTLS(proto registryv1.Protocol) *corev3.TransportSocket {
	alpn := []string{"istio-peer-exchange", "istio"}
	if isHTTP(proto) {
		alpn = []string{"h2", "http/1.1"}
	}
	ctx := &tlsv3.DownstreamTlsContext{
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols:                  alpn,
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: SecretWorkload, SdsConfig: sdsSource()}},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{},
				ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: SecretRoot, SdsConfig: sdsSource()},
			}},
		},
	}
	return g.tlsSocket(ctx)
}

// portListener is an outbound listener on addr:port, bound to it only
// when no capture rule sends it anything (bindToPort).
func (g *gen) portListener(name, addr string, port uint32, bindToPort bool) *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:             name,
		Address:          socketAddress(addr, port),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
	}
	if !bindToPort {
		l.BindToPort = wrapperspb.Bool(false)
	}
	return l
}

// plaintextHTTPALPN is what the HTTP inspector reports for plaintext HTTP
// (Istio's plaintextHTTPALPNs).
func plaintextHTTPALPN() []string { return []string{"http/1.0", "http/1.1", "h2c"} }

// portsPredicate matches connections to any of the ports.
func portsPredicate(ports []uint32) *listenerv3.ListenerFilterChainMatchPredicate {
	rules := make([]*listenerv3.ListenerFilterChainMatchPredicate, 0, len(ports))
	for _, p := range ports {
		rules = append(rules, &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_DestinationPortRange{
			DestinationPortRange: &typev3.Int32Range{Start: int32(p), End: int32(p) + 1}, //nolint:gosec // ports are < 65536; the range is [start, end)
		}})
	}
	if len(rules) == 1 {
		return rules[0]
	}
	return &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_OrMatch{OrMatch: &listenerv3.ListenerFilterChainMatchPredicate_MatchSet{Rules: rules}}}
}

func (g *gen) httpInspector() *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{Name: "envoy.filters.listener.http_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&httpinspectorv3.HttpInspector{})}}
}

// passthroughChain takes what no chain of a shared listener claims: see
// unknownTarget.
func (g *gen) passthroughChain(listener string) *listenerv3.FilterChain {
	target := g.unknownTarget()
	return &listenerv3.FilterChain{Name: listener + "-" + target, Filters: g.tcpForward(model.ClientMode, target, single(target))}
}

// tcpDestinations are the clusters a TCP service port forwards to: its
// VirtualService's first TCP (or TLS) route that applies, else itself.
func (g *gen) tcpDestinations(svc *registryv1.Service, port *registryv1.ServicePort) []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight {
	self := ClusterName(outbound, port.GetNumber(), "", svc.GetHostname())
	vs := g.scope.VirtualService(svc.GetHostname())
	if vs == nil {
		return single(self)
	}
	var dests []*networking.RouteDestination
	found := false
	for _, tr := range vs.Spec.GetTcp() {
		if g.l4Applies(tr.GetMatch(), port.GetNumber()) {
			dests, found = tr.GetRoute(), true
			break
		}
	}
	if !found {
		for _, tr := range vs.Spec.GetTls() {
			if g.tlsApplies(tr.GetMatch(), port.GetNumber(), svc.GetHostname()) {
				dests, found = tr.GetRoute(), true
				break
			}
		}
	}
	if !found {
		return single(self)
	}
	var out []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight
	for _, d := range dests {
		if len(dests) > 1 && d.GetWeight() == 0 {
			continue
		}
		name, _, ok := g.destination(d.GetDestination(), vs, port)
		if !ok {
			continue
		}
		out = append(out, &tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{Name: name, Weight: uint32(max(d.GetWeight(), 1))})
	}
	if len(out) == 0 {
		g.problem("VirtualService %s/%s: no TCP destination of %s is a known cluster; %s left out", vs.Namespace, vs.Name, svc.GetHostname(), self)
	}
	return out
}

func (g *gen) l4Applies(ms []*networking.L4MatchAttributes, port uint32) bool {
	if len(ms) == 0 {
		return true
	}
	for _, m := range ms {
		if (m.GetPort() == 0 || m.GetPort() == port) && model.LabelsMatch(m.GetSourceLabels(), g.p.Labels) &&
			(m.GetSourceNamespace() == "" || m.GetSourceNamespace() == g.p.Namespace) &&
			(len(m.GetGateways()) == 0 || slices.Contains(m.GetGateways(), model.MeshGateway)) {
			return true
		}
	}
	return false
}

func (g *gen) tlsApplies(ms []*networking.TLSMatchAttributes, port uint32, host string) bool {
	for _, m := range ms {
		if (m.GetPort() == 0 || m.GetPort() == port) && model.LabelsMatch(m.GetSourceLabels(), g.p.Labels) &&
			(len(m.GetGateways()) == 0 || slices.Contains(m.GetGateways(), model.MeshGateway)) &&
			slices.ContainsFunc(m.GetSniHosts(), func(h string) bool { return model.HostMatches(h, host) }) {
			return true
		}
	}
	return false
}

// withDFPFilter adds the dynamic forward proxy HTTP filter of host's cache
// to an outbound connection manager, before the router (Istio's
// buildHTTPConnectionManager). Routes to other clusters pass it untouched.
func (g *gen) withDFPFilter(hcm *hcmv3.HttpConnectionManager, host string) {
	f := &hcmv3.HttpFilter{Name: dfpHTTPFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&dfphttpv3.FilterConfig{
		ImplementationSpecifier: &dfphttpv3.FilterConfig_DnsCacheConfig{DnsCacheConfig: g.dnsCache(host)},
	})}}
	at := max(len(hcm.GetHttpFilters())-1, 0) // the router stays last
	hcm.HttpFilters = slices.Insert(hcm.GetHttpFilters(), at, f)
}

// withSNIDFPFilter puts the SNI dynamic forward proxy filter of host's
// cache before the tcp_proxy that ends filters: it resolves the TLS
// server name the client sent, to port (Istio's buildCompleteNetworkFilters).
func (g *gen) withSNIDFPFilter(filters []*listenerv3.Filter, host string, port uint32) []*listenerv3.Filter {
	f := g.networkFilter(sniDFPFilter, &snidfpv3.FilterConfig{
		DnsCacheConfig: g.dnsCache(host),
		PortSpecifier:  &snidfpv3.FilterConfig_PortValue{PortValue: port},
	})
	at := max(len(filters)-1, 0)
	return slices.Insert(slices.Clip(filters), at, f)
}
