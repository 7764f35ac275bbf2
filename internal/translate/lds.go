package translate

import (
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	originaldstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

const (
	hcmFilter      = "envoy.filters.network.http_connection_manager"
	tcpProxyFilter = "envoy.filters.network.tcp_proxy"
)

// listenerSet returns the proxy's listeners, checked and sorted by name:
// for sidecars all of them (they depend on each other: one wildcard
// listener per port collects several services), for proxyless gRPC
// clients the API listeners named (all when names is nil).
func (g *gen) listenerSet(names []string) []*listenerv3.Listener {
	before := g.packErrs
	if !g.grpc {
		if g.listeners == nil && g.isGateway() {
			g.listeners = g.checkListeners(g.gatewayListeners(), before)
		}
		if g.listeners == nil {
			outbound := g.outboundSet()
			own := []*listenerv3.Listener{g.virtualInbound()}
			for _, l := range g.boundInbound() {
				if slices.ContainsFunc(outbound, func(o *listenerv3.Listener) bool { return o.GetName() == l.GetName() }) ||
					l.GetName() == VirtualInbound {
					g.problem("listener %s: a Sidecar ingress port and an outbound listener share it; the ingress port is left out", l.GetName())
					continue
				}
				own = append(own, l)
			}
			all := append(slices.Clone(outbound), g.checkListeners(own, before)...)
			sortByName(all)
			g.listeners = all
		}
		return g.listeners
	}
	if names == nil {
		for _, svc := range g.scope.Services() {
			if !grpcReachable(svc) {
				continue
			}
			for _, port := range svc.GetPorts() {
				names = append(names, ListenerName(svc.GetHostname(), port.GetNumber()))
			}
		}
	}
	var out []*listenerv3.Listener
	for _, name := range uniqueSorted(names) {
		if strings.HasPrefix(name, GRPCInboundPrefix) {
			if l := g.grpcServerListener(name); l != nil {
				out = append(out, l)
			}
			continue
		}
		if svc, _ := g.hostPort(name); svc == nil || !grpcReachable(svc) {
			continue
		}
		if !g.routeOK(name) {
			g.problem("listener %s dropped: its route configuration was dropped", name)
			continue
		}
		// The API listener depends on its name only: built and checked
		// once per push context, shared by every client.
		v := g.pc.Memo("lds|grpc|"+name, func() any {
			sub := g.isolated()
			before := sub.packErrs
			l := &listenerv3.Listener{
				Name:        name,
				ApiListener: &listenerv3.ApiListener{ApiListener: sub.pack(sub.httpConnectionManager(name, name))},
			}
			if err := sub.valid(l, before); err != nil {
				sub.problem("listener %s dropped: %v", name, err)
				l = nil
			} else {
				g.pc.Share(l)
			}
			return &shared{value: l, problems: sub.problems}
		}).(*shared)
		for _, p := range v.problems {
			g.problem("%s", p)
		}
		if l, _ := v.value.(*listenerv3.Listener); l != nil {
			out = append(out, l)
		}
	}
	return out
}

// outboundSet is a sidecar's outbound listeners: virtualOutbound and the
// listeners of the services its scope sees, built and checked once per
// push context and shared, with their encodings, by the proxies of one
// scope (namespace and Sidecar). They read the proxy's labels only when a
// VirtualService matches TCP or TLS on sourceLabels or a DestinationRule
// selects workloads, and its addresses only when a service is listened
// for per endpoint (its own left out): only then is the proxy part of the
// key. Istio builds them per proxy; inbound listeners stay per proxy here
// too.
func (g *gen) outboundSet() []*listenerv3.Listener {
	key := g.scopeKey("lds", "outbound", g.pc.ListenersReadLabels(), g.readsAddresses(true))
	v := g.pc.Memo(key, func() any {
		sub := g.isolated()
		before := sub.packErrs
		ls := sub.checkListeners(append([]*listenerv3.Listener{sub.virtualOutbound()}, sub.outboundListeners()...), before)
		for _, l := range ls {
			g.pc.Share(l)
		}
		return &shared{value: ls, problems: sub.problems}
	}).(*shared)
	for _, p := range v.problems {
		g.problem("%s", p)
	}
	ls, _ := v.value.([]*listenerv3.Listener)
	return ls
}

// httpFilters are the HTTP filters whose per-route settings routes may
// carry, then the router: fault, then CORS for sidecars (Istio's order;
// grpc-go would reject a listener naming the CORS filter, so proxyless
// clients get fault and router only).
func (g *gen) httpFilters() []*hcmv3.HttpFilter {
	fs := []*hcmv3.HttpFilter{{Name: faultFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&faultv3.HTTPFault{})}}}
	if !g.grpc {
		fs = append(fs, &hcmv3.HttpFilter{Name: corsFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&corsv3.Cors{})}})
	}
	return append(fs, &hcmv3.HttpFilter{Name: routerFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&routerv3.Router{})}})
}

