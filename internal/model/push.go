package model

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Defaults Istio uses when the mesh configuration leaves them out.
const (
	DefaultDomainSuffix  = controlplane.DefaultDomainSuffix
	DefaultRootNamespace = controlplane.DefaultNamespace
	DefaultTrustDomain   = controlplane.DefaultTrustDomain
	// MeshGateway names the sidecars in a VirtualService's gateways.
	MeshGateway = "mesh"
)

// BuildOptions are the settings a push context is built with.
type BuildOptions struct {
	// DomainSuffix qualifies short host names; default cluster.local.
	DomainSuffix string
	// JWKS gives the keys of the remote JWKS locations
	// RequestAuthentications name; without it, none are known (the
	// issuers' tokens are refused).
	JWKS JWKSSource
}

// PushContext is an immutable, indexed snapshot of the mesh. Everything
// translation needs to know about the mesh it asks the push context; it is
// safe for concurrent use by every proxy's translation.
type PushContext struct {
	// Version increases with every push context built; Seq is the same
	// number.
	Version string
	Seq     uint64
	// Mesh is the mesh configuration, never nil (defaults when galley sent
	// none).
	Mesh          *meshv1alpha1.MeshConfig
	DomainSuffix  string
	RootNamespace string
	TrustDomain   string

	cfg  *configIndex // shared by push contexts when only endpoints changed
	jwks map[string]JWKS
	// credentials are the Secrets configuration names, by
	// namespace/name (a copy: the store's map changes).
	credentials map[string]*registryv1.Credential
	endpoints   map[string][]*registryv1.Endpoint
	byAddress   map[netip.Addr][]Instance

	scopeMu sync.Mutex
	scopes  map[string]*Scope

	memo sync.Map
	// shared is the set of resources Share marked.
	shared sync.Map
}

// Memo returns the value kept under key in this push context, building it
// on first use. Translation keeps what many proxies share here (a cluster
// is the same for every proxy that sees the same service and
// DestinationRule); the value must not be changed after it is built. Two
// callers may build at once; one result wins and is kept.
func (pc *PushContext) Memo(key string, build func() any) any {
	if v, ok := pc.memo.Load(key); ok {
		return v
	}
	v, _ := pc.memo.LoadOrStore(key, build())
	return v
}

// RoutesReadLabels reports whether a proxy's labels can change its HTTP
// routes: a VirtualService has an HTTP match on sourceLabels, or a
// DestinationRule has a workload selector. When none does, proxies of one
// scope get the same route configurations.
func (pc *PushContext) RoutesReadLabels() bool {
	return pc.Memo("model|routes-read-labels", func() any {
		for _, vs := range pc.cfg.virtualServices {
			for _, hr := range vs.Spec.GetHttp() {
				for _, m := range hr.GetMatch() {
					if len(m.GetSourceLabels()) > 0 {
						return true
					}
				}
			}
		}
		for _, dr := range pc.cfg.destinationRules {
			if len(dr.Spec.GetWorkloadSelector().GetMatchLabels()) > 0 {
				return true
			}
		}
		return false
	}).(bool)
}

// ListenersReadLabels reports whether a proxy's labels can change its
// outbound listeners: they can whenever its routes can (RoutesReadLabels:
// a DestinationRule's workload selector decides which clusters exist),
// when a VirtualService has a TCP or TLS match on sourceLabels, and when
// a Telemetry selects workloads (their access logs).
func (pc *PushContext) ListenersReadLabels() bool {
	return pc.Memo("model|listeners-read-labels", func() any {
		if pc.RoutesReadLabels() || pc.TelemetryReadsLabels() {
			return true
		}
		for _, vs := range pc.cfg.virtualServices {
			for _, tr := range vs.Spec.GetTcp() {
				if matchesSourceLabels(tr.GetMatch()) {
					return true
				}
			}
			for _, tr := range vs.Spec.GetTls() {
				if matchesSourceLabels(tr.GetMatch()) {
					return true
				}
			}
		}
		return false
	}).(bool)
}

