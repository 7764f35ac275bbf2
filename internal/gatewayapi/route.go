package gatewayapi

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// route is what binding and status need of a route of any kind.
type route struct {
	ref        Ref
	meta       *metav1.ObjectMeta
	parentRefs []gw.ParentReference
	hostnames  []gw.Hostname
	current    []gw.RouteParentStatus
}

// keyedVS is a route's VirtualService with the key HTTP and gRPC routes
// sharing a parent and host are merged by (Istio's RouteWithKey).
type keyedVS struct {
	obj *istio.Object
	key string // "" for TCP and TLS routes, never merged
}

// parentError is why a parent refused a route (Istio's ParentError).
type parentError struct {
	reason  gw.RouteConditionReason
	message string
}

// routeParent is one (parentRef, listener) pair a route names (Istio's
// routeParentReference).
type routeParent struct {
	internalName string
	internalKind string // Gateway, ListenerSet, Service or ServiceEntry
	hostname     string // the listener's hostname
	denied       *parentError
	original     gw.ParentReference
	banned       set
	key          parentKey
	section      gw.SectionName
	controller   gw.GatewayController
}

func (r routeParent) mesh() bool { return r.internalName == "mesh" }

// routes converts every route kind.
func (c *converter) routes() {
	for _, r := range c.in.HTTPRoutes {
		c.httpRoute(r)
	}
	for _, r := range c.in.GRPCRoutes {
		c.grpcRoute(r)
	}
	for _, r := range c.in.TCPRoutes {
		c.tcpRoute(r)
	}
	for _, r := range c.in.TLSRoutes {
		c.tlsRoute(r)
	}
}

// normalize returns a reference's group and kind with defaults.
func normalize[G ~string, K ~string](group *G, kind *K, defGroup, defKind string) (string, string) {
	g, k := defGroup, defKind
	if group != nil {
		g = string(*group)
	}
	if kind != nil {
		k = string(*kind)
	}
	return g, k
}

// parentKind maps a parentRef's group and kind to the kinds a route may
// bind to (Istio's toInternalParentReference); "" when unsupported.
func parentKind(p gw.ParentReference) string {
	g, k := normalize(p.Group, p.Kind, Group, KindGateway)
	switch {
	case g == Group && (k == KindGateway || k == KindListenerSet):
		return k
	case g == "" && k == "Service":
		return "Service"
	case g == "networking.istio.io" && k == "ServiceEntry":
		return "ServiceEntry"
	}
	return ""
}

// meshParentInfo is the one listener of the mesh.
func (c *converter) meshParentInfo() *parentInfo {
	return &parentInfo{
		InternalName: "mesh",
		AllowedKinds: []gw.RouteGroupKind{routeKind(KindHTTPRoute), routeKind(KindGRPCRoute), routeKind(KindTCPRoute), routeKind(KindTLSRoute)},
		controller:   c.in.Controllers[0],
	}
}

// routeParents resolves a route's parentRefs (Istio's
// extractParentReferenceInfo), sorted by reference.
func (c *converter) routeParents(r route) []routeParent {
	var out []routeParent
	for _, ref := range r.parentRefs {
		kind := parentKind(ref)
		if kind == "" {
			continue
		}
		pk := parentKey{Kind: kind, Namespace: string(derefOr(ref.Namespace, gw.Namespace(r.ref.Namespace))), Name: string(ref.Name)}
		var parents []*parentInfo
		if kind == KindGateway || kind == KindListenerSet {
			parents = c.parents[pk]
		} else {
			parents = []*parentInfo{c.meshParentInfo()}
		}
		for _, p := range parents {
			banned := set{}
			for _, o := range parents {
				if o != p && o.Port == p.Port && o.Protocol == p.Protocol {
					banned.add(o.OriginalHostname)
				}
			}
			delete(banned, p.OriginalHostname)
			out = append(out, routeParent{
				internalName: p.InternalName, internalKind: kind, hostname: p.OriginalHostname,
				denied:   c.referenceAllowed(p, r, pk, ref),
				original: ref, banned: banned, key: pk, section: p.SectionName, controller: p.controller,
			})
		}
	}
	slices.SortStableFunc(out, func(a, b routeParent) int {
		return strings.Compare(parentRefString(a.original, r.ref.Namespace), parentRefString(b.original, r.ref.Namespace))
	})
	return out
}

