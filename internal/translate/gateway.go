package translate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	listenerproxyprotocolv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/proxy_protocol/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// This file is what a gateway proxy (node type "router") gets, as Istio's
// MergeGateways and buildGatewayListeners/buildGatewayHTTPRouteConfig:
// the Gateways selecting it merged into one listener per port, HTTP
// servers routed by the VirtualServices bound to them, TLS servers told
// apart by SNI, and the outbound clusters of what it sees (no inbound).

// gwServer is one server of a Gateway, as merged on a listener port.
type gwServer struct {
	gw *model.Gateway
	// key is the Gateway's "namespace/name".
	key string
	srv *networking.Server
	// hosts are the server's hosts with the namespaces whose
	// VirtualServices may bind them ("*" any; "." resolved to the
	// Gateway's).
	hosts []gwHost
	// sni are a TLS server's hosts without namespaces (sniHosts).
	sni []string
	// route is the RDS name of an HTTP server, or of an HTTPS server that
	// terminates TLS.
	route string
}

// gwHost is a server host: "namespace/host" in the Gateway.
type gwHost struct{ ns, host string }

// gwPort is a listener port of a gateway proxy: plaintext servers (HTTP
// servers sharing one route configuration, or one TCP server), or TLS
// servers told apart by SNI.
type gwPort struct {
	port    uint32
	plain   []gwServer
	tls     []gwServer
	sniSeen map[string]bool
	routes  map[string]bool
}

// router is the flavour of gateway proxies (node type "router").
type router struct{}

// gatewayState is what a gateway proxy's own builders remember.
type gatewayState struct {
	// merge is what configures the proxy (gatewayMerge).
	merge *gatewayMerge
	// tls are its TLS transport sockets by their settings.
	tls map[string]*corev3.TransportSocket
	// hcm is what its HTTP connection managers share (gatewayHCMFilter),
	// by the extensions of their ports.
	hcm map[string]*hcmTail
	// vsRoutes are the routes of VirtualServices on it (gatewayVSRoutes).
	vsRoutes map[gwVSKey][]*routev3.Route
}

// clusterNames: outbound only, as Istio's gateways (no inbound or
// passthrough clusters), the black hole, and the SNI-named clusters of
// AUTO_PASSTHROUGH servers.
func (router) clusterNames(g *gen) []string {
	names := []string{BlackHoleCluster}
	for _, gp := range g.gatewayPorts() {
		for _, s := range gp.tls {
			if s.srv.GetTls().GetMode() == networking.ServerTLSSettings_AUTO_PASSTHROUGH {
				for _, fc := range g.autoPassthroughChains(s) {
					names = append(names, fc.GetName())
				}
			}
		}
	}
	return names
}

func (router) localCluster(g *gen, name string) *builtCluster {
	if name == BlackHoleCluster {
		return g.sharedBlackHole()
	}
	if portNum, subset, host, ok := parseSNIDNATClusterName(name); ok {
		return g.sniDNATCluster(name, portNum, subset, host)
	}
	return nil
}

// routeNames: its HTTP servers' route names.
func (router) routeNames(g *gen) []string { return g.gatewayRouteNames() }

func (router) buildRoute(g *gen, name string) *routev3.RouteConfiguration {
	return g.gatewayRoute(name)
}

// sharedRouteKey: a gateway builds its own.
func (router) sharedRouteKey(*gen, string) (string, bool) { return "", false }

// routeKnown: one of its servers' route names (built when asked for, as
// Istio's LDS does not build RDS).
func (router) routeKnown(g *gen, name string) bool {
	_, ok := g.gatewayMerge().routes[name]
	return ok
}

// listeners: all of them, one per port, whatever the names.
func (router) listeners(g *gen, _ []string) []*listenerv3.Listener {
	if g.listeners == nil {
		before := g.packErrs
		g.listeners = g.checkListeners(g.gatewayListeners(), before)
	}
	return g.listeners
}

// gatewayMerge is what the Gateways selecting a gateway proxy configure
// (mergeGateways): their servers by listener port, the HTTP servers by
// route name, and the problems found. It depends only on the proxy's
// labels (which Gateways select it) and where its server ports listen,
// so gateway proxies alike (the replicas of a gateway Deployment) share
// one per push context, as Istio merges them once per proxy and push
// (MergeGateways in its push context initialisation). Nothing in it
// changes once made.
type gatewayMerge struct {
	ports []*gwPort
	// routes are the HTTP servers by route name, in order.
	routes     map[string][]*gwServer
	routeNames []string
	problems   []string
}

// gatewayPorts are the proxy's merged listener ports.
func (g *gen) gatewayPorts() []*gwPort { return g.gatewayMerge().ports }

func (g *gen) gatewayMerge() *gatewayMerge {
	if g.gw.merge != nil {
		return g.gw.merge
	}
	gws := g.pc.ProxyGateways(g.p)
	listen := map[uint32]uint32{}
	for _, gw := range gws {
		for _, s := range gw.Spec.GetServers() {
			n := s.GetPort().GetNumber()
			if _, ok := listen[n]; s.GetPort() != nil && !ok {
				listen[n] = g.gatewayListenerPort(n)
			}
		}
	}
	// Labels come from the proxy: quoted, so that no proxy can make its
	// key another's.
	var key strings.Builder
	key.WriteString("gateways|")
	for _, k := range slices.Sorted(maps.Keys(g.p.Labels)) {
		key.WriteString(strconv.Quote(k) + "=" + strconv.Quote(g.p.Labels[k]) + ",")
	}
	// The Gateways selected by Service rather than labels depend on the
	// proxy's instances: name every Gateway selected.
	key.WriteString("|")
	for _, gw := range gws {
		key.WriteString(strconv.Quote(gw.Key()) + ",")
	}
	key.WriteString("|")
	for _, n := range slices.Sorted(maps.Keys(listen)) {
		key.WriteString(itoa(n) + ">" + itoa(listen[n]) + ",")
	}
	m := g.pc.Memo(key.String(), func() any {
		b := g.isolated()
		m := b.mergeGateways(gws, listen)
		m.problems = b.problems
		return m
	}).(*gatewayMerge)
	for _, p := range m.problems {
		g.problem("%s", p)
	}
	g.gw.merge = m
	return m
}

