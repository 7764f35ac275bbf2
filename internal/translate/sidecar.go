package translate

import (
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// This file is what only a sidecar gets, as Istio's sidecar builders
// (buildSidecarListeners, buildSidecarOutboundHTTPRouteConfig, the
// inbound and passthrough clusters): its inbound ports (inbound.go) and
// egress listeners (egress.go) with their listeners, clusters and
// routes, around the outbound resources every Envoy shares.

// sidecar is the flavour of Envoy sidecars (node type "sidecar").
type sidecar struct{}

// sidecarState is what a sidecar's own builders remember.
type sidecarState struct {
	// inbound are the inbound clusters (inboundClusters), inPorts the
	// ports they serve (inboundPorts), egress the Sidecar's egress
	// listeners (egressPorts).
	inbound []*clusterv3.Cluster
	inPorts []inboundPort
	egress  []egressPort
}

// clusterNames: the workload's inbound clusters, the black hole and the
// passthroughs.
func (sidecar) clusterNames(g *gen) []string {
	var names []string
	for _, c := range g.inboundClusters() {
		names = append(names, c.GetName())
	}
	return append(names, BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster)
}

// localCluster: the black hole and the passthroughs read nothing of the
// proxy but its address families: they are built once per push for every
// proxy (sharedLocal), so proxies of one scope hold the same clusters.
// Inbound clusters are the proxy's own.
func (sidecar) localCluster(g *gen, name string) *builtCluster {
	switch {
	case name == BlackHoleCluster:
		return g.sharedBlackHole()
	case name == PassthroughCluster:
		return g.sharedLocal(name, (*gen).passthrough)
	case name == InboundPassthroughCluster:
		v4, v6 := g.addressFamilies()
		return g.sharedLocal(name+"|"+strconv.FormatBool(v4)+"|"+strconv.FormatBool(v6), (*gen).inboundPassthrough)
	case strings.HasPrefix(name, "inbound|"):
		before := g.packErrs
		for _, c := range g.inboundClusters() {
			if c.GetName() != name {
				continue
			}
			if err := g.valid(c, before); err != nil {
				g.problem("cluster %s dropped: %v", name, err)
				return nil
			}
			return &builtCluster{c: c}
		}
	}
	return nil
}

// routeNames: one per outbound HTTP port ("80"), one per egress
// listener port routed by HTTP, and one per sniffed service port
// ("host:port").
func (sidecar) routeNames(g *gen) []string {
	var names []string
	for _, ep := range g.egressPorts() {
		if isHTTP(ep.proto) || sniffed(ep.proto) {
			names = append(names, itoa(ep.port))
		}
	}
	for _, svc := range g.scope.Services() {
		for _, port := range svc.GetPorts() {
			switch {
			case g.onPortRoute(svc, port):
				names = append(names, itoa(port.GetNumber()))
			case sniffed(port.GetProtocol()):
				names = append(names, ListenerName(svc.GetHostname(), port.GetNumber()))
			}
		}
	}
	return names
}

func (sidecar) buildRoute(g *gen, name string) *routev3.RouteConfiguration {
	if strings.Contains(name, ":") {
		return g.sniffedRoute(name)
	}
	return g.portRoute(name)
}

// sharedRouteKey: a sidecar's route configuration depends, besides the
// push context, on its name and the proxy's scope (namespace and
// Sidecar), and only when the configuration makes them matter the
// proxy's labels (a VirtualService match on sourceLabels, a
// DestinationRule's workload selector) and addresses (a passthrough
// service routed per endpoint leaves out the proxy's own). Proxies of
// one scope then share one built, checked and encoded route
// configuration per push, as Istio's route cache shares them.
func (sidecar) sharedRouteKey(g *gen, name string) (string, bool) {
	return g.scopeKey("rds", name, g.pc.RoutesReadLabels(), g.readsAddresses(false)) + "|headers|" + g.proxyHeaders(outboundClass).key() + "|als|" + strconv.FormatBool(g.meshALS()), true
}

// routeKnown: built and checked; a listener whose route was dropped goes
// too.
func (sidecar) routeKnown(g *gen, name string) bool { return g.routeOK(name) }

// listeners: all of a sidecar's, whatever the names (they depend on each
// other: one wildcard listener per port collects several services), the
// shared outbound ones (outboundSet) and the proxy's own inbound ones.
func (sidecar) listeners(g *gen, _ []string) []*listenerv3.Listener {
	if g.listeners != nil {
		return g.listeners
	}
	before := g.packErrs
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
	return all
}

// portRoute is a sidecar's route configuration for an outbound port: a
// virtual host per HTTP service on the port, and the fallback.
func (g *gen) portRoute(name string) *routev3.RouteConfiguration {
	n, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return nil
	}
	var vhs []*routev3.VirtualHost
	for _, sp := range g.portRouteServices(uint32(n)) {
		vhs = append(vhs, g.virtualHost(sp.svc, sp.port))
	}
	if len(vhs) == 0 {
		return nil
	}
	sortByName(vhs)
	vhs = append(vhs, g.fallbackVirtualHost())
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: vhs, ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true}
}

