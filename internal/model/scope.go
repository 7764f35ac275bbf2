package model

import (
	"cmp"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// Scope is what one proxy sees of the mesh: the services and
// VirtualServices exported to its namespace and imported by the Sidecar
// resource that applies to it. Proxies in one namespace under the same
// Sidecar share a Scope, built once per push context.
type Scope struct {
	pc        *PushContext
	Namespace string
	// Sidecar is the Sidecar resource that applies, or nil.
	Sidecar *SidecarConfig

	services []*registryv1.Service // one per hostname, by hostname
	byHost   map[string]*registryv1.Service
	vsExact  map[string][]*VirtualService // host → visible ones, own namespace first
	vsWild   []*VirtualService            // visible ones with a wildcard host
	// egress are the services each of the Sidecar's egress listeners
	// lists, in its order.
	egress [][]*registryv1.Service
}

// Scope returns the proxy's scope.
func (pc *PushContext) Scope(p *Proxy) *Scope {
	sc := pc.sidecarFor(p)
	key := p.Namespace + "|"
	if sc != nil {
		key += sc.Namespace + "/" + sc.Name
	}
	pc.scopeMu.Lock()
	defer pc.scopeMu.Unlock()
	if s, ok := pc.scopes[key]; ok {
		return s
	}
	s := pc.newScope(p.Namespace, sc)
	pc.scopes[key] = s
	return s
}

// sidecarFor picks the Sidecar resource for a proxy: one in its namespace
// whose selector matches its labels, else its namespace's one without a
// selector, else the root namespace's one without a selector. A gateway
// proxy gets none: Istio never applies Sidecars to gateways
// (DefaultSidecarScopeForGateway), which see every service exported to
// their namespace.
func (pc *PushContext) sidecarFor(p *Proxy) *SidecarConfig {
	if p.Type == RouterProxy {
		return nil
	}
	var nsDefault *SidecarConfig
	for _, sc := range pc.cfg.sidecars[p.Namespace] {
		sel := sc.Spec.GetWorkloadSelector().GetLabels()
		if len(sel) == 0 {
			if nsDefault == nil {
				nsDefault = sc
			}
			continue
		}
		if LabelsMatch(sel, p.Labels) {
			return sc
		}
	}
	if nsDefault != nil {
		return nsDefault
	}
	for _, sc := range pc.cfg.sidecars[pc.RootNamespace] {
		if len(sc.Spec.GetWorkloadSelector().GetLabels()) == 0 {
			return sc
		}
	}
	return nil
}

func (pc *PushContext) newScope(ns string, sc *SidecarConfig) *Scope {
	s := &Scope{pc: pc, Namespace: ns, Sidecar: sc, byHost: map[string]*registryv1.Service{}, vsExact: map[string][]*VirtualService{}}
	for _, svc := range pc.cfg.services {
		if !ExportedTo(svc.GetExportTo(), pc.Mesh.GetDefaultServiceExportTo(), svc.GetNamespace(), ns) {
			continue
		}
		if !s.Imports(svc.GetNamespace(), svc.GetHostname()) {
			continue
		}
		if have, ok := s.byHost[svc.GetHostname()]; ok {
			// The same hostname in several namespaces: the proxy's own
			// namespace wins, else the first namespace.
			if have.GetNamespace() == ns || svc.GetNamespace() != ns {
				continue
			}
			i := slices.Index(s.services, have)
			s.services[i] = svc
			s.byHost[svc.GetHostname()] = svc
			continue
		}
		s.byHost[svc.GetHostname()] = svc
		s.services = append(s.services, svc)
	}
	var egress []*networking.IstioEgressListener
	if sc != nil {
		egress = sc.Spec.GetEgress()
	}
	for _, eg := range egress {
		var listed []*registryv1.Service
		for _, svc := range s.services {
			if s.EgressImports(eg, svc.GetNamespace(), svc.GetHostname()) {
				listed = append(listed, svc)
			}
		}
		s.egress = append(s.egress, listed)
	}
	var visible []*VirtualService
	for _, vs := range pc.cfg.virtualServices {
		if !slices.Contains(vs.Gateways, MeshGateway) {
			continue
		}
		if !ExportedTo(vs.Spec.GetExportTo(), pc.Mesh.GetDefaultVirtualServiceExportTo(), vs.Namespace, ns) {
			continue
		}
		if !slices.ContainsFunc(vs.Hosts, func(h string) bool { return s.importsVirtualServiceHost(vs, h) }) {
			continue
		}
		visible = append(visible, vs)
	}
	// Stable: precedence order (oldest first) within each group. Routes
	// of the Gateway API in the proxy's own namespace come before
	// everything else, so a consumer's HTTPRoute overrides a
	// VirtualService or producer's route for the same host (Istio's
	// SelectVirtualServices, gwExact first).
	slices.SortStableFunc(visible, func(a, b *VirtualService) int {
		return cmp.Or(
			cmp.Compare(boolRank(!a.GatewaySemantics || a.Namespace != ns), boolRank(!b.GatewaySemantics || b.Namespace != ns)),
			cmp.Compare(boolRank(a.Namespace != ns), boolRank(b.Namespace != ns)))
	})
	for _, vs := range visible {
		wild := false
		for _, h := range vs.Hosts {
			if strings.HasPrefix(h, "*") {
				wild = true
			} else {
				s.vsExact[h] = append(s.vsExact[h], vs)
			}
		}
		if wild {
			s.vsWild = append(s.vsWild, vs)
		}
	}
	return s
}

// AllowAny reports whether outbound traffic to unknown destinations
// passes through for the proxies of this scope: the Sidecar's
// outboundTrafficPolicy when it sets one (Istio's SidecarScope override;
// its mode's zero value is REGISTRY_ONLY, as Istio reads it), else the
// mesh's (PushContext.AllowAny).
func (s *Scope) AllowAny() bool {
	if s.Sidecar != nil {
		if p := s.Sidecar.Spec.GetOutboundTrafficPolicy(); p != nil {
			return p.GetMode() == networking.OutboundTrafficPolicy_ALLOW_ANY
		}
	}
	return s.pc.AllowAny()
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Imports reports whether the Sidecar's egress hosts include host of
// namespace ns, as Istio reads "namespace/host": "*/" any namespace, "./"
// the proxy's own, "~/" none, a name that namespace; the host part may be
// a wildcard ("*", "*.example.com"). Without a Sidecar, or one without
// egress, everything is imported.
func (s *Scope) Imports(ns, host string) bool {
	return s.importsBy(ns, func(imported string) bool { return HostMatches(imported, host) })
}

// importsVirtualServiceHost reports whether the Sidecar's egress hosts
// take in a host of a VirtualService (Istio's hostClassification.VSMatches):
// a route of the Gateway API's semantics as a service's host is
// (Imports); any other both ways, so that a VirtualService for
// "*.example.com" is seen by a proxy importing "api.example.com", as
// Istio keeps it for backwards compatibility.
func (s *Scope) importsVirtualServiceHost(vs *VirtualService, host string) bool {
	return s.importsBy(vs.Namespace, func(imported string) bool {
		return HostMatches(imported, host) || (!vs.GatewaySemantics && HostMatches(host, imported))
	})
}

// importsBy reports whether an egress host of the Sidecar for namespace
// ns matches (every host does without a Sidecar's egress).
func (s *Scope) importsBy(ns string, match func(imported string) bool) bool {
	if s.Sidecar == nil || len(s.Sidecar.Spec.GetEgress()) == 0 {
		return true
	}
	for _, eg := range s.Sidecar.Spec.GetEgress() {
		if s.egressListsBy(eg, ns, match) {
			return true
		}
	}
	return false
}

// EgressImports reports whether one egress listener of the Sidecar lists
// host of namespace ns, read as Imports reads them.
func (s *Scope) EgressImports(eg *networking.IstioEgressListener, ns, host string) bool {
	return s.egressListsBy(eg, ns, func(imported string) bool { return HostMatches(imported, host) })
}

// egressListsBy reports whether a host the egress listener lists for
// namespace ns ("namespace/host": "*/" any namespace, "./" the proxy's
// own, "~/" none) matches.
func (s *Scope) egressListsBy(eg *networking.IstioEgressListener, ns string, match func(imported string) bool) bool {
	for _, h := range eg.GetHosts() {
		hns, hhost, ok := strings.Cut(h, "/")
		if !ok {
			continue
		}
		switch hns {
		case "*":
		case ".":
			if ns != s.Namespace {
				continue
			}
		case "~":
			continue
		default:
			if hns != ns {
				continue
			}
		}
		if match(hhost) {
			return true
		}
	}
	return false
}

// EgressServices are the visible services the Sidecar's i-th egress
// listener lists, by hostname.
func (s *Scope) EgressServices(i int) []*registryv1.Service {
	if i < 0 || i >= len(s.egress) {
		return nil
	}
	return s.egress[i]
}

// Services returns the services the proxy sees, one per hostname, by
// hostname.
func (s *Scope) Services() []*registryv1.Service { return s.services }

// Service returns the visible service of a hostname, or nil.
func (s *Scope) Service(host string) *registryv1.Service { return s.byHost[host] }

// VirtualService returns the VirtualService that routes host for sidecars
// in this scope, or nil: an exact host beats a wildcard, a longer wildcard
// a shorter one, a Gateway API route of the proxy's namespace the others,
// then the proxy's namespace the others, then precedence order.
func (s *Scope) VirtualService(host string) *VirtualService {
	if l := s.vsExact[host]; len(l) > 0 {
		return l[0]
	}
	var best *VirtualService
	bestLen := -1
	for _, vs := range s.vsWild {
		for _, h := range vs.Hosts {
			if strings.HasPrefix(h, "*") && HostMatches(h, host) && len(h) > bestLen {
				best, bestLen = vs, len(h)
			}
		}
	}
	return best
}

// DestinationRule returns the DestinationRule for a service as seen by
// proxy p: one in the proxy's namespace (a workload selector matching the
// proxy first), else one in the service's namespace exported to the
// proxy's, else one in the root namespace. Within a namespace the most
// specific host wins.
func (s *Scope) DestinationRule(p *Proxy, svc *registryv1.Service) *DestinationRule {
	host := svc.GetHostname()
	pc := s.pc
	pick := func(ns string, withSelector bool) *DestinationRule {
		idx := pc.cfg.drsByNamespace[ns]
		if idx == nil {
			return nil
		}
		applies := func(dr *DestinationRule) bool {
			sel := dr.Spec.GetWorkloadSelector().GetMatchLabels()
			if withSelector != (len(sel) > 0) || (withSelector && !LabelsMatch(sel, p.Labels)) {
				return false
			}
			return ns == p.Namespace || ExportedTo(dr.Spec.GetExportTo(), pc.Mesh.GetDefaultDestinationRuleExportTo(), ns, p.Namespace)
		}
		for _, dr := range idx.exact[host] {
			if applies(dr) {
				return dr
			}
		}
		var best *DestinationRule
		for _, dr := range idx.wildcard {
			if HostMatches(dr.Host, host) && applies(dr) && (best == nil || len(dr.Host) > len(best.Host)) {
				best = dr
			}
		}
		return best
	}
	if dr := pick(p.Namespace, true); dr != nil {
		return dr
	}
	for _, ns := range []string{p.Namespace, svc.GetNamespace(), pc.RootNamespace} {
		if dr := pick(ns, false); dr != nil {
			return dr
		}
	}
	return nil
}

// Subset returns a DestinationRule's subset by name, or nil.
func (dr *DestinationRule) Subset(name string) *networking.Subset {
	if dr == nil {
		return nil
	}
	for _, ss := range dr.Spec.GetSubsets() {
		if ss.GetName() == name {
			return ss
		}
	}
	return nil
}

// DestinationHosts returns the hosts a VirtualService routes or mirrors
// to, qualified.
func (vs *VirtualService) DestinationHosts(domainSuffix string) []string {
	var out []string
	add := func(d *networking.Destination) {
		if d != nil {
			out = append(out, ResolveHost(d.GetHost(), vs.Namespace, domainSuffix))
		}
	}
	for _, r := range vs.Spec.GetHttp() {
		for _, d := range r.GetRoute() {
			add(d.GetDestination())
		}
		add(r.GetMirror())
		for _, m := range r.GetMirrors() {
			add(m.GetDestination())
		}
	}
	for _, r := range vs.Spec.GetTcp() {
		for _, d := range r.GetRoute() {
			add(d.GetDestination())
		}
	}
	for _, r := range vs.Spec.GetTls() {
		for _, d := range r.GetRoute() {
			add(d.GetDestination())
		}
	}
	return out
}