// mergeGateways merges the servers of Gateways by listener port: the
// Gateway's port number, or the target port of the proxy's service port
// with that number (listen, Istio's resolvePorts). Plaintext HTTP
// servers on one port share the route "http.<port>"; a port is plaintext
// or TLS, never both, and holds one TCP server; a TLS host appears once
// per port. Servers that break these rules are left out, reported.
func (g *gen) mergeGateways(gws []*model.Gateway, listen map[uint32]uint32) *gatewayMerge {
	byPort := map[uint32]*gwPort{}
	out := []*gwPort{}
	for _, gw := range gws {
		for i, s := range gw.Spec.GetServers() {
			where := func() string { return fmt.Sprintf("Gateway %s server %d", gw.Key(), i) }
			if s.GetPort() == nil {
				continue
			}
			if s.GetBind() != "" {
				g.problem("%s: bind %q is not supported; the server listens on all addresses", where(), s.GetBind())
			}
			gs := gwServer{gw: gw, key: gw.Key(), srv: s, hosts: make([]gwHost, 0, len(s.GetHosts()))}
			for _, h := range s.GetHosts() {
				ns, host, ok := strings.Cut(h, "/")
				switch {
				case !ok:
					ns, host = "*", h
				case ns == ".":
					ns = gw.Namespace
				}
				gs.hosts = append(gs.hosts, gwHost{ns: ns, host: host})
			}
			port := listen[s.GetPort().GetNumber()]
			gp := byPort[port]
			if gp == nil {
				gp = &gwPort{port: port, sniSeen: map[string]bool{}, routes: map[string]bool{}}
				byPort[port] = gp
				out = append(out, gp)
			}
			proto := registry.ParseProtocol(s.GetPort().GetProtocol())
			if isTLSServer(s) {
				if len(gp.plain) > 0 {
					g.problem("%s: port %d already has plaintext servers; left out", where(), port)
					continue
				}
				gs.sni = sniHosts(s)
				var dup []string
				for _, h := range gs.sni {
					if gp.sniSeen[h] {
						dup = append(dup, h)
					}
				}
				if len(dup) > 0 {
					g.problem("%s: host %s already has a TLS server on port %d; left out", where(), strings.Join(dup, ", "), port)
					continue
				}
				for _, h := range gs.sni {
					gp.sniSeen[h] = true
				}
				if proto == registryv1.Protocol_PROTOCOL_HTTPS && !passthrough(s) {
					gs.route = "https." + itoa(s.GetPort().GetNumber()) + "." + s.GetPort().GetName() + "." + gw.Name + "." + gw.Namespace
					if gp.routes[gs.route] {
						g.problem("%s: another HTTPS server of the Gateway has port name %q on port %d; left out", where(), s.GetPort().GetName(), port)
						continue
					}
					gp.routes[gs.route] = true
				}
				gp.tls = append(gp.tls, gs)
				continue
			}
			if len(gp.tls) > 0 {
				g.problem("%s: port %d already has TLS servers; left out", where(), port)
				continue
			}
			mergeable := isHTTP(proto) && len(gp.plain) > 0 && gp.plain[0].route != ""
			if len(gp.plain) > 0 && !mergeable {
				g.problem("%s: port %d already has a %s server; protocol %s cannot share it; left out", where(), port, gp.plain[0].srv.GetPort().GetProtocol(), s.GetPort().GetProtocol())
				continue
			}
			if isHTTP(proto) {
				gs.route = "http." + itoa(port)
			}
			gp.plain = append(gp.plain, gs)
		}
	}
	slices.SortFunc(out, func(a, b *gwPort) int { return int(a.port) - int(b.port) })
	m := &gatewayMerge{ports: out, routes: map[string][]*gwServer{}}
	for _, gp := range out {
		for _, servers := range [][]gwServer{gp.plain, gp.tls} {
			for i := range servers {
				srv := &servers[i]
				if srv.route == "" {
					continue
				}
				if _, ok := m.routes[srv.route]; !ok {
					m.routeNames = append(m.routeNames, srv.route)
				}
				m.routes[srv.route] = append(m.routes[srv.route], srv)
			}
		}
	}
	return m
}

// gatewayListenerPort is where a server port listens: the target port of
// the gateway workload's service port with that number, else the number.
func (g *gen) gatewayListenerPort(n uint32) uint32 {
	for _, in := range g.pc.Instances(g.p) {
		if sp := servicePort(in.Service, n); sp != nil {
			if target, ok := endpointPort(in.Endpoint, sp); ok {
				return target
			}
		}
	}
	return n
}

// isTLSServer: a server with TLS settings whose protocol is not plaintext
// HTTP (an HTTP server's tls holds httpsRedirect only).
func isTLSServer(s *networking.Server) bool {
	return s.GetTls() != nil && !isHTTP(registry.ParseProtocol(s.GetPort().GetProtocol()))
}

func passthrough(s *networking.Server) bool {
	m := s.GetTls().GetMode()
	return m == networking.ServerTLSSettings_PASSTHROUGH || m == networking.ServerTLSSettings_AUTO_PASSTHROUGH
}

