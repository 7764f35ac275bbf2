package model

import (
	"cmp"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

// AnnotationGatewayService lists, comma separated, the hostnames of the
// Services whose instances a Gateway configures in place of a selector
// (Istio's InternalGatewayServiceAnnotation); the Gateway API's
// generated Gateways carry it.
const AnnotationGatewayService = "internal.istio.io/gateway-service"

// AnnotationGrantedCredentials lists, comma separated, the Gateway API
// certificates of other namespaces ("kubernetes-gateway://<ns>/<name>")
// that ReferenceGrants admit for a generated Gateway: galley's
// conversion sets it, and galley refuses it on any object a user writes
// (validation), so that it says what the grants say (Istio checks the
// grants in discovery: its PushContext.SecretAllowed).
const AnnotationGrantedCredentials = InternalAnnotationPrefix + "granted-credentials"

// AnnotationParentNamespace is, on a Gateway the conversion generates
// from a Gateway API ListenerSet, the namespace of the set's parent
// Gateway — where the gateway's Services and pods are — when it differs
// from the generated Gateway's (Istio's constants.InternalParentNamespace).
// Galley refuses it on any object a user writes (validation), as Istio
// does: it would let a Gateway configure another namespace's gateway.
const AnnotationParentNamespace = "internal.istio.io/parent-namespace"

// InternalAnnotationPrefix starts the annotations galley sets on the
// objects it generates, and refuses on any other.
const InternalAnnotationPrefix = "internal.flotilla.io/"

// Gateway is a Gateway resource.
type Gateway struct {
	Name, Namespace string
	Spec            *networking.Gateway
	// Services are the hostnames of AnnotationGatewayService; nil when
	// the Gateway selects by labels.
	Services []string
	// Granted are the certificates of AnnotationGrantedCredentials.
	Granted []string
	// ParentNamespace is AnnotationParentNamespace: "" for a Gateway
	// whose gateway runs in its own namespace.
	ParentNamespace string
}

// GatewayNamespace is the namespace of the gateway the Gateway
// configures, when it configures one by Services: its parent's for a
// ListenerSet's, its own otherwise (Istio's mergeGateways).
func (g *Gateway) GatewayNamespace() string {
	if g.ParentNamespace != "" {
		return g.ParentNamespace
	}
	return g.Namespace
}

// gatewayServices parses AnnotationGatewayService.
func gatewayServices(annotations map[string]string) []string {
	return commaList(annotations, AnnotationGatewayService)
}

// commaList parses a comma-separated annotation; nil when absent.
func commaList(annotations map[string]string, key string) []string {
	v, ok := annotations[key]
	if !ok {
		return nil
	}
	out := []string{}
	for h := range strings.SplitSeq(v, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// Key is the Gateway's name as VirtualServices name it: "namespace/name".
func (g *Gateway) Key() string { return g.Namespace + "/" + g.Name }

// ProxyGateways returns the Gateways that configure a gateway proxy: those
// of any namespace whose selector matches the proxy's labels (Istio's
// default, PILOT_SCOPE_GATEWAY_TO_NAMESPACE off; an empty selector
// matches every gateway proxy), and those naming Services instead whose
// instances, in the Gateway's namespace (its parent's for a ListenerSet's:
// GatewayNamespace), include the proxy (Istio's mergeGateways), oldest
// first.
func (pc *PushContext) ProxyGateways(p *Proxy) []*Gateway {
	var out []*Gateway
	var instances []Instance
	for _, gw := range pc.cfg.gateways {
		if gw.Services == nil {
			if LabelsMatch(gw.Spec.GetSelector(), p.Labels) {
				out = append(out, gw)
			}
			continue
		}
		if instances == nil {
			instances = pc.Instances(p)
		}
		if slices.ContainsFunc(instances, func(in Instance) bool {
			return in.Service.GetNamespace() == gw.GatewayNamespace() && slices.Contains(gw.Services, in.Service.GetHostname())
		}) {
			out = append(out, gw)
		}
	}
	return out
}

// GatewayVirtualServices returns the VirtualServices bound to a Gateway
// ("namespace/name") that a gateway proxy in namespace sees (their
// exportTo includes it), in Istio's order (VirtualServicesForGateway):
// those exported to namespaces by name ("." or a list), then the public
// ones — the Gateway API's routes of the proxy's own namespace first, the
// "consumer override" — each group oldest first.
func (pc *PushContext) GatewayVirtualServices(gateway, namespace string) []*VirtualService {
	var out []*VirtualService
	fallback := pc.Mesh.GetDefaultVirtualServiceExportTo()
	for _, vs := range pc.cfg.vsByGateway[gateway] {
		if !ExportedTo(vs.Spec.GetExportTo(), fallback, vs.Namespace, namespace) {
			continue
		}
		out = append(out, vs)
	}
	rank := func(vs *VirtualService) int {
		switch {
		case !exportedToAll(vs.Spec.GetExportTo(), fallback):
			return 0
		case vs.GatewaySemantics && vs.Namespace == namespace:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(out, func(a, b *VirtualService) int { return cmp.Compare(rank(a), rank(b)) })
	return out
}