func (g *gen) httpConnectionManager(statPrefix, routeName string) *hcmv3.HttpConnectionManager {
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: routeName,
		}},
		HttpFilters: g.httpFilters(),
	}
	if !g.grpc {
		g.sidecarHCM(hcm)
	}
	return hcm
}

// sidecarHCM sets what Istio's buildHTTPConnectionManager sets on every
// sidecar HTTP connection manager: websocket upgrades allowed, no stream
// idle timeout (Envoy's 5-minute default would reset long-lived gRPC
// streams), paths normalised per the mesh's pathNormalization (by default
// normalised, escaped slashes kept), the client's address not trusted from the
// connection (use_remote_address false, inbound and outbound), request IDs
// generated and 100-continue answered by the proxy
// (ENABLE_100_CONTINUE_HEADERS, on by default).
func (g *gen) sidecarHCM(hcm *hcmv3.HttpConnectionManager) {
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
	hcm.GenerateRequestId = wrapperspb.Bool(true)
	hcm.Proxy_100Continue = true
}

// networkFilter packs a network filter. Its consistency check
// (checkConfig) runs now, on the message at hand, so that checking the
// listener later needs no unpacking.
func (g *gen) networkFilter(name string, cfg proto.Message) *listenerv3.Filter {
	a := g.pack(cfg)
	if g.filterChecks == nil {
		g.filterChecks = map[*anypb.Any]error{}
	}
	g.filterChecks[a] = g.checkConfig(cfg)
	return &listenerv3.Filter{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}
}

func (g *gen) tcpProxy(statPrefix string, clusters []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight) *listenerv3.Filter {
	tp := &tcpproxyv3.TcpProxy{StatPrefix: statPrefix}
	if len(clusters) == 1 {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_Cluster{Cluster: clusters[0].GetName()}
	} else {
		tp.ClusterSpecifier = &tcpproxyv3.TcpProxy_WeightedClusters{WeightedClusters: &tcpproxyv3.TcpProxy_WeightedCluster{Clusters: clusters}}
	}
	return g.networkFilter(tcpProxyFilter, tp)
}

func single(cluster string) []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight {
	return []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{{Name: cluster, Weight: 1}}
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
		FilterChains: []*listenerv3.FilterChain{
			{
				// A connection to the listener's own port would loop (Istio's
				// virtualOutbound-blackhole).
				Name:             "virtualOutbound-blackhole",
				FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(OutboundPort)},
				Filters:          []*listenerv3.Filter{g.tcpProxy(BlackHoleCluster, single(BlackHoleCluster))},
			},
			{
				Name:    "virtualOutbound-catchall-tcp",
				Filters: []*listenerv3.Filter{g.tcpProxy(catchAll, single(catchAll))},
			},
		},
	}
}