// sniHosts are a TLS server's hosts without their namespaces, sorted.
func sniHosts(s *networking.Server) []string {
	var out []string
	for _, h := range s.GetHosts() {
		if _, host, ok := strings.Cut(h, "/"); ok {
			h = host
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// serverNames is a filter chain's SNI match: none when a host is "*".
func serverNames(hosts []string) []string {
	if slices.Contains(hosts, "*") {
		return nil
	}
	return hosts
}

// gatewayListeners are a gateway proxy's listeners, "0.0.0.0_<port>".
func (g *gen) gatewayListeners() []*listenerv3.Listener {
	var out []*listenerv3.Listener
	for _, gp := range g.gatewayPorts() {
		name := "0.0.0.0_" + itoa(gp.port)
		l := &listenerv3.Listener{
			Name: name, Address: socketAddress("0.0.0.0", gp.port), TrafficDirection: corev3.TrafficDirection_OUTBOUND,
			AccessLog: g.accessLogs(model.ClientMode, listenerLog),
		}
		if len(gp.plain) > 0 {
			s := gp.plain[0]
			if s.route != "" {
				l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
					Name:    "http." + itoa(gp.port),
					Filters: []*listenerv3.Filter{g.gatewayHCMFilter("outbound_0.0.0.0_"+itoa(gp.port), s.route, gp.port)},
				})
			} else if fs := g.gatewayTCP(s); fs != nil {
				l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{Name: "tcp." + itoa(gp.port), Filters: fs})
			}
		}
		for _, s := range gp.tls {
			l.FilterChains = append(l.FilterChains, g.gatewayTLSChains(s, gp)...)
		}
		if len(l.FilterChains) == 0 {
			g.problem("listener %s: no server on the port has anything to serve; left out", name)
			continue
		}
		// The PROXY protocol header a load balancer in front sends is
		// read first, when the gateway topology says one does (Istio's
		// needPROXYProtocol).
		if g.p.EffectiveProxyConfig(g.pc.Mesh).GetGatewayTopology().GetProxyProtocol() != nil {
			l.ListenerFilters = append(l.ListenerFilters, &listenerv3.ListenerFilter{Name: "envoy.filters.listener.proxy_protocol", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&listenerproxyprotocolv3.ProxyProtocol{})}})
		}
		if len(gp.tls) > 0 {
			l.ListenerFilters = append(l.ListenerFilters, &listenerv3.ListenerFilter{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}})
		}
		out = append(out, l)
	}
	return out
}

// gatewayTLSChains are the filter chains of one TLS server: terminated
// HTTPS (the server's route configuration) or TLS (its VirtualServices'
// tcp routes), PASSTHROUGH (one chain per tls route, by SNI), or
// AUTO_PASSTHROUGH (one chain per service port and subset, by the SNI
// mesh clients send: "outbound_.<port>_.<subset>_.<host>").
func (g *gen) gatewayTLSChains(s gwServer, gp *gwPort) []*listenerv3.FilterChain {
	where := fmt.Sprintf("Gateway %s port %d", s.key, s.srv.GetPort().GetNumber())
	switch s.srv.GetTls().GetMode() {
	case networking.ServerTLSSettings_PASSTHROUGH:
		return g.passthroughChains(s)
	case networking.ServerTLSSettings_AUTO_PASSTHROUGH:
		return g.autoPassthroughChains(s)
	}
	ts, err := g.gatewayDownstreamTLS(s)
	if err != nil {
		g.problem("%s: %v; server left out", where, err)
		return nil
	}
	fc := &listenerv3.FilterChain{
		FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: serverNames(s.sni)},
		TransportSocket:  ts,
	}
	if s.route != "" {
		fc.Name = s.route
		fc.Filters = []*listenerv3.Filter{g.gatewayHCMFilter(cmp.Or(s.srv.GetName(), "outbound_0.0.0.0_"+itoa(gp.port)), s.route, gp.port)}
		return []*listenerv3.FilterChain{fc}
	}
	fs := g.gatewayTCP(s)
	if fs == nil {
		return nil
	}
	fc.Name = "tls." + itoa(gp.port) + "." + s.srv.GetPort().GetName() + "." + s.key
	fc.Filters = fs
	return []*listenerv3.FilterChain{fc}
}

// gatewayHCM is a gateway's HTTP connection manager, as Istio's
// buildGatewayConnectionManager: the client address from the connection
// (use_remote_address, no trusted hops), client certificate details
// sanitised and set, the workload's authorization and the extensions of
// the port, then fault, CORS and the router.
func (g *gen) gatewayHCM(statPrefix, route string, port uint32) *hcmv3.HttpConnectionManager {
	hcm := g.httpConnectionManager(statPrefix, route, port, g.workloadAuthz())
	hcm.UseRemoteAddress = wrapperspb.Bool(true)
	// A gateway's server header is Istio's, as inbound.
	ph := g.proxyHeaders(gatewayClass)
	hcm.ServerName, hcm.ServerHeaderTransformation = ph.serverName, ph.serverTransformation
	// The proxy config's gateway topology: the proxies in front of the
	// gateway whose X-Forwarded-For entries are trusted, and what is
	// done with a client certificate's details (Istio's
	// buildGatewayConnectionManager; SANITIZE_SET by default).
	topo := g.p.EffectiveProxyConfig(g.pc.Mesh).GetGatewayTopology()
	hcm.XffNumTrustedHops = topo.GetNumTrustedProxies()
	hcm.ForwardClientCertDetails = hcmv3.HttpConnectionManager_SANITIZE_SET
	if f := topo.GetForwardClientCertDetails(); f != meshv1alpha1.ForwardClientCertDetails_UNDEFINED {
		// The enums differ by one: the mesh's has UNDEFINED first
		// (Istio's MeshConfigToEnvoyForwardClientCertDetails).
		hcm.ForwardClientCertDetails = hcmv3.HttpConnectionManager_ForwardClientCertDetails(f - 1)
	}
	if d := hcm.GetForwardClientCertDetails(); d == hcmv3.HttpConnectionManager_SANITIZE_SET || d == hcmv3.HttpConnectionManager_APPEND_FORWARD {
		hcm.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Cert: true, Dns: true, Uri: true}
	}
	return hcm
}

