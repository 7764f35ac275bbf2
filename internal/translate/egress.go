package translate

import (
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// egressPort is a Sidecar egress listener with a port: only its hosts'
// services, on that port, with its protocol, as Istio's
// buildSidecarOutboundListeners builds the listeners that come before the
// catch-all.
type egressPort struct {
	port  uint32
	proto registryv1.Protocol
	// bind is the address to listen on: the egress listener's bind,
	// else 127.0.0.1 when it binds (captureMode NONE), else empty: the
	// services' own addresses (TCP) or 0.0.0.0 (HTTP).
	bind       string
	bindToPort bool
	services   []*registryv1.Service
}

// egressPorts are the Sidecar's egress listeners with a port, in order.
// Unix socket binds are left out, reported: the agent does not set them
// up.
func (g *gen) egressPorts() []egressPort {
	if g.sc.egress != nil {
		return g.sc.egress
	}
	out := []egressPort{}
	if sc := g.scope.Sidecar; sc != nil {
		for i, eg := range sc.Spec.GetEgress() {
			if eg.GetPort() == nil {
				continue
			}
			if strings.HasPrefix(eg.GetBind(), "unix://") {
				g.problem("Sidecar %s/%s: egress port %d binds a Unix socket, which is not supported; left out", sc.Namespace, sc.Name, eg.GetPort().GetNumber())
				continue
			}
			ep := egressPort{
				port:       eg.GetPort().GetNumber(),
				proto:      registry.ParseProtocol(eg.GetPort().GetProtocol()),
				bind:       eg.GetBind(),
				bindToPort: eg.GetCaptureMode() == networking.CaptureMode_NONE,
				services:   g.scope.EgressServices(i),
			}
			if ep.bind == "" && ep.bindToPort {
				ep.bind = "127.0.0.1"
			}
			out = append(out, ep)
		}
	}
	g.sc.egress = out
	return out
}

// egressPortFor is the egress listener with port, or nil.
func (g *gen) egressPortFor(port uint32) *egressPort {
	for _, ep := range g.egressPorts() {
		if ep.port == port {
			return &ep
		}
	}
	return nil
}

// catchAllServices are the services of the egress listener without a
// port (all visible ones without a Sidecar or one without egress; none
// when every egress listener has a port).
func (g *gen) catchAllServices() []*registryv1.Service {
	sc := g.scope.Sidecar
	if sc == nil || len(sc.Spec.GetEgress()) == 0 {
		return g.scope.Services()
	}
	for i, eg := range sc.Spec.GetEgress() {
		if eg.GetPort() == nil {
			return g.scope.EgressServices(i)
		}
	}
	return nil
}

// egressPortListeners builds the listeners of the egress listeners with a
// port and returns them with their names, which the catch-all's
// services may not take (Istio's "locked" listeners).
func (g *gen) egressPortListeners() ([]*listenerv3.Listener, map[string]bool) {
	var out []*listenerv3.Listener
	locked := map[string]bool{}
	add := func(l *listenerv3.Listener) {
		if locked[l.GetName()] {
			g.problem("listener %s: two Sidecar egress listeners share it; the second is left out", l.GetName())
			return
		}
		locked[l.GetName()] = true
		out = append(out, l)
	}
	for _, ep := range g.egressPorts() {
		if isHTTP(ep.proto) || sniffed(ep.proto) {
			addr := ep.bind
			if addr == "" {
				addr = "0.0.0.0"
			}
			name := addr + "_" + itoa(ep.port)
			l := g.portListener(name, addr, ep.port, ep.bindToPort)
			if addr == "0.0.0.0" && !ep.bindToPort {
				// Shared like any wildcard HTTP listener: HTTP by the
				// inspector, the rest passed through or refused.
				g.httpChain(l, name, ep.port)
			} else {
				l.FilterChains = []*listenerv3.FilterChain{{
					Name:    name,
					Filters: []*listenerv3.Filter{g.networkFilter(hcmFilter, g.outboundPortHCM(name, ep.port))},
				}}
			}
			add(l)
			continue
		}
		if ep.proto == registryv1.Protocol_PROTOCOL_UDP {
			continue
		}
		for _, svc := range ep.services {
			port := servicePort(svc, ep.port)
			if port == nil {
				continue // no cluster on that port to forward to
			}
			clusters := g.tcpDestinations(svc, port)
			if len(clusters) == 0 {
				continue
			}
			addrs := []string{ep.bind}
			if ep.bind == "" {
				addrs = g.serviceAddresses(svc)
			}
			for _, addr := range addrs {
				name := addr + "_" + itoa(ep.port)
				l := g.portListener(name, addr, ep.port, ep.bindToPort)
				l.FilterChains = []*listenerv3.FilterChain{{
					Name:    ClusterName(outbound, ep.port, "", svc.GetHostname()),
					Filters: g.outboundTCPFilters(svc, port, clusters),
				}}
				add(l)
			}
		}
	}
	return out, locked
}

// httpChain makes l a shared HTTP listener of a port, as Istio's: the
// HTTP chain (outboundPortHCM) takes what the HTTP inspector sees as
// plaintext HTTP/1.x or h2c; anything else on the port (another protocol,
// TLS to a host no SNI chain names) takes the default chain, passed
// through or refused per outboundTrafficPolicy.
func (g *gen) httpChain(l *listenerv3.Listener, name string, port uint32) {
	l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
		Name:             name,
		FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: plaintextHTTPALPN()},
		Filters:          []*listenerv3.Filter{g.networkFilter(hcmFilter, g.outboundPortHCM(name, port))},
	})
	l.ListenerFilters = append(l.ListenerFilters, g.httpInspector())
	l.DefaultFilterChain = g.passthroughChain(name)
}