// referenceAllowed is why parent refuses the route, or nil (Istio's
// referenceAllowed).
func (c *converter) referenceAllowed(parent *parentInfo, r route, pk parentKey, ref gw.ParentReference) *parentError {
	switch pk.Kind {
	case "Service":
		if _, ok := c.in.Cluster.Service(pk.Namespace, pk.Name); !ok {
			return &parentError{reason: gw.RouteReasonNoMatchingParent, message: fmt.Sprintf("parent service: %q not found", pk.Name)}
		}
	case "ServiceEntry":
		if _, ok := c.in.Cluster.ServiceEntryHosts(pk.Namespace, pk.Name); !ok {
			return &parentError{reason: gw.RouteReasonNoMatchingParent, message: fmt.Sprintf("parent service entry: %q not found", pk.Name)}
		}
	default:
		if port := deref(ref.Port); port != 0 && port != parent.Port {
			return &parentError{reason: gw.RouteReasonNoMatchingParent, message: fmt.Sprintf("port %v not found", port)}
		}
		if s := deref(ref.SectionName); s != "" && s != parent.SectionName {
			return &parentError{reason: gw.RouteReasonNoMatchingParent, message: fmt.Sprintf("sectionName %q not found", s)}
		}
		hostnames := r.hostnames
		if len(hostnames) == 0 {
			hostnames = []gw.Hostname{"*"}
		}
		if len(parent.Hostnames) > 0 {
			matched, hostMatched := false, false
		out:
			for _, rh := range hostnames {
				for _, ph := range parent.Hostnames {
					ns, h, ok := strings.Cut(ph, "/")
					if !ok {
						ns, h = "*", ph
					}
					hm := hostMatches(h, string(rh))
					hostMatched = hostMatched || hm
					if hm && (ns == "*" || ns == r.ref.Namespace) {
						matched = true
						break out
					}
				}
			}
			if !matched {
				if hostMatched {
					return &parentError{reason: gw.RouteReasonNotAllowedByListeners, message: fmt.Sprintf(
						"hostnames matched parent hostname %q, but namespace %q is not allowed by the parent", parent.OriginalHostname, r.ref.Namespace)}
				}
				return &parentError{reason: gw.RouteReasonNoMatchingListenerHostname, message: fmt.Sprintf(
					"no hostnames matched parent hostname %q", parent.OriginalHostname)}
			}
		}
	}
	for _, ak := range parent.AllowedKinds {
		if string(ak.Kind) == r.ref.Kind && derefOr(ak.Group, Group) == Group {
			return nil
		}
	}
	return &parentError{reason: gw.RouteReasonNotAllowedByListeners, message: fmt.Sprintf("kind %v is not allowed", Group+"/v1/"+r.ref.Kind)}
}

// hostMatches is Istio's host.Name.Matches: one of a and b covers the
// other.
func hostMatches(a, b string) bool { return model.HostMatches(a, b) || model.HostMatches(b, a) }

// allowedByIsolation is Istio's hostnameAllowedByIsolation: a route host
// that a more specific listener of the same port takes is left to it.
func (r routeParent) allowedByIsolation(routeHost string) bool {
	ours := r.hostname
	if ours != "" && !strings.HasPrefix(ours, "*") {
		return true
	}
	if ours != "" && !hostMatches(routeHost, ours) {
		return false
	}
	for other := range r.banned {
		if len(ours) > len(other) {
			continue
		}
		if model.HostMatches(other, routeHost) { // Istio's routeHost.SubsetOf(other)
			return false
		}
	}
	return true
}

func parentRefString(ref gw.ParentReference, ns string) string {
	return fmt.Sprintf("%s/%s/%s/%s/%d.%s", derefOr(ref.Group, Group), derefOr(ref.Kind, KindGateway), ref.Name,
		deref(ref.SectionName), deref(ref.Port), derefOr(ref.Namespace, gw.Namespace(ns)))
}

