package validation

import (
	"net"
	"strconv"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

func (v *validator) sidecar() {
	sc := v.obj.Spec.(*networking.Sidecar)
	if len(sc.GetIngress()) == 0 && len(sc.GetEgress()) == 0 && sc.GetOutboundTrafficPolicy() == nil && sc.GetInboundConnectionPool() == nil {
		// Istio refuses it too ("sidecar: empty configuration provided"):
		// it would change nothing but look as if it did.
		v.r.errorf("spec", "empty configuration: set ingress, egress, outboundTrafficPolicy or inboundConnectionPool")
	}
	if ws := sc.GetWorkloadSelector(); ws != nil {
		v.selector("spec.workloadSelector.labels", ws.GetLabels())
	}
	ingressPorts := map[uint32]bool{}
	for i, in := range sc.GetIngress() {
		p := at("spec.ingress", i)
		if in.GetPort() == nil {
			v.r.errorf(field(p, "port"), "port is required")
		} else {
			v.sidecarPort(field(p, "port"), in.GetPort())
			if ingressPorts[in.GetPort().GetNumber()] {
				v.r.errorf(field(p, "port.number"), "port %d has two ingress listeners", in.GetPort().GetNumber())
			}
			ingressPorts[in.GetPort().GetNumber()] = true
		}
		if ep := in.GetDefaultEndpoint(); ep != "" {
			v.defaultEndpoint(field(p, "defaultEndpoint"), ep)
		}
		if in.GetBind() != "" {
			v.bindAddress(field(p, "bind"), in.GetBind())
		}
		v.connectionPool(field(p, "connectionPool"), in.GetConnectionPool())
	}
	catchAll := -1
	egressPorts := map[uint32]bool{}
	for i, eg := range sc.GetEgress() {
		p := at("spec.egress", i)
		if eg.GetPort() == nil {
			if catchAll >= 0 {
				v.r.errorf(p, "only one egress listener may omit its port (the catch-all), and spec.egress[%d] already does", catchAll)
			}
			catchAll = i
		} else {
			v.sidecarPort(field(p, "port"), eg.GetPort())
			if egressPorts[eg.GetPort().GetNumber()] {
				v.r.errorf(field(p, "port.number"), "port %d has two egress listeners", eg.GetPort().GetNumber())
			}
			egressPorts[eg.GetPort().GetNumber()] = true
		}
		if len(eg.GetHosts()) == 0 {
			v.r.errorf(field(p, "hosts"), "at least one host is required (namespace/dnsName)")
		}
		for j, h := range eg.GetHosts() {
			v.namespacedHost(at(field(p, "hosts"), j), h)
		}
		if eg.GetBind() != "" {
			v.bindAddress(field(p, "bind"), eg.GetBind())
		}
	}
	if catchAll >= 0 && catchAll != len(sc.GetEgress())-1 {
		v.r.errorf(at("spec.egress", catchAll), "the egress listener without a port (the catch-all) must be the last one")
	}
	if otp := sc.GetOutboundTrafficPolicy(); otp != nil && otp.GetEgressProxy() != nil {
		if otp.GetMode() != networking.OutboundTrafficPolicy_ALLOW_ANY {
			v.r.errorf("spec.outboundTrafficPolicy.egressProxy", "egressProxy is only used with mode ALLOW_ANY")
		}
		v.destination("spec.outboundTrafficPolicy.egressProxy", otp.GetEgressProxy())
	}
	v.connectionPool("spec.inboundConnectionPool", sc.GetInboundConnectionPool())
}

func (v *validator) sidecarPort(path string, p *networking.SidecarPort) {
	v.port(field(path, "number"), p.GetNumber())
	if p.GetProtocol() != "" {
		v.sniffedProtocol(field(path, "protocol"), p.GetProtocol())
	}
	if p.GetName() != "" {
		v.portName(field(path, "name"), p.GetName())
	}
	if tp := p.GetTargetPort(); tp != 0 { //nolint:staticcheck // deprecated, still accepted from users
		v.port(field(path, "targetPort"), tp)
	}
}

// defaultEndpoint is "127.0.0.1:PORT", "0.0.0.0:PORT", "[::1]:PORT",
// "[::]:PORT" or "unix:///path".
func (v *validator) defaultEndpoint(path, ep string) {
	if sock, ok := strings.CutPrefix(ep, "unix://"); ok {
		v.unixAddress(path, sock)
		return
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		v.r.errorf(path, "%q must be 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT, [::]:PORT or unix:///path", ep)
		return
	}
	switch host {
	case "127.0.0.1", "0.0.0.0", "::1", "::":
	default:
		v.r.errorf(path, "%q: the host must be 127.0.0.1, 0.0.0.0, ::1 or ::", ep)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		v.r.errorf(path, "%q: port must be between 1 and 65535", ep)
	}
}

func (v *validator) bindAddress(path, bind string) {
	if sock, ok := strings.CutPrefix(bind, "unix://"); ok {
		v.unixAddress(path, sock)
		return
	}
	if net.ParseIP(bind) == nil {
		v.r.errorf(path, "%q must be an IP address or unix:///path", bind)
	}
}