// virtualInbound receives everything sent to the pod: one filter chain per
// port of the workload (mTLS, plaintext, or both as PeerAuthentication
// says) to the application on localhost, and a catch-all passthrough.
func (g *gen) virtualInbound() *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:             VirtualInbound,
		Address:          socketAddress("0.0.0.0", InboundPort),
		TrafficDirection: corev3.TrafficDirection_INBOUND,
		ListenerFilters: []*listenerv3.ListenerFilter{
			{Name: "envoy.filters.listener.original_dst", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&originaldstv3.OriginalDst{})}},
			{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}},
		},
	}
	var sniff []uint32
	for _, ip := range g.inboundPorts() {
		if ip.bind != "" {
			continue // a listener of its own (boundInbound)
		}
		if sniffed(ip.proto) {
			sniff = append(sniff, ip.port)
		}
		l.FilterChains = append(l.FilterChains, g.inboundChains(ip.port, ip.proto)...)
	}
	if len(sniff) > 0 {
		slices.Sort(sniff)
		// After the TLS inspector, and only on sniffed ports, as Istio's
		// buildHTTPInspector: the HTTP inspector waits for the client's
		// first bytes, which a server-first protocol (MySQL, SMTP) on a
		// declared port never sends.
		hi := g.httpInspector()
		hi.FilterDisabled = &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_NotMatch{NotMatch: portsPredicate(sniff)}}
		l.ListenerFilters = append(l.ListenerFilters, hi)
	}
	// As Istio (buildInboundPassthroughChains): first a black hole for
	// connections to the listener's own port, which would loop; then
	// connections to ports no service of the workload names go to their
	// original destination from 127.0.0.6 (InboundPassthroughCluster),
	// under the workload's mTLS mode: mTLS from mesh clients is
	// terminated (PERMISSIVE, STRICT), plaintext and other TLS pass
	// (PERMISSIVE, DISABLE).
	l.FilterChains = append([]*listenerv3.FilterChain{{
		Name:             "virtualInbound-blackhole",
		FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(InboundPort)},
		Filters:          []*listenerv3.Filter{g.tcpProxy(BlackHoleCluster, single(BlackHoleCluster))},
	}}, l.FilterChains...)
	pass := func() []*listenerv3.Filter { return g.inboundTCP(InboundPassthroughCluster) }
	mtls := &listenerv3.FilterChain{
		Name:             "virtualInbound-catchall-mtls",
		FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "tls", ApplicationProtocols: istioMTLSALPN()},
		Filters:          pass(),
		TransportSocket:  g.downstreamMTLS(registryv1.Protocol_PROTOCOL_TCP),
	}
	switch g.pc.InboundMTLS(g.p, 0) {
	case model.Strict:
		l.FilterChains = append(l.FilterChains, mtls)
	case model.Disable:
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{Name: "virtualInbound-catchall", Filters: pass()})
	default:
		l.FilterChains = append(l.FilterChains, mtls,
			&listenerv3.FilterChain{Name: "virtualInbound-catchall-tls", FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "tls"}, Filters: pass()},
			&listenerv3.FilterChain{Name: "virtualInbound-catchall", FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer"}, Filters: pass()})
	}
	return l
}

// boundInbound are the listeners of Sidecar ingress ports with
// captureMode NONE: bound to their address and port, since no capture
// rule sends them anything (Istio's getBindToPort).
func (g *gen) boundInbound() []*listenerv3.Listener {
	var out []*listenerv3.Listener
	for _, ip := range g.inboundPorts() {
		if ip.bind == "" {
			continue
		}
		l := &listenerv3.Listener{
			Name:             ip.bind + "_" + itoa(ip.port),
			Address:          socketAddress(ip.bind, ip.port),
			TrafficDirection: corev3.TrafficDirection_INBOUND,
			FilterChains:     g.inboundChains(ip.port, ip.proto),
			ListenerFilters:  []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}}},
		}
		if sniffed(ip.proto) {
			l.ListenerFilters = append(l.ListenerFilters, g.httpInspector())
		}
		out = append(out, l)
	}
	return out
}