// sniffedRoute is the route configuration "<host>:<port>" of a sniffed
// port of a service with an address: that service's virtual host for
// every Host, and no fallback, since the listener is the service's own
// (Istio's getVirtualHostsForSniffedServicePort).
func (g *gen) sniffedRoute(name string) *routev3.RouteConfiguration {
	svc, port := g.hostPort(name)
	if svc == nil || !sniffed(port.GetProtocol()) || g.onPortRoute(svc, port) {
		return nil
	}
	vh := g.virtualHost(svc, port)
	vh.Domains = []string{"*"}
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{vh}, ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true}
}

// outboundSet is a sidecar's outbound listeners: virtualOutbound and the
// listeners of the services its scope sees, built and checked once per
// push context and shared, with their encodings, by the proxies of one
// scope (namespace and Sidecar). They read the proxy's labels only when a
// VirtualService matches TCP or TLS on sourceLabels or a DestinationRule
// selects workloads, and its addresses only when a service is listened
// for per endpoint (its own left out): only then is the proxy part of the
// key; and what of the proxy's node its spans' tags name (traceIdentity)
// the extensions that select it (extensionsKey), its proxy headers and
// whether its bootstrap has the mesh's access log service (meshALS)
// and the address family it resolves names in (DYNAMIC_DNS hosts' DNS
// caches) always are. Istio builds them per proxy; inbound listeners stay per
// proxy here too.
func (g *gen) outboundSet() []*listenerv3.Listener {
	key := g.scopeKey("lds", "outbound", g.pc.ListenersReadLabels(), g.readsAddresses(true)) + "|" + g.client.name + "|trace|" + g.traceIdentity() +
		"|extensions|" + g.extensionsKey() + "|headers|" + g.proxyHeaders(outboundClass).key() + "|als|" + strconv.FormatBool(g.meshALS()) +
		"|dns|" + g.dnsLookupFamily().String()
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
			vips := g.serviceAddresses(svc)
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
					Name:    ClusterName(outbound, num, "", svc.GetHostname()),
					Filters: g.outboundTCPFilters(svc, port, clusters),
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
					Name:    ClusterName(outbound, num, "", svc.GetHostname()),
					Filters: g.outboundTCPFilters(svc, port, clusters),
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
						Filters:          []*listenerv3.Filter{g.networkFilter(hcmFilter, g.httpConnectionManager("outbound_"+name, ListenerName(svc.GetHostname(), num), num, nil))},
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
			g.httpChain(l, name, port)
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

// maxDurationSeconds is the longest duration protobuf allows (Istio's
// maxSecondsValue).
const maxDurationSeconds = 315576000000

// inboundClusters are inbound|<port>|| for each inbound port (see
// inboundPorts): to a Sidecar ingress port's defaultEndpoint, else, as
// Istio's buildInboundCluster, to the original destination (the pod's
// address) from 127.0.0.6 as InboundPassthroughCluster.
func (g *gen) inboundClusters() []*clusterv3.Cluster {
	if g.sc.inbound != nil {
		return g.sc.inbound
	}
	out := []*clusterv3.Cluster{}
	for _, ip := range g.inboundPorts() {
		name := ClusterName(inbound, ip.port, "", "")
		var c *clusterv3.Cluster
		if ip.endpoint == nil {
			c = g.inboundPassthrough()
			c.Name = name
			// As Istio's buildInboundCluster: an inbound ORIGINAL_DST
			// cluster keeps its hosts (the pod's own addresses) for good.
			c.CleanupInterval = &durationpb.Duration{Seconds: maxDurationSeconds}
		} else {
			c = &clusterv3.Cluster{
				Name:                 name,
				ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
				ConnectTimeout:       dur(defaultConnectTimeout),
				LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
				CircuitBreakers:      circuitBreakers(nil, nil),
				LoadAssignment: &endpointv3.ClusterLoadAssignment{
					ClusterName: name,
					Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{
						lbEndpoint(ip.endpoint, 0, corev3.HealthStatus_UNKNOWN, nil),
					}}},
				},
			}
		}
		// The application speaks the port's protocol: HTTP/2 to a gRPC
		// or HTTP/2 port, the client's own on a sniffed one (Istio's
		// setUpstreamProtocol on inbound clusters).
		c.TypedExtensionProtocolOptions = nil
		if opts := httpOptions(ip.proto, nil); opts != nil {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{http2Options: g.pack(opts)}
		}
		out = append(out, c)
	}
	g.sc.inbound = out
	return out
}