// hcmTail is what every gateway HTTP connection manager of a proxy
// shares (all of gatewayHCM but the stat prefix and the RDS route),
// encoded once, with its validation and consistency check.
type hcmTail struct {
	typeURL string
	raw     []byte
	err     error
	// statPrefix and rds are the field numbers of what differs.
	statPrefix, rds protowire.Number
}

// gatewayHCMFilter is gatewayHCM(statPrefix, route, port) as a network filter.
// A gateway has one per HTTP server (Istio's benchmark: a thousand), and
// they differ only in the stat prefix and the RDS route. protobuf-go's
// deterministic encoding writes the fields outside a oneof by number,
// then the oneofs' (LegacyFieldOrder): the stat prefix (field 2; codec
// type, field 1, is AUTO and not written), the shared fields, then rds
// (the route_specifier oneof; the gateway's connection managers set no
// other oneof). So the shared part is built, validated, checked and
// encoded once per generator, and each filter is its two fields around
// it: byte for byte the encoding of the whole message
// (TestGatewayHTTPConnectionManagersEncodeAsTheWholeMessage).
func (g *gen) gatewayHCMFilter(statPrefix, route string, port uint32) *listenerv3.Filter {
	// Ports whose extensions are the same share a tail.
	var key strings.Builder
	for _, e := range g.chainExtensions(model.ClientMode, port, false) {
		key.WriteString(e.ResourceName + ";")
	}
	t := g.gw.hcm[key.String()]
	if t == nil {
		t = g.gatewayHCMTail(port)
		if g.gw.hcm == nil {
			g.gw.hcm = map[string]*hcmTail{}
		}
		g.gw.hcm[key.String()] = t
	}
	rds := &hcmv3.Rds{ConfigSource: adsSource(), RouteConfigName: route}
	if err := (&hcmv3.HttpConnectionManager{StatPrefix: statPrefix, RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: rds}}).Validate(); err != nil {
		g.packErrs++
	}
	rdsRaw, err := proto.MarshalOptions{Deterministic: true}.Marshal(rds)
	if err != nil {
		g.packErrs++
	}
	raw := make([]byte, 0, len(statPrefix)+len(t.raw)+len(rdsRaw)+8)
	raw = protowire.AppendString(protowire.AppendTag(raw, t.statPrefix, protowire.BytesType), statPrefix)
	raw = append(raw, t.raw...)
	raw = protowire.AppendBytes(protowire.AppendTag(raw, t.rds, protowire.BytesType), rdsRaw)
	a := &anypb.Any{TypeUrl: t.typeURL, Value: raw}
	check := t.err
	if check == nil && !g.routeKnown(route) {
		check = fmt.Errorf("RDS names unknown route configuration %q", route)
	}
	if g.filterChecks == nil {
		g.filterChecks = map[*anypb.Any]error{}
	}
	g.filterChecks[a] = check
	return &listenerv3.Filter{Name: hcmFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}
}

func (g *gen) gatewayHCMTail(port uint32) *hcmTail {
	full := g.gatewayHCM("-", "-", port)
	fields := full.ProtoReflect().Descriptor().Fields()
	t := &hcmTail{
		typeURL:    "type.googleapis.com/" + string(full.ProtoReflect().Descriptor().FullName()),
		statPrefix: fields.ByName("stat_prefix").Number(),
		rds:        fields.ByName("rds").Number(),
	}
	if t.err = full.Validate(); t.err != nil {
		g.packErrs++
	}
	full.StatPrefix, full.RouteSpecifier = "", nil
	if t.err == nil {
		t.err = g.checkHCM(full)
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(full)
	if err != nil {
		g.packErrs++
		t.err = cmp.Or(t.err, err)
	}
	t.raw = raw
	return t
}

// gatewayTCP forwards a plaintext TCP server's or a terminated TLS
// server's connections as the first tcp route of its VirtualServices that
// applies (port and gateways), after the workload's authorization; nil
// (reported) when none does.
func (g *gen) gatewayTCP(s gwServer) []*listenerv3.Filter {
	port := s.srv.GetPort().GetNumber()
	for _, vs := range g.pc.GatewayVirtualServices(s.key, g.p.Namespace) {
		if len(g.matchingHosts(&s, vs)) == 0 {
			continue
		}
		for _, r := range vs.Spec.GetTcp() {
			if len(r.GetRoute()) == 0 || !l4Matches(r.GetMatch(), port, s.key) {
				continue
			}
			clusters := g.gatewayDestinations(r.GetRoute(), vs, port)
			if len(clusters) == 0 {
				continue
			}
			return append(g.policyNetworkFilters(g.workloadAuthz(), model.ClientMode, port), g.tcpForward(model.ClientMode, "outbound_0.0.0.0_"+itoa(port), clusters)...)
		}
	}
	g.problem("Gateway %s port %d (%s): no VirtualService tcp route for it; server left out", s.key, port, s.srv.GetPort().GetProtocol())
	return nil
}

// passthroughChains route a PASSTHROUGH server's connections by SNI: one
// chain per tls route match of its VirtualServices (sniHosts), to the
// route's destinations, the TLS untouched.
func (g *gen) passthroughChains(s gwServer) []*listenerv3.FilterChain {
	port := s.srv.GetPort().GetNumber()
	var out []*listenerv3.FilterChain
	seen := map[string]bool{}
	for _, vs := range g.pc.GatewayVirtualServices(s.key, g.p.Namespace) {
		if len(g.matchingHosts(&s, vs)) == 0 {
			continue
		}
		for i, r := range vs.Spec.GetTls() {
			if len(r.GetRoute()) == 0 {
				continue
			}
			for _, m := range r.GetMatch() {
				if !l4Matches([]*networking.L4MatchAttributes{{Port: m.GetPort(), Gateways: m.GetGateways()}}, port, s.key) {
					continue
				}
				if slices.ContainsFunc(m.GetSniHosts(), func(h string) bool { return seen[h] }) {
					g.problem("VirtualService %s/%s tls route %d: an SNI host of %v is routed already on port %d; left out", vs.Namespace, vs.Name, i, m.GetSniHosts(), port)
					continue
				}
				clusters := g.gatewayDestinations(r.GetRoute(), vs, port)
				if len(clusters) == 0 {
					continue
				}
				for _, h := range m.GetSniHosts() {
					seen[h] = true
				}
				hosts := slices.Clone(m.GetSniHosts())
				slices.Sort(hosts)
				out = append(out, &listenerv3.FilterChain{
					Name:             "passthrough." + itoa(port) + "." + strings.Join(hosts, ","),
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: serverNames(hosts)},
					Filters:          append(g.policyNetworkFilters(g.workloadAuthz(), model.ClientMode, port), g.tcpForward(model.ClientMode, "outbound_0.0.0.0_"+itoa(port), clusters)...),
				})
			}
		}
	}
	return out
}