func (g *gen) inboundChains(port uint32, proto registryv1.Protocol) []*listenerv3.FilterChain {
	if sniffed(proto) {
		return g.inboundSniffedChains(port)
	}
	cluster := ClusterName("inbound", port, "", "")
	filters := func() []*listenerv3.Filter {
		if !isHTTP(proto) {
			return g.inboundTCP(cluster)
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
			Filters:          g.inboundTCP(cluster),
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
	cluster := ClusterName("inbound", port, "", "")
	p := itoa(port)
	chain := func(name, transport string, alpn []string, http bool, mtls registryv1.Protocol) *listenerv3.FilterChain {
		fc := &listenerv3.FilterChain{
			Name:             "inbound|" + p + "|" + name,
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port), TransportProtocol: transport, ApplicationProtocols: alpn},
			Filters:          g.inboundTCP(cluster),
		}
		if http {
			fc.Filters = []*listenerv3.Filter{g.networkFilter(hcmFilter, g.inboundHCM(port))}
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
	switch g.pc.InboundMTLS(g.p, port) {
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

// inboundTCP are the filters of an inbound TCP chain: the workload's
// authorization, then tcp_proxy to cluster.
func (g *gen) inboundTCP(cluster string) []*listenerv3.Filter {
	return append(slices.Clip(g.workloadAuthz().tcp), g.tcpProxy(cluster, single(cluster)))
}

// inboundHCM routes everything a port receives to the application, after
// the workload's authorization.
func (g *gen) inboundHCM(port uint32) *hcmv3.HttpConnectionManager {
	cluster := ClusterName("inbound", port, "", "")
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
		HttpFilters:              append(slices.Clip(g.workloadAuthz().http), g.httpFilters()...),
		ForwardClientCertDetails: hcmv3.HttpConnectionManager_APPEND_FORWARD,
	}
	g.sidecarHCM(hcm)
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

// outboundListeners: "0.0.0.0_<port>" for HTTP ports (routed by RDS
// "<port>"), with SNI chains for TLS services without an address, and
// "<vip>_<port>" tcp_proxy listeners for TCP services with addresses.
func (g *gen) outboundListeners() []*listenerv3.Listener {
	type wildcard struct {
		http bool
		sni  []*listenerv3.FilterChain
		tcp  []*listenerv3.FilterChain
	}
	wild := map[uint32]*wildcard{}
	get := func(port uint32) *wildcard {
		if wild[port] == nil {
			wild[port] = &wildcard{}
		}
		return wild[port]
	}
	// The Sidecar's egress listeners with a port come first; what they
	// build the catch-all's services may not take.
	out, locked := g.egressPortListeners()
	names := map[string]string{}
	for _, svc := range g.catchAllServices() {
		for _, port := range svc.GetPorts() {
			num := port.GetNumber()
			if g.onPortRoute(svc, port) {
				if !locked["0.0.0.0_"+itoa(num)] {
					get(num).http = true
				}
				continue
			}
			if port.GetProtocol() == registryv1.Protocol_PROTOCOL_UDP {
				continue
			}
			clusters := g.tcpDestinations(svc, port)
			if len(clusters) == 0 {
				continue
			}
			vips := ipAddresses(svc.GetAddresses())
			if g.perEndpoint(svc) {
				// A listener per endpoint address, as Istio's
				// buildSidecarOutboundListeners, so that several headless
				// services (StatefulSets) may share a port. A headless
				// Service without endpoints gets none; a ServiceEntry
				// without them takes the shared listener below.
				vips = g.endpointAddresses(svc)
				if len(vips) == 0 {
					continue
				}
			}
			if len(vips) == 0 {
				if locked["0.0.0.0_"+itoa(num)] {
					continue
				}
				tls := port.GetProtocol() == registryv1.Protocol_PROTOCOL_TLS || port.GetProtocol() == registryv1.Protocol_PROTOCOL_HTTPS
				chain := &listenerv3.FilterChain{
					Name:    ClusterName("outbound", num, "", svc.GetHostname()),
					Filters: []*listenerv3.Filter{g.tcpProxy(ClusterName("outbound", num, "", svc.GetHostname()), clusters)},
				}
				if tls && svc.GetHostname() != "*" {
					chain.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: []string{svc.GetHostname()}, TransportProtocol: "tls"}
					get(num).sni = append(get(num).sni, chain)
				} else {
					get(num).tcp = append(get(num).tcp, chain)
				}
				continue
			}
			for _, vip := range vips {
				name := vip + "_" + itoa(num)
				if locked[name] {
					continue
				}
				if owner, dup := names[name]; dup {
					g.problem("listener %s: %s and %s share an address and port; %s left out", name, owner, svc.GetHostname(), svc.GetHostname())
					continue
				}
				names[name] = svc.GetHostname()
				l := g.portListener(name, vip, num, false)
				l.FilterChains = []*listenerv3.FilterChain{{
					Name:    ClusterName("outbound", num, "", svc.GetHostname()),
					Filters: []*listenerv3.Filter{g.tcpProxy(ClusterName("outbound", num, "", svc.GetHostname()), clusters)},
				}}
				if sniffed(port.GetProtocol()) {
					// A port of no declared protocol (Istio's "auto"): the
					// HTTP inspector tells HTTP from the rest per
					// connection. HTTP takes the service's own route
					// configuration "<host>:<port>" (Istio's
					// getVirtualHostsForSniffedServicePort), the rest the
					// TCP chain.
					l.ListenerFilters = []*listenerv3.ListenerFilter{g.httpInspector()}
					l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
						Name:             ListenerName(svc.GetHostname(), num),
						FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: plaintextHTTPALPN()},
						Filters:          []*listenerv3.Filter{g.networkFilter(hcmFilter, g.httpConnectionManager("outbound_"+name, ListenerName(svc.GetHostname(), num)))},
					})
				}
				out = append(out, l)
			}
		}
	}
	ports := make([]uint32, 0, len(wild))
	for p := range wild {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	for _, port := range ports {
		w := wild[port]
		name := "0.0.0.0_" + itoa(port)
		l := g.portListener(name, "0.0.0.0", port, false)
		l.FilterChains = append(l.FilterChains, w.sni...)
		switch {
		case w.http:
			g.httpChain(l, name, itoa(port))
			for _, c := range w.tcp {
				g.problem("listener %s: TCP service %s without an address shares port %d with HTTP services; left out", name, c.GetName(), port)
			}
		case len(w.tcp) > 0:
			l.FilterChains = append(l.FilterChains, w.tcp[0])
			for _, c := range w.tcp[1:] {
				g.problem("listener %s: TCP services %s and %s have no address and share port %d; %s left out", name, w.tcp[0].GetName(), c.GetName(), port, c.GetName())
			}
		}
		if len(l.GetFilterChains()) == 0 {
			continue
		}
		if len(w.sni) > 0 {
			l.ListenerFilters = append([]*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}}}, l.ListenerFilters...)
			if l.DefaultFilterChain == nil && len(w.tcp) == 0 {
				// TLS to a host no SNI chain names still goes through under
				// ALLOW_ANY (HTTPS to the rest of the world keeps working).
				l.DefaultFilterChain = g.passthroughChain(name)
			}
		}
		out = append(out, l)
	}
	return out
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