// bound returns the parents that accepted the route, by internal name
// (Istio's filteredReferences).
func bound(parents []routeParent) []routeParent {
	var out []routeParent
	for _, p := range parents {
		if p.denied == nil {
			out = append(out, p)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].internalName < out[j].internalName })
	return out
}

// parentResult is a parent's verdict and the rules' errors for it.
type parentResult struct {
	original gw.ParentReference
	denied   *parentError
	routeErr *configError
	ctl      gw.GatewayController
}

// routeStatus sets the route's parents' status (Istio's
// createRouteStatus): one entry per parentRef, keeping the entries of
// other controllers, the most favourable verdict when a parentRef binds
// to several listeners.
func (c *converter) reportRoute(r route, parents []routeParent, meshErr, gwErr *configError) {
	results := make([]parentResult, 0, len(parents))
	for _, p := range parents {
		res := parentResult{original: p.original, denied: p.denied, routeErr: gwErr, ctl: p.controller}
		if p.mesh() {
			res.routeErr = meshErr
		}
		results = append(results, res)
	}
	ns := r.ref.Namespace
	cur := slices.Clone(r.current)
	index := map[string]int{}
	for i, p := range cur {
		if !c.controllers[p.ControllerName] {
			continue
		}
		if _, ok := index[parentRefString(p.ParentRef, ns)]; !ok {
			index[parentRefString(p.ParentRef, ns)] = i
		}
	}
	type seen struct {
		results []parentResult
		ok      int
	}
	byRef := map[string]*seen{}
	var order []string
	for _, res := range results {
		k := parentRefString(res.original, ns)
		s := byRef[k]
		if s == nil {
			s = &seen{}
			byRef[k] = s
			order = append(order, k)
		}
		s.results = append(s.results, res)
		if res.denied == nil {
			s.ok++
		}
	}
	rank := func(r parentResult) int {
		if r.denied == nil {
			return 0
		}
		switch r.denied.reason {
		case gw.RouteReasonNotAllowedByListeners:
			return 1
		case gw.RouteReasonNoMatchingListenerHostname:
			return 2
		case "ParentRefConflict":
			return 3
		}
		return 4
	}
	var appended []gw.RouteParentStatus
	for _, k := range order {
		s := byRef[k]
		best := s.results[0]
		if best.denied != nil {
			d := *best.denied
			best.denied = &d
		}
		for _, res := range s.results[1:] {
			switch rr, br := rank(res), rank(best); {
			case rr < br:
				best = res
			case rr == br && res.denied != nil:
				best.denied = &parentError{reason: best.denied.reason, message: best.denied.message + "; " + res.denied.message}
			}
		}
		msg := "Route was valid"
		if s.ok > 1 {
			msg = fmt.Sprintf("Route was valid, bound to %d parents", s.ok)
		}
		conds := map[string]*condition{
			string(gw.RouteConditionAccepted):     {reason: string(gw.RouteReasonAccepted), message: msg},
			string(gw.RouteConditionResolvedRefs): {reason: string(gw.RouteReasonResolvedRefs), message: "All references resolved"},
		}
		if best.routeErr != nil {
			conds[string(gw.RouteConditionResolvedRefs)].err = best.routeErr
		}
		if best.denied != nil {
			conds[string(gw.RouteConditionAccepted)].err = &configError{reason: string(best.denied.reason), message: best.denied.message}
		}
		var existing []metav1.Condition
		i, had := index[k]
		if had {
			existing = cur[i].Conditions
		}
		next := gw.RouteParentStatus{ParentRef: best.original, ControllerName: best.ctl, Conditions: setConditions(r.meta.Generation, existing, conds, c.in.Now)}
		if had {
			cur[i] = next
			delete(index, k)
		} else {
			appended = append(appended, next)
		}
	}
	sort.SliceStable(appended, func(i, j int) bool {
		return parentRefString(appended[i].ParentRef, ns) > parentRefString(appended[j].ParentRef, ns)
	})
	cur = append(cur, appended...)
	stale := map[int]bool{}
	for _, i := range index {
		stale[i] = true
	}
	out := make([]gw.RouteParentStatus, 0, len(cur))
	for i, p := range cur {
		if !stale[i] {
			out = append(out, p)
		}
	}
	c.routeStatus[r.ref] = &gw.RouteStatus{Parents: out}
}