// servicePortPair is a service and one of its ports.
type servicePortPair struct {
	svc  *registryv1.Service
	port *registryv1.ServicePort
}

// portRouteServices are the services the route configuration of an
// outbound port routes: a Sidecar egress listener's own services that
// have the port (Istio's GetEgressListenerForRDS), otherwise the
// catch-all's HTTP services on it.
func (g *gen) portRouteServices(n uint32) []servicePortPair {
	services, egress := g.catchAllServices(), false
	if ep := g.egressPortFor(n); ep != nil && (isHTTP(ep.proto) || sniffed(ep.proto)) {
		services, egress = ep.services, true
	}
	var out []servicePortPair
	for _, svc := range services {
		if port := servicePort(svc, n); port != nil && (egress || g.onPortRoute(svc, port)) {
			out = append(out, servicePortPair{svc, port})
		}
	}
	return out
}

// outboundPortHCM is the connection manager of a shared outbound HTTP
// listener of a port, routing by the port's route configuration, with the
// dynamic forward proxy filter of the DYNAMIC_DNS host that route has (one
// per connection manager: the hosts after the first are reported).
func (g *gen) outboundPortHCM(listener string, port uint32) *hcmv3.HttpConnectionManager {
	hcm := g.httpConnectionManager("outbound_"+listener, itoa(port), port, nil)
	var dfp []string
	for _, sp := range g.portRouteServices(port) {
		if dynamicDNS(sp.svc) && dfpProtocol(sp.port.GetProtocol()) {
			dfp = append(dfp, sp.svc.GetHostname())
		}
	}
	if len(dfp) > 0 {
		g.withDFPFilter(hcm, dfp[0])
	}
	for _, h := range dfp[min(1, len(dfp)):] {
		g.problem("listener %s: DYNAMIC_DNS hosts %s and %s share HTTP port %d; Envoy's dynamic forward proxy resolves for one per listener, so requests to %s fail", listener, dfp[0], h, port, h)
	}
	return hcm
}

// outboundTCPFilters forward a connection to a TCP or TLS service port's
// clusters, after the proxy's policy and stats filters; to a DYNAMIC_DNS
// host's own TLS cluster through the SNI dynamic forward proxy filter,
// which resolves the server name the client sent (Istio's
// buildOutboundNetworkFiltersWithSingleDestination).
func (g *gen) outboundTCPFilters(svc *registryv1.Service, port *registryv1.ServicePort, clusters []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight) []*listenerv3.Filter {
	self := ClusterName(outbound, port.GetNumber(), "", svc.GetHostname())
	fs := append(g.policyNetworkFilters(nil, model.ClientMode, port.GetNumber()), g.tcpForward(model.ClientMode, self, clusters)...)
	if dynamicDNS(svc) && port.GetProtocol() == registryv1.Protocol_PROTOCOL_TLS && len(clusters) == 1 && clusters[0].GetName() == self {
		fs = g.withSNIDFPFilter(fs, svc.GetHostname(), port.GetNumber())
	}
	return fs
}