// autoPassthroughChains route mesh mTLS by the SNI a client sets for a
// service port (and subset): one chain per visible mesh-internal service
// port whose host the server lists, to the SNI-named cluster, which
// carries no TLS of its own (the client's mTLS passes through).
func (g *gen) autoPassthroughChains(s gwServer) []*listenerv3.FilterChain {
	var out []*listenerv3.FilterChain
	hosts := s.sni
	for _, svc := range g.scope.Services() {
		if svc.GetLocation() == registryv1.Location_LOCATION_MESH_EXTERNAL || !slices.ContainsFunc(hosts, func(h string) bool { return model.HostMatches(h, svc.GetHostname()) }) {
			continue
		}
		dr := g.scope.DestinationRule(g.p, svc)
		for _, port := range svc.GetPorts() {
			subsets := []string{""}
			for _, ss := range drSpec(dr).GetSubsets() {
				subsets = append(subsets, ss.GetName())
			}
			for _, ss := range subsets {
				name := SNIDNATClusterName(port.GetNumber(), ss, svc.GetHostname())
				if !g.clusterOK(name) {
					continue
				}
				out = append(out, &listenerv3.FilterChain{
					Name:             name,
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{name}, ApplicationProtocols: istioMTLSALPN()},
					Filters:          append(g.policyNetworkFilters(g.workloadAuthz(), model.ClientMode, s.srv.GetPort().GetNumber()), g.tcpForward(model.ClientMode, name, single(name))...),
				})
			}
		}
	}
	return out
}

// SNIDNATClusterName is the name (and the SNI) of an AUTO_PASSTHROUGH
// cluster: "outbound_.<port>_.<subset>_.<host>".
func SNIDNATClusterName(port uint32, subset, host string) string {
	return "outbound_." + itoa(port) + "_." + subset + "_." + host
}

// parseSNIDNATClusterName reads SNIDNATClusterName.
func parseSNIDNATClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, found := strings.CutPrefix(name, "outbound_.")
	if !found {
		return 0, "", "", false
	}
	parts := strings.SplitN(rest, "_.", 3)
	if len(parts) != 3 {
		return 0, "", "", false
	}
	n, err := strconv.ParseUint(parts[0], 10, 16)
	if err != nil || n == 0 {
		return 0, "", "", false
	}
	return uint32(n), parts[1], parts[2], true
}

// gatewayDestinations are the weighted clusters of TCP or TLS route
// destinations the proxy has.
func (g *gen) gatewayDestinations(routes []*networking.RouteDestination, vs *model.VirtualService, port uint32) []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight {
	var out []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight
	for _, d := range routes {
		if len(routes) > 1 && d.GetWeight() == 0 {
			continue
		}
		name, _, ok := g.destination(d.GetDestination(), vs, &registryv1.ServicePort{Number: port})
		if !ok {
			continue
		}
		out = append(out, &tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{Name: name, Weight: uint32(max(d.GetWeight(), 1))})
	}
	return out
}

// l4Matches: a route without matches applies; else one match whose port
// (if any) is the server's and whose gateways (if any) name the Gateway.
func l4Matches(ms []*networking.L4MatchAttributes, port uint32, gateway string) bool {
	if len(ms) == 0 {
		return true
	}
	for _, m := range ms {
		if (m.GetPort() == 0 || m.GetPort() == port) && (len(m.GetGateways()) == 0 || slices.Contains(m.GetGateways(), gateway)) {
			return true
		}
	}
	return false
}