// matchesSourceLabels reports whether a match of a route selects by the
// client's labels.
func matchesSourceLabels[M interface{ GetSourceLabels() map[string]string }](ms []M) bool {
	return slices.ContainsFunc(ms, func(m M) bool { return len(m.GetSourceLabels()) > 0 })
}

// Share marks r, a resource built once in this push context for many
// proxies (a Memo value, or part of one), as one that every proxy it is
// built for gets the same: a server may then keep what it derives from r
// (the xDS server keeps its encoding) once per push context, not once per
// proxy (Shared). r must not change after it is shared.
func (pc *PushContext) Share(r proto.Message) {
	pc.shared.LoadOrStore(r, struct{}{})
}

// Shared reports whether r was shared in this push context (Share). What
// a server derives from a resource that was not (one built for one
// proxy) it must not keep.
func (pc *PushContext) Shared(r proto.Message) bool {
	_, ok := pc.shared.Load(r)
	return ok
}

// Instance is one endpoint of one service: how a proxy's own workload is
// found among the services that select it.
type Instance struct {
	Service  *registryv1.Service
	Endpoint *registryv1.Endpoint
}

// VirtualService is a VirtualService with its hosts and gateways resolved.
type VirtualService struct {
	Name, Namespace string
	Spec            *networking.VirtualService
	// Hosts are fully qualified (or wildcards).
	Hosts []string
	// Gateways are "namespace/name" or "mesh"; "mesh" when none are given.
	Gateways []string
	// Problems are what merging its delegates left out, and why.
	Problems []string
	// GatewaySemantics marks a VirtualService generated from the Gateway
	// API (AnnotationRouteSemantics "gateway"), routed by its rules
	// where they differ from Istio's.
	GatewaySemantics bool
}

// AnnotationRouteSemantics RouteSemanticsGateway marks a VirtualService
// generated from the Gateway API (Istio's internal.istio.io/route-semantics);
// galley's Gateway API conversion puts it, and on the Gateways it
// generates internal.istio.io/gateway-semantics with the same value.
const (
	AnnotationRouteSemantics = "internal.istio.io/route-semantics"
	RouteSemanticsGateway    = "gateway"
)

// GetProblems returns the merge problems of a VirtualService that may be
// nil.
func (vs *VirtualService) GetProblems() []string {
	if vs == nil {
		return nil
	}
	return vs.Problems
}

// DestinationRule is a DestinationRule with its host resolved.
type DestinationRule struct {
	Name, Namespace string
	Spec            *networking.DestinationRule
	Host            string
	// MergedFrom names ("namespace/name") the younger DestinationRules of
	// the same host and namespace merged into this one
	// (mergeDestinationRule); Spec is then the merged rule.
	MergedFrom []string
	// FromPolicy is whether it was generated from a Gateway API backend
	// policy (a BackendTLSPolicy): it carries AnnotationParents, as in
	// Istio's isBackendPolicyDestinationRule.
	FromPolicy bool
}

// AnnotationParents names the Gateway API objects an object was
// generated from (Istio's internal.istio.io/parents).
const AnnotationParents = "internal.istio.io/parents"

