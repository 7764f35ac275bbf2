package translate

import (
	"net"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// This file holds what only proxyless gRPC clients and servers get: TLS
// through certificate providers, and the listeners of xDS-enabled gRPC
// servers.

// GRPCInboundPrefix starts the name of a proxyless gRPC server's
// listener. grpc-go's xDS server asks for its bootstrap's
// server_listener_resource_name_template filled with the address it
// listens on; the agent's bootstrap sets the template, as Istio's does, to
// GRPCInboundPrefix+"%s", so the name ends in "host:port".
const GRPCInboundPrefix = proxycontract.GRPCInboundListenerPrefix

// ParseGRPCInboundName returns the host and port of a proxyless server's
// listener name (GRPCInboundPrefix + "host:port", IPv6 hosts bracketed).
func ParseGRPCInboundName(name string) (host string, port uint32, ok bool) {
	hp, ok := strings.CutPrefix(name, GRPCInboundPrefix)
	if !ok {
		return "", 0, false
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, false
	}
	n, err := strconv.ParseUint(p, 10, 32)
	if err != nil || n == 0 || n > 65535 {
		return "", 0, false
	}
	return h, uint32(n), true
}

// grpcClient is grpc-go's xDS client (Istio's grpcgen serves it).
func grpcClient() client {
	return client{
		name:            "grpc",
		defaultLB:       clusterv3.Cluster_ROUND_ROBIN,
		certProviderTLS: true,
		retries:         grpcRetries,
		grpcRBAC:        true,
	}
}

// grpcRetries reports whether gRPC clients understand a retry condition
// (gRFC A44: the status codes of retryOn).
func grpcRetries(condition string) bool {
	switch condition {
	case "cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable":
		return true
	default:
		return false
	}
}

// proxyless is the flavour of proxyless gRPC clients and servers (node
// metadata GENERATOR=grpc), as Istio's grpcgen: API listeners ("host:port")
// with their route configurations, outbound clusters, and the listeners
// of xDS-enabled gRPC servers (GRPCInboundPrefix).
type proxyless struct{}

// clusterNames: none but the outbound ones.
func (proxyless) clusterNames(*gen) []string { return nil }

func (proxyless) localCluster(*gen, string) *builtCluster { return nil }

// routeNames: one per API listener, of every service port a gRPC client
// can reach.
func (proxyless) routeNames(g *gen) []string {
	var names []string
	for _, svc := range g.scope.Services() {
		if !grpcReachable(svc) {
			continue
		}
		for _, port := range svc.GetPorts() {
			names = append(names, ListenerName(svc.GetHostname(), port.GetNumber()))
		}
	}
	return names
}

func (proxyless) buildRoute(g *gen, name string) *routev3.RouteConfiguration {
	return g.grpcRoute(name)
}

// sharedRouteKey: a proxyless client builds its own.
func (proxyless) sharedRouteKey(*gen, string) (string, bool) { return "", false }

func (proxyless) routeKnown(g *gen, name string) bool { return g.routeOK(name) }

// listeners: the API listeners named (all when names is nil), and the
// server listeners asked for by name.
func (proxyless) listeners(g *gen, names []string) []*listenerv3.Listener {
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
				ApiListener: &listenerv3.ApiListener{ApiListener: sub.pack(sub.httpConnectionManager(name, name, 0, nil))},
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

// grpcRoute is a proxyless client's route configuration for "host:port".
func (g *gen) grpcRoute(name string) *routev3.RouteConfiguration {
	svc, port := g.hostPort(name)
	if svc == nil || !grpcReachable(svc) {
		return nil
	}
	vh := &routev3.VirtualHost{
		Name:    name,
		Domains: []string{name, svc.GetHostname()},
		Routes:  g.httpRoutes(svc, port),
	}
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{vh}}
}

// grpcInbound is the listener of a proxyless gRPC server listening on
// name's address, as grpc-go's xDS server reads it (gRFC A36): the
// address it listens on, one filter chain whose HTTP connection manager
// has an inline route configuration with a non-forwarding route for
// everything, and, when the port accepts mTLS only, the mesh certificate
// from the agent's certificate provider with client certificates
// required. It is nil when the port is none of the workload's service
// ports: Istio's grpcgen serves no listener then, and grpc-go keeps the
// port not serving.
//
// PERMISSIVE is served as plaintext, as Istio does for gRPC servers:
// grpc-go's filter chain match cannot tell TLS from plaintext (it accepts
// only transport_protocol "raw_buffer"), so one chain must pick, and
// clients' auto mTLS (grpcClusterTLS) uses mTLS towards STRICT ports only.
func (g *gen) grpcInbound(name string) *listenerv3.Listener {
	host, port, ok := ParseGRPCInboundName(name)
	if !ok || !g.servesPort(port) {
		return nil
	}
	chain := &listenerv3.FilterChain{Name: "inbound|" + itoa(port) + "|plaintext"}
	if g.pc.InboundMTLS(g.p, port) == model.Strict {
		chain.Name = "inbound|" + itoa(port) + "|mtls"
		chain.TransportSocket = g.tlsSocket(&tlsv3.DownstreamTlsContext{
			RequireClientCertificate: wrapperspb.Bool(true),
			CommonTlsContext:         grpcCommonTLS(nil),
		})
	}
	route := ClusterName(inbound, port, "", "")
	chain.Filters = []*listenerv3.Filter{g.networkFilter(hcmFilter, &hcmv3.HttpConnectionManager{
		StatPrefix: route,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: route,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound|grpc|" + itoa(port),
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Name:   "default",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
				}},
			}},
		}},
		// A server rejects a listener naming a filter it cannot run on
		// the server side (the fault filter is client-only): the
		// workload's authorization, then the router, as Istio's grpcgen.
		HttpFilters: append(slices.Clip(g.workloadAuthz().grpc), g.httpFilters(model.ServerMode, false)[1:]...),
	})}
	return &listenerv3.Listener{
		Name:         name,
		Address:      socketAddress(host, port),
		FilterChains: []*listenerv3.FilterChain{chain},
	}
}

// servesPort reports whether port is where the proxy's workload serves
// one of its services.
func (g *gen) servesPort(port uint32) bool {
	for _, in := range g.pc.Instances(g.p) {
		for _, sp := range in.Service.GetPorts() {
			if target, ok := endpointPort(in.Endpoint, sp); ok && target == port {
				return true
			}
		}
	}
	return false
}

// grpcServerListener builds and checks a server listener (nil when the
// proxy has none of that name, or it failed its check, reported).
func (g *gen) grpcServerListener(name string) *listenerv3.Listener {
	before := g.packErrs
	l := g.grpcInbound(name)
	if l == nil {
		return nil
	}
	if err := g.valid(l, before); err != nil {
		g.problem("listener %s dropped: %v", name, err)
		return nil
	}
	return l
}

// patchContexts: none; Istio's gRPC generator applies no EnvoyFilter.
// gatewayCredentials: none, not being a gateway.
func (proxyless) gatewayCredentials(*gen) map[string]bool { return nil }

func (proxyless) patchContexts() (outbound, inbound networking.EnvoyFilter_PatchContext, ok bool) {
	return 0, 0, false
}

func (proxyless) jwtClearsRouteCache() bool { return false }