// matchingHosts are the hosts a VirtualService serves on a server: its
// hosts intersected with the server's hosts open to its namespace, each
// the narrower of the two names (Istio's host intersection).
func (g *gen) matchingHosts(s *gwServer, vs *model.VirtualService) []string {
	out := make([]string, 0, len(vs.Spec.GetHosts()))
	for _, sh := range s.hosts {
		if sh.ns != "*" && sh.ns != vs.Namespace {
			continue
		}
		for _, vh := range vs.Spec.GetHosts() {
			switch {
			case model.HostMatches(sh.host, vh):
				out = append(out, vh)
			case model.HostMatches(vh, sh.host):
				out = append(out, sh.host)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// gatewayRoute is the route configuration of a gateway's HTTP servers
// ("http.<port>") or of one HTTPS server, as Istio's
// buildGatewayHTTPRouteConfig: a virtual host per host the
// VirtualServices bound to its servers serve there (their routes in
// order, several VirtualServices' for one host one after another), with
// httpsRedirect's servers requiring TLS; without any, a "blackhole" host
// that answers 404. Hosts left with the same routes are then collapsed
// into one virtual host (collapseRoutes).
func (g *gen) gatewayRoute(name string) *routev3.RouteConfiguration {
	servers := g.gatewayMerge().routes[name]
	if len(servers) == 0 {
		return nil
	}
	// vhosts are the hosts in the order met, byHost their indexes.
	n := 0
	for _, s := range servers {
		n += len(s.hosts)
	}
	vhosts := make([]gwVHost, 0, n)
	byHost := make(map[string]int, n)
	host := func(h string, port uint32) *gwVHost {
		i, ok := byHost[h]
		if !ok {
			i = len(vhosts)
			byHost[h] = i
			vhosts = append(vhosts, gwVHost{host: h, port: port})
		}
		return &vhosts[i]
	}
	for _, s := range servers {
		port := s.srv.GetPort().GetNumber()
		redirect := s.srv.GetTls().GetHttpsRedirect()
		for _, vs := range g.pc.GatewayVirtualServices(s.key, g.p.Namespace) {
			matched := g.matchingHosts(s, vs)
			if len(matched) == 0 {
				continue
			}
			routes := g.gatewayVSRoutes(s.key, vs, port)
			for _, h := range matched {
				vh := host(strings.ToLower(h), port)
				if vh.routes == nil {
					vh.routes = slices.Clip(routes) // shared until appended to
				} else {
					vh.routes = append(vh.routes, routes...)
				}
				vh.requireTLS = vh.requireTLS || redirect
			}
		}
		if redirect {
			for _, sh := range s.hosts {
				host(strings.ToLower(sh.host), port).requireTLS = true
			}
		}
	}
	var vhs []*routev3.VirtualHost
	if len(vhosts) == 0 {
		vhs = []*routev3.VirtualHost{{Name: "blackhole:" + itoa(servers[0].srv.GetPort().GetNumber()), Domains: []string{"*"}}}
	} else {
		vhs = collapseRoutes(vhosts)
		sortByName(vhs)
	}
	// Envoy's x-envoy-attempt-count, as Istio's gateway virtual hosts.
	for _, vh := range vhs {
		vh.IncludeRequestAttemptCount = g.proxyHeaders(gatewayClass).attemptCount
	}
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: vhs, ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true}
}

// gwVHost is a host of a gateway route configuration being built.
type gwVHost struct {
	host       string
	port       uint32
	routes     []*routev3.Route
	requireTLS bool
}

// gatewayVSRoutes are a VirtualService's routes on a Gateway's server
// port, built once per generator (as Istio builds them once per Gateway
// and VirtualService), and once for all ports when they cannot differ
// between ports (portFree): a Gateway's HTTP and HTTPS servers for the
// same hosts share them.
func (g *gen) gatewayVSRoutes(gw string, vs *model.VirtualService, port uint32) []*routev3.Route {
	free := gwVSKey{gw: gw, vs: vs}
	if routes, ok := g.gw.vsRoutes[free]; ok {
		return routes // port-free, built for another port
	}
	key := gwVSKey{gw: gw, vs: vs, port: port}
	if routes, ok := g.gw.vsRoutes[key]; ok {
		return routes
	}
	if g.portFree(vs) {
		key = free
	}
	for _, p := range vs.GetProblems() {
		g.problem("VirtualService %s/%s: %s", vs.Namespace, vs.Name, p)
	}
	routes := g.vsRoutes(vs, nil, &registryv1.ServicePort{Number: port}, gw)
	if g.gw.vsRoutes == nil {
		g.gw.vsRoutes = map[gwVSKey][]*routev3.Route{}
	}
	g.gw.vsRoutes[key] = routes
	return routes
}

type gwVSKey struct {
	gw   string
	vs   *model.VirtualService
	port uint32
}

// portFree reports whether a VirtualService's routes are the same on
// every port. vsRoutes reads the port in two places only: matches that
// name a port (applicableMatches), and destinations that name none, of a
// service with several ports (destination), for routes and mirrors.
func (g *gen) portFree(vs *model.VirtualService) bool {
	fixed := func(d *networking.Destination) bool {
		if d == nil || d.GetPort().GetNumber() != 0 {
			return true
		}
		svc := g.scope.Service(model.ResolveHost(d.GetHost(), vs.Namespace, g.pc.DomainSuffix))
		return len(svc.GetPorts()) <= 1
	}
	for _, hr := range vs.Spec.GetHttp() {
		for _, m := range hr.GetMatch() {
			if m.GetPort() != 0 {
				return false
			}
		}
		for _, d := range hr.GetRoute() {
			if !fixed(d.GetDestination()) {
				return false
			}
		}
		if !fixed(hr.GetMirror()) {
			return false
		}
		for _, m := range hr.GetMirrors() {
			if !fixed(m.GetDestination()) {
				return false
			}
		}
	}
	return true
}

// collapseRoutes makes the virtual hosts, merging the hosts that have
// the same routes (the same route objects, in order) and the same TLS
// requirement into one with all their domains, as Istio's
// collapseDuplicateRoutes (PILOT_ENABLE_ROUTE_COLLAPSE_OPTIMIZATION, on
// by default): a VirtualService for three hosts gives one virtual host,
// not three copies of its routes. Hosts are taken most specific first
// (Istio's host.MoreSpecific: names before wildcards, longer first, then
// alphabetical), and the first of a group names the virtual host.
// Catch-all routes go last (catchAllLast).
func collapseRoutes(vhosts []gwVHost) []*routev3.VirtualHost {
	order := make([]*gwVHost, len(vhosts))
	for i := range vhosts {
		order[i] = &vhosts[i]
		order[i].routes = catchAllLast(order[i].routes)
	}
	slices.SortFunc(order, func(a, b *gwVHost) int { return moreSpecificFirst(a.host, b.host) })
	// First the groups: each host's is the first host before it with
	// the same routes and TLS requirement, or its own. Leaders with the
	// same first route, number of routes and requirement are chained
	// (byKey the latest, prev the one before), and a host is compared
	// with those only.
	type groupKey struct {
		first *routev3.Route
		n     int
		tls   bool
	}
	byKey := make(map[groupKey]int, len(order))
	prev := make([]int, len(order))
	group := make([]int, len(order))
	size := make([]int, len(order))
	for i, vh := range order {
		k := groupKey{n: len(vh.routes), tls: vh.requireTLS}
		if k.n > 0 {
			k.first = vh.routes[0]
		}
		group[i] = i
		last, ok := byKey[k]
		for j := last; ok && j >= 0; j = prev[j] {
			if slices.Equal(order[j].routes, vh.routes) {
				group[i] = j
				break
			}
		}
		if group[i] == i {
			prev[i] = -1
			if ok {
				prev[i] = last
			}
			byKey[k] = i
		}
		size[group[i]]++
	}
	out := make([]*routev3.VirtualHost, 0, len(order))
	made := make([]*routev3.VirtualHost, len(order))
	for i, vh := range order {
		j := group[i]
		if j != i {
			made[j].Domains = append(made[j].Domains, vh.host)
			continue
		}
		tls := routev3.VirtualHost_NONE
		if vh.requireTLS {
			tls = routev3.VirtualHost_ALL
		}
		domains := make([]string, 1, size[i])
		domains[0] = vh.host
		made[i] = &routev3.VirtualHost{Name: vh.host + ":" + itoa(vh.port), Domains: domains, Routes: vh.routes, RequireTls: tls}
		out = append(out, made[i])
	}
	return out
}

// moreSpecificFirst orders hosts as Istio's host.Names sort: names
// before wildcards, longer before shorter, then alphabetically.
func moreSpecificFirst(a, b string) int {
	aw, bw := strings.HasPrefix(a, "*"), strings.HasPrefix(b, "*")
	switch {
	case aw != bw:
		if aw {
			return 1
		}
		return -1
	case len(a) != len(b):
		return len(b) - len(a)
	}
	return strings.Compare(a, b)
}

// catchAllLast moves the routes that match every request after the
// others, keeping each group's order (Istio's SortVHostRoutes): with
// several VirtualServices on one host, one's catch-all must not hide
// another's specific routes.
func catchAllLast(routes []*routev3.Route) []*routev3.Route {
	catchAll := func(r *routev3.Route) bool {
		m := r.GetMatch()
		return (m.GetPrefix() == "/" || m.GetPathSeparatedPrefix() == "/" || m.GetSafeRegex().GetRegex() == ".*") &&
			len(m.GetHeaders()) == 0 && len(m.GetQueryParameters()) == 0 && len(m.GetDynamicMetadata()) == 0
	}
	// Already in order (catch-alls, if any, only at the end): as is.
	first := slices.IndexFunc(routes, catchAll)
	if first < 0 || !slices.ContainsFunc(routes[first:], func(r *routev3.Route) bool { return !catchAll(r) }) {
		return routes
	}
	out := make([]*routev3.Route, 0, len(routes))
	var last []*routev3.Route
	for _, r := range routes {
		if catchAll(r) {
			last = append(last, r)
		} else {
			out = append(out, r)
		}
	}
	return append(out, last...)
}

// gatewayRouteNames are the route configurations of a gateway proxy.
func (g *gen) gatewayRouteNames() []string { return g.gatewayMerge().routeNames }

// gatewayDownstreamTLS terminates a server's TLS, as Istio's
// BuildListenerTLSContext: SIMPLE the credentialName's certificate,
// MUTUAL also its CA and client certificates required, OPTIONAL_MUTUAL
// verified when given, ISTIO_MUTUAL the workload certificate and mesh
// roots from the agent; ALPN h2 and http/1.1 for HTTPS; TLS 1.2 at least
// unless minProtocolVersion says otherwise; cipher suites and
// subjectAltNames as given.
func (g *gen) gatewayDownstreamTLS(s gwServer) (*corev3.TransportSocket, error) {
	t := s.srv.GetTls()
	// Servers with the same settings share one socket (Istio's benchmark
	// has a thousand ISTIO_MUTUAL servers).
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("tls settings: %w", err)
	}
	key := s.srv.GetPort().GetProtocol() + "|" + string(raw)
	if ts, ok := g.gw.tls[key]; ok {
		return ts, nil
	}
	ts, err := g.buildGatewayTLS(s)
	if err == nil {
		if g.gw.tls == nil {
			g.gw.tls = map[string]*corev3.TransportSocket{}
		}
		g.gw.tls[key] = ts
	}
	return ts, err
}

func (g *gen) buildGatewayTLS(s gwServer) (*corev3.TransportSocket, error) {
	t := s.srv.GetTls()
	common := &tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
		TlsMinimumProtocolVersion: tlsVersion(t.GetMinProtocolVersion(), tlsv3.TlsParameters_TLSv1_2),
		TlsMaximumProtocolVersion: tlsVersion(t.GetMaxProtocolVersion(), tlsv3.TlsParameters_TLS_AUTO),
		CipherSuites:              t.GetCipherSuites(),
	}}
	if registry.ParseProtocol(s.srv.GetPort().GetProtocol()) == registryv1.Protocol_PROTOCOL_HTTPS {
		common.AlpnProtocols = []string{"h2", "http/1.1"}
	}
	ctx := &tlsv3.DownstreamTlsContext{CommonTlsContext: common}
	validation := &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: sanMatchers(t.GetSubjectAltNames())}
	switch t.GetMode() {
	case networking.ServerTLSSettings_ISTIO_MUTUAL:
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{{Name: SecretWorkload, SdsConfig: sdsSource()}}
		common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: validation, ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: SecretRoot, SdsConfig: sdsSource()},
		}}
		ctx.RequireClientCertificate = wrapperspb.Bool(true)
	case networking.ServerTLSSettings_SIMPLE, networking.ServerTLSSettings_MUTUAL, networking.ServerTLSSettings_OPTIONAL_MUTUAL:
		// credentialNames (an RSA and an ECDSA certificate, say) over
		// credentialName, as Istio's BuildListenerTLSContext reads them.
		cns := t.GetCredentialNames()
		if len(cns) == 0 && t.GetCredentialName() != "" {
			cns = []string{t.GetCredentialName()}
		}
		if len(cns) == 0 {
			return nil, fmt.Errorf("tls mode %s needs credentialName (serverCertificate files are not supported)", t.GetMode())
		}
		cn := cns[0]
		for _, n := range cns {
			common.TlsCertificateSdsSecretConfigs = append(common.TlsCertificateSdsSecretConfigs, &tlsv3.SdsSecretConfig{Name: credentialSDSName(n), SdsConfig: adsSource()})
		}
		if t.GetMode() != networking.ServerTLSSettings_SIMPLE {
			// The clients' CA: caCertCredentialName when set (the Gateway
			// API's frontend validation), else "<credentialName>-cacert"
			// (Istio's BuildListenerTLSContext).
			caName := credentialSDSName(cn) + credentialCASuffix
			if ca := t.GetCaCertCredentialName(); strings.HasPrefix(ca, registry.GatewayCredentialPrefix) || strings.HasPrefix(ca, registry.ConfigMapCredentialPrefix) {
				caName = ca
			}
			common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: validation, ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: caName, SdsConfig: adsSource()},
			}}
			ctx.RequireClientCertificate = wrapperspb.Bool(t.GetMode() == networking.ServerTLSSettings_MUTUAL)
		}
	default:
		return nil, fmt.Errorf("tls mode %s cannot terminate TLS", t.GetMode())
	}
	return g.tlsSocket(ctx), nil
}