// httpChain makes l a shared HTTP listener, as Istio's: the HTTP chain
// (route configuration rds) takes what the HTTP inspector sees as
// plaintext HTTP/1.x or h2c; anything else on the port (another protocol,
// TLS to a host no SNI chain names) takes the default chain, passed
// through or refused per outboundTrafficPolicy.
func (g *gen) httpChain(l *listenerv3.Listener, name, rds string) {
	l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
		Name:             name,
		FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: plaintextHTTPALPN()},
		Filters:          []*listenerv3.Filter{g.networkFilter(hcmFilter, g.httpConnectionManager("outbound_"+name, rds))},
	})
	l.ListenerFilters = append(l.ListenerFilters, g.httpInspector())
	l.DefaultFilterChain = g.passthroughChain(name)
}

// headless reports whether a service is a Kubernetes Service without a
// cluster IP, whose clients reach each pod by its own address.
func headless(svc *registryv1.Service) bool {
	return svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE &&
		svc.GetResolution() == registryv1.Resolution_RESOLUTION_NONE && len(ipAddresses(svc.GetAddresses())) == 0
}

// endpointAddresses are the IP addresses of a service's endpoints, sorted,
// but the proxy's own: traffic to itself does not go through an outbound
// listener.
func (g *gen) endpointAddresses(svc *registryv1.Service) []string {
	var out []string
	for _, ep := range g.pc.Endpoints(svc) {
		if a, ok := g.peerAddress(ep); ok {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// peerAddress is an endpoint's IP address, unless it is not one or is
// the proxy's own.
func (g *gen) peerAddress(ep *registryv1.Endpoint) (string, bool) {
	a, err := netip.ParseAddr(ep.GetAddress())
	if err != nil || slices.Contains(g.p.IPs, a) {
		return "", false
	}
	return a.String(), true
}

// sniffed reports whether a port's protocol is told per connection
// (Istio's "auto": no protocol declared, an unknown port name prefix).
func sniffed(p registryv1.Protocol) bool { return p == registryv1.Protocol_PROTOCOL_UNSPECIFIED }

// onPortRoute reports whether a service port's HTTP traffic is routed by
// the shared route configuration of its port number ("80"): HTTP ports,
// and sniffed ports of services without an address to listen on (neither
// their own nor their endpoints', see perEndpoint).
func (g *gen) onPortRoute(svc *registryv1.Service, port *registryv1.ServicePort) bool {
	return isHTTP(port.GetProtocol()) ||
		(sniffed(port.GetProtocol()) && len(ipAddresses(svc.GetAddresses())) == 0 && !g.perEndpoint(svc))
}

// perEndpoint reports whether a service's TCP and sniffed ports get a
// listener per endpoint address: headless Kubernetes Services, and
// passthrough ServiceEntries without an address that list endpoints
// (Istio's buildSidecarOutboundListeners).
func (g *gen) perEndpoint(svc *registryv1.Service) bool {
	if svc.GetResolution() != registryv1.Resolution_RESOLUTION_NONE || len(ipAddresses(svc.GetAddresses())) > 0 {
		return false
	}
	if headless(svc) {
		return true
	}
	return slices.ContainsFunc(g.pc.Endpoints(svc), func(ep *registryv1.Endpoint) bool {
		_, ok := g.peerAddress(ep)
		return ok
	})
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
	name := ClusterName("outbound", ep.GetPort().GetNumber(), ep.GetSubset(), host)
	if g.cluster(name) == nil {
		g.problem("Sidecar %s/%s: outboundTrafficPolicy.egressProxy %s is not a cluster this proxy has; unknown destinations pass through directly", sc.Namespace, sc.Name, name)
		return PassthroughCluster
	}
	return name
}

// passthroughChain takes what no chain of a shared listener claims: see
// unknownTarget.
func (g *gen) passthroughChain(listener string) *listenerv3.FilterChain {
	target := g.unknownTarget()
	return &listenerv3.FilterChain{Name: listener + "-" + target, Filters: []*listenerv3.Filter{g.tcpProxy(target, single(target))}}
}

func ipAddresses(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if !strings.Contains(a, "/") && a != "" && a != "None" {
			out = append(out, a)
		}
	}
	return out
}

// tcpDestinations are the clusters a TCP service port forwards to: its
// VirtualService's first TCP (or TLS) route that applies, else itself.
func (g *gen) tcpDestinations(svc *registryv1.Service, port *registryv1.ServicePort) []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight {
	self := ClusterName("outbound", port.GetNumber(), "", svc.GetHostname())
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

// grpcReachable reports whether a proxyless gRPC client can call the
// service: it needs endpoints it is told about (not passthrough).
func grpcReachable(svc *registryv1.Service) bool {
	return svc.GetResolution() != registryv1.Resolution_RESOLUTION_NONE
}
