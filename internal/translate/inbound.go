package translate

import (
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	originaldstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// inboundPort is one port a sidecar receives traffic on for its
// workload.
type inboundPort struct {
	port  uint32
	proto registryv1.Protocol
	// endpoint is where the traffic goes: an address (nil: the
	// connection's original destination).
	endpoint *corev3.Address
	// bind is set for a port with a listener of its own, bound to that
	// address (Sidecar ingress with captureMode NONE); otherwise the port
	// is served by virtualInbound.
	bind string
}

// inboundPorts are the ports the sidecar serves inbound, by port: its
// Sidecar's ingress listeners when it has any (Istio then configures
// those and no others), else each port of the services its workload is
// an endpoint of, to the original destination (the pod's address on the
// target port, as Istio 1.10 and later).
func (g *gen) inboundPorts() []inboundPort {
	if g.sc.inPorts != nil {
		return g.sc.inPorts
	}
	out := []inboundPort{}
	if sc := g.scope.Sidecar; sc != nil && len(sc.Spec.GetIngress()) > 0 {
		for _, in := range sc.Spec.GetIngress() {
			p := in.GetPort().GetNumber()
			if slices.ContainsFunc(out, func(ip inboundPort) bool { return ip.port == p }) {
				g.problem("Sidecar %s/%s: ingress port %d is listed twice; the first is used", sc.Namespace, sc.Name, p)
				continue
			}
			ip := inboundPort{port: p, proto: registry.ParseProtocol(in.GetPort().GetProtocol())}
			var ok bool
			if ip.endpoint, ok = g.defaultEndpoint(in.GetDefaultEndpoint()); !ok {
				g.problem("Sidecar %s/%s: ingress port %d: defaultEndpoint %q is not usable; port left out", sc.Namespace, sc.Name, p, in.GetDefaultEndpoint())
				continue
			}
			if in.GetCaptureMode() == networking.CaptureMode_NONE {
				ip.bind = in.GetBind()
				if ip.bind == "" {
					ip.bind = "0.0.0.0"
				}
			}
			if in.GetTls() != nil {
				// Istio applies it only with ENABLE_TLS_ON_SIDECAR_INGRESS,
				// off by default.
				g.problem("Sidecar %s/%s: ingress port %d: tls is not applied (as in Istio by default); the port's mesh mTLS settings apply", sc.Namespace, sc.Name, p)
			}
			out = append(out, ip)
		}
	} else {
		for _, in := range g.pc.Instances(g.p) {
			for _, port := range in.Service.GetPorts() {
				target, ok := endpointPort(in.Endpoint, port)
				if !ok || slices.ContainsFunc(out, func(ip inboundPort) bool { return ip.port == target }) {
					continue
				}
				// To the original destination, the pod's own address
				// (Istio's buildInboundCluster: ORIGINAL_DST).
				out = append(out, inboundPort{port: target, proto: port.GetProtocol()})
			}
		}
	}
	slices.SortFunc(out, func(a, b inboundPort) int { return int(a.port) - int(b.port) })
	g.sc.inPorts = out
	return out
}

// defaultEndpoint reads a Sidecar ingress defaultEndpoint as Istio's
// buildInboundClustersFromSidecar: "127.0.0.1:PORT" or "[::1]:PORT" the
// application on loopback, "0.0.0.0:PORT" or "[::]:PORT" on the pod's own
// address of that family (loopback when it has none), "unix:///path" a
// Unix socket, empty the connection's original destination.
func (g *gen) defaultEndpoint(s string) (*corev3.Address, bool) {
	if s == "" {
		return nil, true
	}
	if path, ok := strings.CutPrefix(s, "unix://"); ok {
		return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}, path != ""
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		return nil, false
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, false
	}
	podIP := func(v6 bool, fallback string) string {
		for _, ip := range g.p.IPs {
			if ip.Is6() == v6 {
				return ip.String()
			}
		}
		return fallback
	}
	switch host {
	case "127.0.0.1", "::1":
	case "0.0.0.0":
		host = podIP(false, "127.0.0.1")
	case "::":
		host = podIP(true, "::1")
	default:
		if _, err := netip.ParseAddr(host); err != nil {
			return nil, false
		}
	}
	return socketAddress(host, uint32(port)), true
}

