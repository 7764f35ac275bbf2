package translate

import (
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
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
				g.httpChain(l, name, itoa(ep.port), ep.port)
			} else {
				l.FilterChains = []*listenerv3.FilterChain{{
					Name:    name,
					Filters: []*listenerv3.Filter{g.networkFilter(hcmFilter, g.httpConnectionManager("outbound_"+name, itoa(ep.port), ep.port, nil))},
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
					Filters: append(g.policyNetworkFilters(nil, model.ClientMode, ep.port), g.tcpForward(model.ClientMode, ClusterName(outbound, ep.port, "", svc.GetHostname()), clusters)...),
				}}
				add(l)
			}
		}
	}
	return out, locked
}