// mergeDestinationRule adds dr, the youngest so far, to the rules of its
// namespace (in creation order) as Istio's mergeDestinationRule
// (ENABLE_ENHANCED_DESTINATIONRULE_MERGE on, its default): into every
// older rule of the same host with the same exportTo, unless both have
// workload selectors that differ, dr's subsets not yet there are added,
// and its traffic policy when the older has none; dr stays a rule of its
// own unless it merged into one whose selector it shares (both none, or
// the same labels). The older rules' specs are copied, never changed.
// Between a user's rule and one generated from a backend policy the
// user's fields win whichever is older, the policy's filling what the
// user's leaves unset (Istio's mergeBackendPolicyTrafficPolicy).
func mergeDestinationRule(rules []*DestinationRule, dr *DestinationRule) []*DestinationRule {
	apart := true
	for i, old := range rules {
		if old.Host != dr.Host || !sameStrings(old.Spec.GetExportTo(), dr.Spec.GetExportTo()) {
			continue
		}
		oldSel, sel := old.Spec.GetWorkloadSelector(), dr.Spec.GetWorkloadSelector()
		if oldSel != nil && sel != nil && !maps.Equal(oldSel.GetMatchLabels(), sel.GetMatchLabels()) {
			continue
		}
		if (oldSel == nil) == (sel == nil) {
			apart = false
		}
		spec := proto.CloneOf(old.Spec)
		for _, ss := range dr.Spec.GetSubsets() {
			if !slices.ContainsFunc(spec.GetSubsets(), func(o *networking.Subset) bool { return o.GetName() == ss.GetName() }) {
				spec.Subsets = append(spec.Subsets, ss)
			}
		}
		switch {
		case old.FromPolicy == dr.FromPolicy:
			if spec.TrafficPolicy == nil {
				spec.TrafficPolicy = dr.Spec.GetTrafficPolicy()
			}
		case dr.FromPolicy:
			spec.TrafficPolicy = underPolicy(spec.GetTrafficPolicy(), dr.Spec.GetTrafficPolicy())
		default:
			spec.TrafficPolicy = underPolicy(dr.Spec.GetTrafficPolicy(), spec.GetTrafficPolicy())
		}
		merged := *old
		merged.Spec = spec
		merged.MergedFrom = append(slices.Clip(old.MergedFrom), dr.Namespace+"/"+dr.Name)
		rules[i] = &merged
	}
	if apart {
		rules = append(rules, dr)
	}
	return rules
}

// underPolicy is user's traffic policy with what it leaves unset taken
// from backend's, a backend policy's (Istio's
// mergeBackendPolicyTrafficPolicy and mergeBackendPolicyPortLevelSettings).
// Neither is changed.
func underPolicy(user, backend *networking.TrafficPolicy) *networking.TrafficPolicy {
	if user == nil {
		return backend
	}
	if backend == nil {
		return user
	}
	out := &networking.TrafficPolicy{
		ConnectionPool:   cmp.Or(user.GetConnectionPool(), backend.GetConnectionPool()),
		LoadBalancer:     cmp.Or(user.GetLoadBalancer(), backend.GetLoadBalancer()),
		OutlierDetection: cmp.Or(user.GetOutlierDetection(), backend.GetOutlierDetection()),
		Tls:              cmp.Or(user.GetTls(), backend.GetTls()),
		Tunnel:           cmp.Or(user.GetTunnel(), backend.GetTunnel()),
		ProxyProtocol:    cmp.Or(user.GetProxyProtocol(), backend.GetProxyProtocol()),
		RetryBudget:      cmp.Or(user.GetRetryBudget(), backend.GetRetryBudget()),
	}
	byPort := map[uint32]int{}
	for _, p := range user.GetPortLevelSettings() {
		byPort[p.GetPort().GetNumber()] = len(out.PortLevelSettings)
		out.PortLevelSettings = append(out.PortLevelSettings, p)
	}
	for _, bp := range backend.GetPortLevelSettings() {
		i, ok := byPort[bp.GetPort().GetNumber()]
		if !ok {
			out.PortLevelSettings = append(out.PortLevelSettings, bp)
			continue
		}
		up := out.PortLevelSettings[i]
		out.PortLevelSettings[i] = &networking.TrafficPolicy_PortTrafficPolicy{
			Port:             up.GetPort(),
			LoadBalancer:     cmp.Or(up.GetLoadBalancer(), bp.GetLoadBalancer()),
			ConnectionPool:   cmp.Or(up.GetConnectionPool(), bp.GetConnectionPool()),
			OutlierDetection: cmp.Or(up.GetOutlierDetection(), bp.GetOutlierDetection()),
			Tls:              cmp.Or(up.GetTls(), bp.GetTls()),
		}
	}
	return out
}

// sameStrings reports whether two lists hold the same strings, in any
// order.
func sameStrings(a, b []string) bool {
	return maps.Equal(setOf(a), setOf(b))
}

func setOf(ss []string) map[string]bool {
	m := make(map[string]bool, len(ss))
	for _, s := range ss {
		m[s] = true
	}
	return m
}

// SidecarConfig is a Sidecar resource.
type SidecarConfig struct {
	Name, Namespace string
	Spec            *networking.Sidecar
}