// mine reports whether Flotilla writes the route's status: it names a
// parent of a served class, or the mesh, or it has status of Flotilla's
// to clear.
func (c *converter) mine(r route, parents []routeParent) bool {
	if len(parents) > 0 {
		return true
	}
	for _, p := range r.current {
		if c.controllers[p.ControllerName] {
			return true
		}
	}
	return false
}

// count records the listeners a route binds to (Istio's
// gatewayRouteAttachmentCountCollection), by Gateway or ListenerSet.
func (c *converter) count(parents []routeParent) {
	for _, p := range bound(parents) {
		if p.key.Kind != KindGateway && p.key.Kind != KindListenerSet {
			continue
		}
		owner := Ref(p.key)
		if c.attached[owner] == nil {
			c.attached[owner] = map[gw.SectionName]int32{}
		}
		c.attached[owner][p.section]++
	}
}

// attachedRoutes sets every listener's attachedRoutes (Istio's
// FinalGatewayStatusCollection and FinalListenerSetStatusCollection).
func (c *converter) attachedRoutes() {
	for ref, st := range c.gwStatus {
		for i := range st.Listeners {
			st.Listeners[i].AttachedRoutes = c.attached[ref][st.Listeners[i].Name]
		}
	}
	for ref, st := range c.setStatus {
		for i := range st.Listeners {
			st.Listeners[i].AttachedRoutes = c.attached[ref][st.Listeners[i].Name]
		}
	}
}

// meshHosts are the hosts of a Service or ServiceEntry parent.
func (c *converter) meshHosts(p routeParent, routeNS string) []string {
	ns := string(derefOr(p.original.Namespace, gw.Namespace(routeNS)))
	if p.internalKind == "ServiceEntry" {
		hosts, _ := c.in.Cluster.ServiceEntryHosts(ns, string(p.original.Name))
		return hosts
	}
	return []string{string(p.original.Name) + "." + ns + ".svc." + c.in.DomainSuffix}
}

// httpVirtualServices builds the VirtualServices of an HTTP or gRPC
// route: one per bound parent and host, keyed for merging (Istio's
// HTTPRouteCollection).
func (c *converter) httpVirtualServices(r route, parents []routeParent, meshRoutes, gwRoutes []*networking.HTTPRoute) {
	count := 0
	for _, p := range bound(parents) {
		key := p.internalName
		hosts := hostStrings(r.hostnames)
		routes := gwRoutes
		if p.mesh() {
			routes = meshRoutes
			key = r.ref.Namespace
			if port := p.original.Port; port != nil {
				routes = withPort(routes, uint32(*port)) //nolint:gosec // a port number
				key += "/" + strconv.Itoa(int(*port))
			}
			hosts = c.meshHosts(p, r.ref.Namespace)
		}
		if len(routes) == 0 {
			continue
		}
		for _, h := range hosts {
			if !p.allowedByIsolation(h) {
				continue
			}
			sortHTTPRoutes(routes)
			c.virtualServices = append(c.virtualServices, keyedVS{
				key: key + "/" + h,
				obj: c.routeObject(r, r.meta.Name+"~"+strconv.Itoa(count)+"~"+GeneratedName, &networking.VirtualService{
					Hosts: []string{h}, Gateways: []string{p.internalName}, Http: routes,
				}),
			})
			count++
		}
	}
}

func (c *converter) routeObject(r route, name string, vs *networking.VirtualService) *istio.Object {
	return &istio.Object{
		Kind: c.kinds[istio.VirtualService],
		Meta: istio.Meta{
			Name: name, Namespace: r.ref.Namespace, CreationTime: r.meta.CreationTimestamp.Time,
			Annotations: map[string]string{
				AnnotationParents:              r.ref.Kind + "/" + r.ref.Name + "." + r.ref.Namespace,
				model.AnnotationRouteSemantics: model.RouteSemanticsGateway,
			},
		},
		Spec: vs,
	}
}