// tlsVersion maps Istio's TLS protocol enum onto Envoy's (the same
// order), def for TLS_AUTO.
func tlsVersion(v networking.ServerTLSSettings_TLSProtocol, def tlsv3.TlsParameters_TlsProtocol) tlsv3.TlsParameters_TlsProtocol {
	if v == networking.ServerTLSSettings_TLS_AUTO {
		return def
	}
	return tlsv3.TlsParameters_TlsProtocol(v)
}

// sniDNATCluster is an AUTO_PASSTHROUGH gateway's cluster for a service
// port and subset: the outbound cluster under the SNI name, without the
// TLS it would originate (the client's mTLS passes through), as Istio's
// buildOutboundSniDnatClusters.
func (g *gen) sniDNATCluster(name string, port uint32, subset, host string) *builtCluster {
	base := g.cluster(ClusterName(outbound, port, subset, host))
	if base == nil {
		return nil
	}
	c := proto.Clone(base.c).(*clusterv3.Cluster)
	c.Name = name
	c.TransportSocket, c.TransportSocketMatches = nil, nil
	if lb := c.GetLoadAssignment(); lb != nil {
		lb.ClusterName = name
	}
	return &builtCluster{c: c, svc: base.svc, port: base.port, subset: base.subset, dr: base.dr}
}