// drIndex holds one namespace's DestinationRules by host, each list by
// name.
type drIndex struct {
	exact    map[string][]*DestinationRule
	wildcard []*DestinationRule
}

// configIndex holds the configuration of a push. Istio objects are in
// precedence order (sortedObjects: oldest first, then by name and
// namespace) in every list.
type configIndex struct {
	services         []*registryv1.Service             // by hostname, then namespace
	byHost           map[string][]*registryv1.Service  // hostname → by namespace
	virtualServices  []*VirtualService                 // precedence order
	destinationRules []*DestinationRule                // precedence order
	sidecars         map[string][]*SidecarConfig       // namespace → precedence order
	drsByNamespace   map[string]*drIndex               // namespace → its rules
	peerAuth         map[string][]*PeerAuthentication  // namespace → precedence order
	authz            map[string][]*AuthorizationPolicy // namespace → precedence order
	authn            map[string][]*RequestAuthentication
	telemetries      map[string][]*Telemetry      // namespace → creation order
	envoyFilters     map[string][]*EnvoyFilter    // namespace → creation order
	extensions       map[string][]*Extension      // namespace → creation order
	gateways         []*Gateway                   // precedence order
	vsByGateway      map[string][]*VirtualService // "namespace/name" (not "mesh") → precedence order
	namespaces       map[string]*registryv1.Namespace
}

// Build returns a push context of the store's current content and the
// change set since the previous Build. prev may be nil; when only
// endpoints changed, the new context shares prev's configuration indexes.
func (s *Store) Build(o BuildOptions, prev *PushContext, version uint64) (*PushContext, ChangeSet) {
	changes := s.pending
	s.pending = ChangeSet{}
	if o.DomainSuffix == "" {
		o.DomainSuffix = DefaultDomainSuffix
	}
	if len(s.hostRefs) > 0 {
		changes.Hosts = map[string]bool{}
		for _, r := range s.hostRefs {
			changes.Hosts[ResolveHost(r.host, r.namespace, o.DomainSuffix)] = true
		}
		s.hostRefs = nil
	}
	pc := &PushContext{
		Version:      strconv.FormatUint(version, 10),
		Seq:          version,
		DomainSuffix: o.DomainSuffix,
		scopes:       map[string]*Scope{},
	}
	pc.Mesh = s.mesh
	if pc.Mesh == nil {
		pc.Mesh = istio.DefaultMeshConfig()
	}
	pc.RootNamespace = cmp.Or(pc.Mesh.GetRootNamespace(), DefaultRootNamespace)
	pc.TrustDomain = cmp.Or(pc.Mesh.GetTrustDomain(), DefaultTrustDomain)

	if prev == nil || changes.Full || prev.DomainSuffix != o.DomainSuffix {
		changes.Full = prev != nil || changes.Full
		if prev == nil || prev.DomainSuffix != o.DomainSuffix {
			changes.All = true
		}
		pc.cfg = s.indexConfig(o.DomainSuffix)
	} else {
		pc.cfg = prev.cfg
	}
	pc.indexEndpoints(s)
	if prev != nil && !changes.Full {
		pc.credentials = prev.credentials // a credential change is a full one
	} else {
		pc.credentials = maps.Clone(s.credentials)
	}
	if locs := pc.cfg.jwksLocations(); len(locs) > 0 && o.JWKS != nil {
		pc.jwks = o.JWKS.Lookup(locs)
	}
	if !changes.Full && prev != nil {
		for key := range changes.Endpoints {
			if needsFullPush(s.services[key], prev.endpoints[key], pc.endpoints[key]) {
				changes.Full, changes.All = true, true
				break
			}
		}
	}
	return pc, changes
}