func hostStrings(hs []gw.Hostname) []string {
	if len(hs) == 0 {
		return []string{"*"}
	}
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = string(h)
	}
	return out
}

// withPort adds a port to every match of the routes (Istio's
// augmentPortMatch).
func withPort(routes []*networking.HTTPRoute, port uint32) []*networking.HTTPRoute {
	out := make([]*networking.HTTPRoute, 0, len(routes))
	for _, r := range routes {
		r = proto.Clone(r).(*networking.HTTPRoute)
		for _, m := range r.Match {
			m.Port = port
		}
		if len(r.Match) == 0 {
			r.Match = []*networking.HTTPMatchRequest{{Port: port}}
		}
		out = append(out, r)
	}
	return out
}

// sortHTTPRoutes orders routes as the Gateway API requires (Istio's
// sortHTTPRoutes): exact, then prefix, then regex paths, longer first;
// then those with a method, more headers, more query parameters; routes
// without a match last; otherwise as they came.
func sortHTTPRoutes(routes []*networking.HTTPRoute) {
	sort.SliceStable(routes, func(i, j int) bool {
		if len(routes[i].Match) == 0 {
			return false
		}
		if len(routes[j].Match) == 0 {
			return true
		}
		m1, m2 := routes[i].Match[0], routes[j].Match[0]
		r1, r2 := uriRank(m1), uriRank(m2)
		l1, l2 := uriLength(m1), uriLength(m2)
		switch {
		case r1 != r2:
			return r1 > r2
		case l1 != l2:
			return l1 > l2
		case (m1.Method == nil) != (m2.Method == nil):
			return m1.Method != nil
		case len(m1.Headers) != len(m2.Headers):
			return len(m1.Headers) > len(m2.Headers)
		}
		return len(m1.QueryParams) > len(m2.QueryParams)
	})
}

func uriRank(m *networking.HTTPMatchRequest) int {
	switch m.GetUri().GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		return 3
	case *networking.StringMatch_Prefix:
		return 2
	case *networking.StringMatch_Regex:
		return 1
	}
	return -1
}

func uriLength(m *networking.HTTPMatchRequest) int {
	u := m.GetUri()
	return len(u.GetExact()) + len(u.GetPrefix()) + len(u.GetRegex())
}

// mergeVirtualServices merges the HTTP and gRPC VirtualServices that share
// a parent and host into one, named by the key, oldest route's first
// (Istio's mergeHTTPRoutes); TCP and TLS ones pass as they are.
func (c *converter) mergeVirtualServices() []*istio.Object {
	byKey := map[string][]*istio.Object{}
	var out []*istio.Object
	for _, v := range c.virtualServices {
		if v.key == "" {
			out = append(out, v.obj)
			continue
		}
		byKey[v.key] = append(byKey[v.key], v.obj)
	}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		objs := byKey[key]
		slices.SortStableFunc(objs, func(a, b *istio.Object) int {
			if r := a.Meta.CreationTime.Compare(b.Meta.CreationTime); r != 0 {
				return r
			}
			if r := cmp.Compare(a.Meta.Namespace, b.Meta.Namespace); r != 0 {
				return r
			}
			return cmp.Compare(a.Meta.Name, b.Meta.Name)
		})
		base := objs[0].DeepCopy()
		base.Meta.Name = strings.ReplaceAll(key, "/", "~")
		vs := base.Spec.(*networking.VirtualService)
		for _, o := range objs[1:] {
			vs.Http = append(vs.Http, o.Spec.(*networking.VirtualService).Http...)
			base.Meta.Annotations[AnnotationParents] += "," + o.Meta.Annotations[AnnotationParents]
		}
		if len(objs) > 1 {
			sortHTTPRoutes(vs.Http)
		}
		out = append(out, base)
	}
	return out
}
