package model

import (
	networking "istio.io/api/networking/v1alpha3"
)

// Gateway is a Gateway resource.
type Gateway struct {
	Name, Namespace string
	Spec            *networking.Gateway
}

// Key is the Gateway's name as VirtualServices name it: "namespace/name".
func (g *Gateway) Key() string { return g.Namespace + "/" + g.Name }

// ProxyGateways returns the Gateways that configure a gateway proxy: those
// of any namespace whose selector matches the proxy's labels (Istio's
// default, PILOT_SCOPE_GATEWAY_TO_NAMESPACE off; an empty selector
// matches every gateway proxy), oldest first.
func (pc *PushContext) ProxyGateways(p *Proxy) []*Gateway {
	var out []*Gateway
	for _, gw := range pc.cfg.gateways {
		if LabelsMatch(gw.Spec.GetSelector(), p.Labels) {
			out = append(out, gw)
		}
	}
	return out
}

// GatewayVirtualServices returns the VirtualServices bound to a Gateway
// ("namespace/name") that a gateway proxy in namespace sees (their
// exportTo includes it), oldest first.
func (pc *PushContext) GatewayVirtualServices(gateway, namespace string) []*VirtualService {
	var out []*VirtualService
	for _, vs := range pc.cfg.vsByGateway[gateway] {
		if !ExportedTo(vs.Spec.GetExportTo(), pc.Mesh.GetDefaultVirtualServiceExportTo(), vs.Namespace, namespace) {
			continue
		}
		out = append(out, vs)
	}
	return out
}