// patchContexts: GATEWAY for everything a gateway has.
// gatewayCredentials: the certificateRefs of the Gateway API Gateways
// that configure the proxy from its own namespace, for Secrets of the
// namespace the Gateway was converted in (Istio's MergeGateways,
// same-namespace trust: the proxy's for a Gateway's listeners, the set's
// for a ListenerSet's, whose parent admitted it by allowedListeners),
// with their CA names for servers that validate clients, and those of
// other namespaces that ReferenceGrants admit (model.Gateway.Granted;
// Istio's SecretAllowed). A ConfigMap's CA needs none of this: it is
// public (Secrets).
func (router) gatewayCredentials(g *gen) map[string]bool {
	out := map[string]bool{}
	for _, gw := range g.pc.ProxyGateways(g.p) {
		if gw.GatewayNamespace() != g.p.VerifiedNamespace {
			continue
		}
		ns := gw.Namespace
		for _, n := range gw.Granted {
			if strings.HasPrefix(n, registry.GatewayCredentialPrefix) {
				out[n] = true
			}
		}
		for _, s := range gw.Spec.GetServers() {
			for _, cn := range append([]string{s.GetTls().GetCredentialName()}, s.GetTls().GetCredentialNames()...) {
				rest, ok := strings.CutPrefix(cn, registry.GatewayCredentialPrefix)
				if sns, _, _ := strings.Cut(rest, "/"); !ok || sns != ns {
					continue
				}
				out[cn] = true
				if m := s.GetTls().GetMode(); m == networking.ServerTLSSettings_MUTUAL || m == networking.ServerTLSSettings_OPTIONAL_MUTUAL {
					out[cn+credentialCASuffix] = true
				}
			}
			if ca := s.GetTls().GetCaCertCredentialName(); strings.HasPrefix(ca, registry.GatewayCredentialPrefix+ns+"/") {
				out[ca] = true
			}
		}
	}
	return out
}

func (router) patchContexts() (outbound, inbound networking.EnvoyFilter_PatchContext, ok bool) {
	return networking.EnvoyFilter_GATEWAY, networking.EnvoyFilter_GATEWAY, true
}

func (router) jwtClearsRouteCache() bool { return true }