// needsFullPush reports whether an endpoint change of a service changes
// more than endpoints: DNS clusters carry their endpoints inline, a
// passthrough service without an address has a listener per endpoint
// address (as Istio, which pushes fully when a headless service's
// endpoints change), and the identities clients verify (SPIFFE SANs) come
// from endpoints' service accounts.
func needsFullPush(svc *registryv1.Service, before, after []*registryv1.Endpoint) bool {
	switch svc.GetResolution() {
	case registryv1.Resolution_RESOLUTION_DNS, registryv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN:
		return true
	case registryv1.Resolution_RESOLUTION_NONE:
		if len(svc.GetAddresses()) == 0 && !slices.Equal(addressesOf(before), addressesOf(after)) {
			return true
		}
	}
	accounts := func(eps []*registryv1.Endpoint) []string {
		var out []string
		for _, ep := range eps {
			if sa := ep.GetServiceAccount(); sa != "" {
				out = append(out, ep.GetWorkloadNamespace()+"/"+sa)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return !slices.Equal(accounts(before), accounts(after))
}

func addressesOf(eps []*registryv1.Endpoint) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.GetAddress())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (s *Store) indexConfig(domainSuffix string) *configIndex {
	ci := &configIndex{
		byHost: map[string][]*registryv1.Service{}, sidecars: map[string][]*SidecarConfig{},
		drsByNamespace: map[string]*drIndex{}, peerAuth: map[string][]*PeerAuthentication{}, namespaces: s.namespaces,
		authz: map[string][]*AuthorizationPolicy{}, authn: map[string][]*RequestAuthentication{},
		telemetries:  map[string][]*Telemetry{},
		envoyFilters: map[string][]*EnvoyFilter{},
		extensions:   map[string][]*Extension{},
	}
	for _, svc := range s.services {
		ci.services = append(ci.services, svc)
	}
	slices.SortFunc(ci.services, func(a, b *registryv1.Service) int {
		return cmp.Or(cmp.Compare(a.GetHostname(), b.GetHostname()), cmp.Compare(a.GetNamespace(), b.GetNamespace()))
	})
	for _, svc := range ci.services {
		ci.byHost[svc.GetHostname()] = append(ci.byHost[svc.GetHostname()], svc)
	}
	for _, o := range sortedObjects(s.configs[istio.VirtualService]) {
		spec, ok := o.Spec.(*networking.VirtualService)
		if !ok {
			continue
		}
		vs := &VirtualService{
			Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec,
			GatewaySemantics: o.Meta.Annotations[AnnotationRouteSemantics] == RouteSemanticsGateway,
		}
		for _, h := range spec.GetHosts() {
			vs.Hosts = append(vs.Hosts, ResolveHost(h, o.Meta.Namespace, domainSuffix))
		}
		for _, g := range spec.GetGateways() {
			if g != MeshGateway && !containsSlash(g) {
				g = o.Meta.Namespace + "/" + g
			}
			vs.Gateways = append(vs.Gateways, g)
		}
		if len(vs.Gateways) == 0 {
			vs.Gateways = []string{MeshGateway}
		}
		ci.virtualServices = append(ci.virtualServices, vs)
	}
	mergeDelegates(ci.virtualServices, s.mesh.GetDefaultVirtualServiceExportTo(), domainSuffix)
	ci.vsByGateway = map[string][]*VirtualService{}
	for _, vs := range ci.virtualServices {
		for _, gw := range slices.Compact(slices.Sorted(slices.Values(vs.Gateways))) {
			if gw != MeshGateway {
				ci.vsByGateway[gw] = append(ci.vsByGateway[gw], vs)
			}
		}
	}
	for _, o := range sortedObjects(s.configs[istio.DestinationRule]) {
		spec, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		dr := &DestinationRule{
			Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec,
			Host:       ResolveHost(spec.GetHost(), o.Meta.Namespace, domainSuffix),
			FromPolicy: o.Meta.Annotations[AnnotationParents] != "",
		}
		ci.destinationRules = append(ci.destinationRules, dr)
		idx := ci.drsByNamespace[dr.Namespace]
		if idx == nil {
			idx = &drIndex{exact: map[string][]*DestinationRule{}}
			ci.drsByNamespace[dr.Namespace] = idx
		}
		if strings.HasPrefix(dr.Host, "*") {
			idx.wildcard = mergeDestinationRule(idx.wildcard, dr)
		} else {
			idx.exact[dr.Host] = mergeDestinationRule(idx.exact[dr.Host], dr)
		}
	}
	for _, o := range sortedObjects(s.configs[istio.Sidecar]) {
		spec, ok := o.Spec.(*networking.Sidecar)
		if !ok {
			continue
		}
		ci.sidecars[o.Meta.Namespace] = append(ci.sidecars[o.Meta.Namespace], &SidecarConfig{Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec})
	}
	for _, o := range sortedObjects(s.configs[istio.PeerAuthentication]) {
		if spec, ok := o.Spec.(*security.PeerAuthentication); ok {
			ci.peerAuth[o.Meta.Namespace] = append(ci.peerAuth[o.Meta.Namespace], &PeerAuthentication{Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec})
		}
	}
	for _, o := range sortedObjects(s.configs[istio.Gateway]) {
		if spec, ok := o.Spec.(*networking.Gateway); ok {
			ci.gateways = append(ci.gateways, &Gateway{
				Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec, Services: gatewayServices(o.Meta.Annotations),
				Granted:         commaList(o.Meta.Annotations, AnnotationGrantedCredentials),
				ParentNamespace: o.Meta.Annotations[AnnotationParentNamespace],
			})
		}
	}
	for _, o := range sortedObjects(s.configs[istio.RequestAuthentication]) {
		if spec, ok := o.Spec.(*security.RequestAuthentication); ok {
			ci.authn[o.Meta.Namespace] = append(ci.authn[o.Meta.Namespace], &RequestAuthentication{Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec})
		}
	}
	for _, o := range sortedObjects(s.configs[istio.AuthorizationPolicy]) {
		if spec, ok := o.Spec.(*security.AuthorizationPolicy); ok {
			ci.authz[o.Meta.Namespace] = append(ci.authz[o.Meta.Namespace], &AuthorizationPolicy{
				Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec, DryRun: dryRun(o.Meta.Annotations),
			})
		}
	}
	for _, o := range sortedObjects(s.configs[istio.Telemetry]) {
		if spec, ok := o.Spec.(*telemetry.Telemetry); ok {
			ci.telemetries[o.Meta.Namespace] = append(ci.telemetries[o.Meta.Namespace], &Telemetry{Name: o.Meta.Name, Namespace: o.Meta.Namespace, Spec: spec})
		}
	}
	for _, o := range sortedObjects(s.configs[istio.EnvoyFilter]) {
		if spec, ok := o.Spec.(*networking.EnvoyFilter); ok {
			ci.envoyFilters[o.Meta.Namespace] = append(ci.envoyFilters[o.Meta.Namespace], newEnvoyFilter(o.Meta.Name, o.Meta.Namespace, o.Meta.CreationTime, spec))
		}
	}
	// WasmPlugins and TrafficExtensions in one creation order (Istio
	// lists the WasmPlugins' TrafficExtensions with the others).
	exts := slices.Concat(sortedObjects(s.configs[istio.WasmPlugin]), sortedObjects(s.configs[istio.TrafficExtension]))
	slices.SortStableFunc(exts, istio.CreationOrder)
	for _, o := range exts {
		// One Istio leaves out is left out (galley's validation refuses
		// those before they come here).
		e, err := newExtension(o)
		if err != nil {
			continue
		}
		ci.extensions[o.Meta.Namespace] = append(ci.extensions[o.Meta.Namespace], e)
	}
	return ci
}

func containsSlash(s string) bool {
	for i := range len(s) {
		if s[i] == '/' {
			return true
		}
	}
	return false
}

// sortedObjects are objects in the order Istio gives them precedence:
// oldest first (istio.CreationOrder).
func sortedObjects(m map[string]*istio.Object) []*istio.Object {
	out := make([]*istio.Object, 0, len(m))
	for _, o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, istio.CreationOrder)
	return out
}

// indexEndpoints merges every service's endpoint sets, in shard order.
func (pc *PushContext) indexEndpoints(s *Store) {
	names := make([]string, 0, len(s.endpointSets))
	for n := range s.endpointSets {
		names = append(names, n)
	}
	slices.Sort(names)
	pc.endpoints = map[string][]*registryv1.Endpoint{}
	pc.byAddress = map[netip.Addr][]Instance{}
	for _, n := range names {
		es := s.endpointSets[n]
		key := registry.ServiceName(es.GetServiceNamespace(), es.GetServiceHostname())
		pc.endpoints[key] = append(pc.endpoints[key], es.GetEndpoints()...)
		svc := s.services[key]
		if svc == nil {
			continue
		}
		for _, ep := range es.GetEndpoints() {
			if a, err := netip.ParseAddr(ep.GetAddress()); err == nil {
				pc.byAddress[a] = append(pc.byAddress[a], Instance{Service: svc, Endpoint: ep})
			}
		}
	}
}

// Credential returns the credential (Secret) of a namespace by name, or
// nil.
func (pc *PushContext) Credential(namespace, name string) *registryv1.Credential {
	return pc.credentials[registry.CredentialName(namespace, name)]
}

// ConfigMapCACertificates returns the CA certificates of a ConfigMap of a
// namespace by name that galley published (a Gateway API listener's
// caCertificateRefs name it), or nil.
func (pc *PushContext) ConfigMapCACertificates(namespace, name string) []byte {
	return pc.credentials[registry.ConfigMapCredentialName(namespace, name)].GetCaCertificates()
}

// Services returns every service, sorted by hostname and namespace.
func (pc *PushContext) Services() []*registryv1.Service { return pc.cfg.services }

// ServicesByHost returns the services of a hostname, by namespace.
func (pc *PushContext) ServicesByHost(host string) []*registryv1.Service { return pc.cfg.byHost[host] }

// Endpoints returns a service's endpoints.
func (pc *PushContext) Endpoints(svc *registryv1.Service) []*registryv1.Endpoint {
	return pc.endpoints[registry.ServiceName(svc.GetNamespace(), svc.GetHostname())]
}

// VirtualServices returns every VirtualService, oldest first.
func (pc *PushContext) VirtualServices() []*VirtualService { return pc.cfg.virtualServices }

// DestinationRules returns every DestinationRule, oldest first.
func (pc *PushContext) DestinationRules() []*DestinationRule { return pc.cfg.destinationRules }

// Instances returns the service endpoints at the proxy's addresses: the
// services its workload belongs to, by hostname.
func (pc *PushContext) Instances(p *Proxy) []Instance {
	var out []Instance
	for _, ip := range p.IPs {
		for _, in := range pc.byAddress[ip] {
			if in.Service.GetNamespace() == p.Namespace || in.Endpoint.GetWorkloadNamespace() == p.Namespace {
				out = append(out, in)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Instance) int { return cmp.Compare(a.Service.GetHostname(), b.Service.GetHostname()) })
	return out
}

// AutoMTLS reports whether clients use mTLS towards sidecars on their own
// when no DestinationRule says otherwise (mesh enableAutoMtls, default on).
func (pc *PushContext) AutoMTLS() bool {
	if v := pc.Mesh.GetEnableAutoMtls(); v != nil {
		return v.GetValue()
	}
	return true
}

// AllowAny reports whether outbound traffic to unknown destinations passes
// through (outboundTrafficPolicy ALLOW_ANY, the default) rather than being
// dropped (REGISTRY_ONLY).
func (pc *PushContext) AllowAny() bool {
	// Istio's default mesh configuration says ALLOW_ANY; only a policy
	// that is written down can say otherwise (REGISTRY_ONLY is the enum's
	// zero value, so "absent" must not read as it).
	p := pc.Mesh.GetOutboundTrafficPolicy()
	return p == nil || p.GetMode() != meshv1alpha1.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY
}

// EndpointsAt are the endpoints of the service "namespace/hostname" at
// any of ips (a proxy's own addresses), in the push context's order; nil
// for a nil push context.
func (pc *PushContext) EndpointsAt(key string, ips []netip.Addr) []*registryv1.Endpoint {
	if pc == nil {
		return nil
	}
	var out []*registryv1.Endpoint
	for _, ep := range pc.endpoints[key] {
		for _, ip := range ips {
			if ep.GetAddress() == ip.String() {
				out = append(out, ep)
				break
			}
		}
	}
	return out
}