// inboundPassthrough is Istio's InboundPassthroughCluster: the
// passthrough, with its connections made from 127.0.0.6 (and ::6 for a
// workload with IPv6 addresses), which the capture rules let reach the
// application rather than loop back into the sidecar.
func (g *gen) inboundPassthrough() *clusterv3.Cluster {
	c := g.passthrough()
	c.Name = InboundPassthroughCluster
	v4, v6 := g.addressFamilies()
	src := InboundPassthroughBind
	if !v4 && v6 {
		src = inboundPassthroughBind6
	}
	bind := &corev3.BindConfig{SourceAddress: &corev3.SocketAddress{Address: src, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}
	if v4 && v6 {
		bind.ExtraSourceAddresses = []*corev3.ExtraSourceAddress{{Address: &corev3.SocketAddress{Address: inboundPassthroughBind6, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}}
	}
	c.UpstreamBindConfig = bind
	return c
}

// passthrough sends to the original destination. HTTP keeps the
// protocol the application spoke (h2c stays HTTP/2), as Istio's
// PassthroughCluster does.
func (g *gen) passthrough() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 PassthroughCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		ConnectTimeout:       dur(defaultConnectTimeout),
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		CircuitBreakers:      circuitBreakers(nil, nil),
		TypedExtensionProtocolOptions: map[string]*anypb.Any{http2Options: g.pack(&httpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_UseDownstreamProtocolConfig{UseDownstreamProtocolConfig: &httpv3.HttpProtocolOptions_UseDownstreamHttpConfig{
				HttpProtocolOptions: &corev3.Http1ProtocolOptions{}, Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
			}},
		})},
	}
}

// patchContexts: Istio's SIDECAR_OUTBOUND and SIDECAR_INBOUND.
// gatewayCredentials: none, not being a gateway.
func (sidecar) gatewayCredentials(*gen) map[string]bool { return nil }

func (sidecar) patchContexts() (outbound, inbound networking.EnvoyFilter_PatchContext, ok bool) {
	return networking.EnvoyFilter_SIDECAR_OUTBOUND, networking.EnvoyFilter_SIDECAR_INBOUND, true
}

func (sidecar) jwtClearsRouteCache() bool { return false }