// virtualInbound receives everything sent to the pod: one filter chain per
// port of the workload (mTLS, plaintext, or both as PeerAuthentication
// says) to the application, and a catch-all passthrough.
func (g *gen) virtualInbound() *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:             VirtualInbound,
		Address:          socketAddress("0.0.0.0", InboundPort),
		TrafficDirection: corev3.TrafficDirection_INBOUND,
		AccessLog:        g.accessLogs(model.ServerMode, listenerLog),
	}
	// As Istio (buildInboundPassthroughChains): first a black hole for
	// connections to the listener's own port, which would loop; then the
	// chains of the workload's ports; then connections to ports no
	// service of the workload names go to their original destination
	// from 127.0.0.6 (InboundPassthroughCluster), under the workload's
	// mTLS mode, HTTP through a connection manager (inboundPassthroughChains).
	l.FilterChains = []*listenerv3.FilterChain{{
		Name:             "virtualInbound-blackhole",
		FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(InboundPort)},
		Filters:          g.blackHoleFilters(model.ServerMode),
	}}
	for _, ip := range g.inboundPorts() {
		if ip.bind != "" {
			continue // a listener of its own (boundInbound)
		}
		l.FilterChains = append(l.FilterChains, g.inboundChains(ip.port, ip.proto)...)
	}
	l.FilterChains = append(l.FilterChains, g.inboundPassthroughChains()...)
	l.ListenerFilters = append([]*listenerv3.ListenerFilter{
		{Name: "envoy.filters.listener.original_dst", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&originaldstv3.OriginalDst{})}},
	}, g.inboundInspectors(l.FilterChains)...)
	return l
}

// inboundInspectors are the TLS and HTTP inspectors the chains need, as
// Istio's populateListenerFilters: each enabled on the ports (by
// destination port; 0 is any other) whose chains match a transport
// protocol of TLS, or an application protocol of plaintext HTTP, and
// disabled on the others. The HTTP inspector comes after the TLS one, and
// waits for the client's first bytes, which a server-first protocol
// (MySQL, SMTP) on a declared port never sends: it is off there.
func (g *gen) inboundInspectors(chains []*listenerv3.FilterChain) []*listenerv3.ListenerFilter {
	type need struct{ tls, http bool }
	ports := map[uint32]need{}
	for _, fc := range chains {
		m := fc.GetFilterChainMatch()
		n := ports[m.GetDestinationPort().GetValue()]
		n.tls = n.tls || m.GetTransportProtocol() == "tls"
		n.http = n.http || slices.ContainsFunc(m.GetApplicationProtocols(), func(ap string) bool { return ap == "http/1.1" || ap == "h2c" })
		ports[m.GetDestinationPort().GetValue()] = n
	}
	keys := slices.Sorted(maps.Keys(ports))
	filter := func(f *listenerv3.ListenerFilter, on func(need) bool) *listenerv3.ListenerFilter {
		if !slices.ContainsFunc(keys, func(p uint32) bool { return on(ports[p]) }) {
			return nil
		}
		// Istio's buildTLSInspector and buildHTTPInspector: enabled by
		// default when the catch-all (port 0) needs it, with the ports
		// that do not excluded; else only on the ports that need it.
		var except []uint32
		for _, p := range keys {
			if p != 0 && on(ports[p]) != on(ports[0]) {
				except = append(except, p)
			}
		}
		switch {
		case len(except) == 0:
			if !on(ports[0]) {
				return nil
			}
		case on(ports[0]):
			f.FilterDisabled = portsPredicate(except)
		default:
			f.FilterDisabled = &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_NotMatch{NotMatch: portsPredicate(except)}}
		}
		return f
	}
	var out []*listenerv3.ListenerFilter
	tls := &listenerv3.ListenerFilter{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}}
	if f := filter(tls, func(n need) bool { return n.tls }); f != nil {
		out = append(out, f)
	}
	if f := filter(g.httpInspector(), func(n need) bool { return n.http }); f != nil {
		out = append(out, f)
	}
	return out
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
			AccessLog:        g.accessLogs(model.ServerMode, listenerLog),
			ListenerFilters:  []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: g.pack(&tlsinspectorv3.TlsInspector{})}}},
		}
		if sniffed(ip.proto) {
			l.ListenerFilters = append(l.ListenerFilters, g.httpInspector())
		}
		out = append(out, l)
	}
	return out
}
