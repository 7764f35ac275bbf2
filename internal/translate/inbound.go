package translate

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
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
// an endpoint of, to the application on 127.0.0.1.
func (g *gen) inboundPorts() []inboundPort {
	if g.inPorts != nil {
		return g.inPorts
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
				out = append(out, inboundPort{port: target, proto: port.GetProtocol(), endpoint: socketAddress("127.0.0.1", target)})
			}
		}
	}
	slices.SortFunc(out, func(a, b inboundPort) int { return int(a.port) - int(b.port) })
	g.inPorts = out
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
