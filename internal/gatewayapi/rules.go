package gatewayapi

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// ruleSet is a route's converted rules for the mesh or for gateways:
// the routes, and the last error (Istio's conversionResult).
type ruleSet[T any] struct {
	routes []T
	err    *configError
}

// convertRules converts rules once for the mesh and once for gateways
// when the route has parents of each (Istio's buildMeshAndGatewayRoutes):
// a rule that cannot be converted at all drops every rule.
func convertRules[T any](parents []routeParent, conv func(mesh bool) func(yield func(T, *configError) bool)) (mesh, gateway ruleSet[T]) {
	needMesh, needGW := false, false
	for _, p := range parents {
		if p.mesh() {
			needMesh = true
		} else {
			needGW = true
		}
	}
	run := func(m bool) ruleSet[T] {
		var res ruleSet[T]
		for r, err := range conv(m) {
			if isNil(r) {
				return ruleSet[T]{err: err}
			}
			if err != nil {
				res.err = err
			}
			res.routes = append(res.routes, r)
		}
		return res
	}
	if needMesh {
		mesh = run(true)
	}
	if needGW {
		gateway = run(false)
	}
	return mesh, gateway
}

func isNil(v any) bool {
	switch r := v.(type) {
	case *networking.HTTPRoute:
		return r == nil
	case *networking.TCPRoute:
		return r == nil
	case *networking.TLSRoute:
		return r == nil
	}
	return v == nil
}

func (c *converter) httpRoute(obj *gw.HTTPRoute) {
	convertHTTPLike(c, route{
		ref: Ref{Kind: KindHTTPRoute, Namespace: obj.Namespace, Name: obj.Name}, meta: &obj.ObjectMeta,
		parentRefs: obj.Spec.ParentRefs, hostnames: obj.Spec.Hostnames, current: obj.Status.Parents,
	},
		obj.Spec.Rules, func(r *gw.HTTPRouteRule) *[]gw.HTTPRouteMatch { return &r.Matches },
		func(r gw.HTTPRouteRule, n int, enforceGrants bool) (*networking.HTTPRoute, *configError) {
			return c.httpRule(r, obj, n, enforceGrants)
		})
}

func (c *converter) grpcRoute(obj *gw.GRPCRoute) {
	convertHTTPLike(c, route{
		ref: Ref{Kind: KindGRPCRoute, Namespace: obj.Namespace, Name: obj.Name}, meta: &obj.ObjectMeta,
		parentRefs: obj.Spec.ParentRefs, hostnames: obj.Spec.Hostnames, current: obj.Status.Parents,
	},
		obj.Spec.Rules, func(r *gw.GRPCRouteRule) *[]gw.GRPCRouteMatch { return &r.Matches },
		func(r gw.GRPCRouteRule, n int, enforceGrants bool) (*networking.HTTPRoute, *configError) {
			return c.grpcRule(r, obj, n, enforceGrants)
		})
}

// convertHTTPLike converts an HTTPRoute's or a GRPCRoute's rules, one
// Istio route per match so that they can be sorted (Istio's
// HTTPRouteCollection and GRPCRouteCollection), sets its status and
// builds its VirtualServices.
func convertHTTPLike[R, M any](c *converter, r route, rules []R, matches func(*R) *[]M,
	conv func(rule R, pos int, enforceGrants bool) (*networking.HTTPRoute, *configError),
) {
	parents := c.routeParents(r)
	if !c.mine(r, parents) {
		return
	}
	mesh, gwr := convertRules(parents, func(m bool) func(yield func(*networking.HTTPRoute, *configError) bool) {
		return func(yield func(*networking.HTTPRoute, *configError) bool) {
			for n, rule := range rules {
				all := *matches(&rule)
				if len(all) == 0 {
					if !yield(conv(rule, n, !m)) {
						return
					}
					continue
				}
				for i := range all {
					*matches(&rule) = all[i : i+1]
					if !yield(conv(rule, n, !m)) {
						return
					}
				}
			}
		}
	})
	c.reportRoute(r, parents, mesh.err, gwr.err)
	c.count(parents)
	c.httpVirtualServices(r, parents, mesh.routes, gwr.routes)
}

func (c *converter) tcpRoute(obj *gw.TCPRoute) {
	r := route{
		ref: Ref{Kind: KindTCPRoute, Namespace: obj.Namespace, Name: obj.Name}, meta: &obj.ObjectMeta,
		parentRefs: obj.Spec.ParentRefs, current: obj.Status.Parents,
	}
	parents := c.routeParents(r)
	if !c.mine(r, parents) {
		return
	}
	mesh, gwr := convertRules(parents, func(m bool) func(yield func(*networking.TCPRoute, *configError) bool) {
		return func(yield func(*networking.TCPRoute, *configError) bool) {
			for _, rule := range obj.Spec.Rules {
				dests, err := c.l4Destinations(rule.BackendRefs, obj.Namespace, !m, KindTCPRoute)
				if !yield(&networking.TCPRoute{Route: dests}, err) {
					return
				}
			}
		}
	})
	c.reportRoute(r, parents, mesh.err, gwr.err)
	c.count(parents)
	count := 0
	for _, p := range bound(parents) {
		routes, hosts := gwr.routes, []string{"*"}
		if p.mesh() {
			routes = mesh.routes
			if port := p.original.Port; port != nil {
				routes = withTCPPort(routes, uint32(*port)) //nolint:gosec // a port number
			}
			hosts = c.meshHosts(p, r.ref.Namespace)
		}
		for _, h := range hosts {
			c.virtualServices = append(c.virtualServices, keyedVS{obj: c.routeObject(r, fmt.Sprintf("%s~tcp~%d~%s", obj.Name, count, GeneratedName),
				&networking.VirtualService{Hosts: []string{h}, Gateways: []string{p.internalName}, Tcp: routes})})
			count++
		}
	}
}

func (c *converter) tlsRoute(obj *gw.TLSRoute) {
	r := route{
		ref: Ref{Kind: KindTLSRoute, Namespace: obj.Namespace, Name: obj.Name}, meta: &obj.ObjectMeta,
		parentRefs: obj.Spec.ParentRefs, hostnames: obj.Spec.Hostnames, current: obj.Status.Parents,
	}
	parents := c.routeParents(r)
	if !c.mine(r, parents) {
		return
	}
	mesh, gwr := convertRules(parents, func(m bool) func(yield func(*networking.TLSRoute, *configError) bool) {
		return func(yield func(*networking.TLSRoute, *configError) bool) {
			for _, rule := range obj.Spec.Rules {
				dests, err := c.l4Destinations(rule.BackendRefs, obj.Namespace, !m, KindTLSRoute)
				tr := &networking.TLSRoute{Route: dests}
				if weightSum(rule.BackendRefs) > 0 {
					tr.Match = []*networking.TLSMatchAttributes{{SniHosts: hostStrings(obj.Spec.Hostnames)}}
				}
				if !yield(tr, err) {
					return
				}
			}
		}
	})
	c.reportRoute(r, parents, mesh.err, gwr.err)
	c.count(parents)
	count := 0
	for _, p := range bound(parents) {
		routes, hosts := gwr.routes, hostStrings(obj.Spec.Hostnames)
		switch {
		case p.mesh():
			routes = mesh.routes
			hosts = c.meshHosts(p, r.ref.Namespace)
			routes = withTLSPort(routes, p.original.Port, hosts)
		case p.hostname != "":
			hosts = intersectHosts(hosts, p.hostname)
			routes = constrainTLS(routes, p.hostname)
		}
		for _, h := range hosts {
			rs := routes
			if p.mesh() {
				rs = tlsRoutesFor(routes, h)
			}
			c.virtualServices = append(c.virtualServices, keyedVS{obj: c.routeObject(r, fmt.Sprintf("%s~tls~%d~%s", obj.Name, count, GeneratedName),
				&networking.VirtualService{Hosts: []string{h}, Gateways: []string{p.internalName}, Tls: rs})})
			count++
		}
	}
}

// withTCPPort is Istio's augmentTCPPortMatch.
func withTCPPort(routes []*networking.TCPRoute, port uint32) []*networking.TCPRoute {
	out := make([]*networking.TCPRoute, 0, len(routes))
	for _, r := range routes {
		r = cloneProto(r)
		for _, m := range r.Match {
			m.Port = port
		}
		if len(r.Match) == 0 {
			r.Match = []*networking.L4MatchAttributes{{Port: port}}
		}
		out = append(out, r)
	}
	return out
}

// withTLSPort is Istio's augmentTLSPortMatch: a route for any host takes
// the parent's hosts as SNI.
func withTLSPort(routes []*networking.TLSRoute, port *gw.PortNumber, parentHosts []string) []*networking.TLSRoute {
	out := make([]*networking.TLSRoute, 0, len(routes))
	for _, r := range routes {
		r = cloneProto(r)
		if len(r.Match) == 1 && len(r.Match[0].SniHosts) == 1 && r.Match[0].SniHosts[0] == "*" {
			r.Match[0].SniHosts = parentHosts
		}
		if port != nil {
			for _, m := range r.Match {
				m.Port = uint32(*port) //nolint:gosec // a port number
			}
		}
		out = append(out, r)
	}
	return out
}

// tlsRoutesFor keeps, of a route's several SNI hosts, those host matches
// (Istio's compatibleRoutesForHost).
func tlsRoutesFor(routes []*networking.TLSRoute, host string) []*networking.TLSRoute {
	out := make([]*networking.TLSRoute, 0, len(routes))
	for _, r := range routes {
		if len(r.Match) == 1 && len(r.Match[0].SniHosts) > 1 {
			r = cloneProto(r)
			var sni []string
			for _, h := range r.Match[0].SniHosts {
				if hostMatches(host, h) {
					sni = append(sni, h)
				}
			}
			r.Match[0].SniHosts = sni
		}
		out = append(out, r)
	}
	return out
}

// constrainTLS narrows SNI hosts to the listener's hostname (Istio's
// constrainTLSRoutesToListenerHost).
func constrainTLS(routes []*networking.TLSRoute, listenerHost string) []*networking.TLSRoute {
	out := make([]*networking.TLSRoute, 0, len(routes))
	for _, r := range routes {
		r = cloneProto(r)
		has := false
		for _, m := range r.Match {
			m.SniHosts = intersectHosts(m.SniHosts, listenerHost)
			has = has || len(m.SniHosts) > 0
		}
		if has || len(r.Match) == 0 {
			out = append(out, r)
		}
	}
	return out
}

// intersectHosts is Istio's host.Names.Intersection with one listener
// host: for each host, the more specific of it and the listener's when
// they match.
func intersectHosts(hosts []string, listener string) []string {
	var out []string
	seen := set{}
	for _, h := range hosts {
		if !hostMatches(h, listener) {
			continue
		}
		v := h
		if model.HostMatches(h, listener) { // Istio's listener.SubsetOf(h)
			v = listener
		}
		if !seen[v] {
			seen.add(v)
			out = append(out, v)
		}
	}
	return out
}

// httpRule converts one HTTPRoute rule with at most one match (Istio's
// convertHTTPRoute).
func (c *converter) httpRule(r gw.HTTPRouteRule, obj *gw.HTTPRoute, pos int, enforceGrants bool) (*networking.HTTPRoute, *configError) {
	vs := &networking.HTTPRoute{Name: obj.Namespace + "." + obj.Name + "." + strconv.Itoa(pos)}
	if r.Name != nil {
		vs.Name = string(*r.Name)
	}
	for _, m := range r.Matches {
		uri, err := uriMatch(m)
		if err != nil {
			return nil, err
		}
		headers, err := headerMatches(m.Headers)
		if err != nil {
			return nil, err
		}
		query, err := queryMatches(m.QueryParams)
		if err != nil {
			return nil, err
		}
		var method *networking.StringMatch
		if m.Method != nil {
			method = exact(string(*m.Method))
		}
		vs.Match = append(vs.Match, &networking.HTTPMatchRequest{Uri: uri, Headers: headers, QueryParams: query, Method: method})
	}
	var mirrorErr *configError
	for _, f := range r.Filters {
		switch f.Type {
		case gw.HTTPRouteFilterRequestHeaderModifier:
			if err := addHeaders(&vs.Headers, f.RequestHeaderModifier, false); err != nil {
				return nil, err
			}
		case gw.HTTPRouteFilterResponseHeaderModifier:
			if err := addHeaders(&vs.Headers, f.ResponseHeaderModifier, true); err != nil {
				return nil, err
			}
		case gw.HTTPRouteFilterRequestRedirect:
			vs.Redirect = redirectFilter(f.RequestRedirect)
		case gw.HTTPRouteFilterRequestMirror:
			m, err := c.mirrorFilter(f.RequestMirror, obj.Namespace, enforceGrants, KindHTTPRoute)
			if err != nil {
				mirrorErr = err
			} else if m != nil {
				vs.Mirrors = append(vs.Mirrors, m)
			}
		case gw.HTTPRouteFilterURLRewrite:
			vs.Rewrite = rewriteFilter(f.URLRewrite)
		case gw.HTTPRouteFilterCORS:
			vs.CorsPolicy = corsFilter(f.CORS)
		default:
			return nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
		}
	}
	if r.Retry != nil {
		// "Implementations SHOULD retry on connection errors (disconnect,
		// reset, timeout, TCP failure) if a retry stanza is configured."
		retryOn := []string{"connect-failure", "refused-stream", "unavailable", "cancelled"}
		for _, code := range r.Retry.Codes {
			retryOn = append(retryOn, strconv.Itoa(int(code)))
		}
		attempts := 2
		if r.Retry.Attempts != nil {
			attempts = *r.Retry.Attempts
		}
		vs.Retries = &networking.HTTPRetry{Attempts: int32(attempts), RetryOn: strings.Join(retryOn, ",")}
		if attempts == 0 {
			vs.Retries.RetryOn = ""
		}
		if r.Retry.Backoff != nil {
			d, _ := time.ParseDuration(string(*r.Retry.Backoff))
			vs.Retries.Backoff = durationpb.New(d)
		}
	}
	if t := r.Timeouts; t != nil {
		if t.Request != nil {
			if d, _ := time.ParseDuration(string(*t.Request)); d != 0 {
				vs.Timeout = durationpb.New(d)
			}
		}
		if t.BackendRequest != nil {
			if d, _ := time.ParseDuration(string(*t.BackendRequest)); d != 0 {
				if vs.Retries != nil {
					vs.Retries.PerTryTimeout = durationpb.New(d)
				} else {
					vs.Timeout = durationpb.New(d)
				}
			}
		}
	}
	if httpWeightSum(r.BackendRefs) == 0 && vs.Redirect == nil {
		// The spec: no backend of weight > 0 returns 500.
		vs.DirectResponse = &networking.HTTPDirectResponse{Status: 500}
		return vs, mirrorErr
	}
	backends := make([]backend, len(r.BackendRefs))
	for i, b := range r.BackendRefs {
		backends[i] = backend{ref: b.BackendRef, httpFilters: b.Filters}
	}
	route, backendErr, err := c.httpDestinations(backends, obj.Namespace, enforceGrants, KindHTTPRoute)
	if err != nil {
		return nil, err
	}
	vs.Route = route
	return vs, joinErrors(backendErr, mirrorErr)
}

// grpcRule converts one GRPCRoute rule with at most one match (Istio's
// convertGRPCRoute).
func (c *converter) grpcRule(r gw.GRPCRouteRule, obj *gw.GRPCRoute, pos int, enforceGrants bool) (*networking.HTTPRoute, *configError) {
	vs := &networking.HTTPRoute{Name: obj.Namespace + "." + obj.Name + "." + strconv.Itoa(pos)}
	if r.Name != nil {
		vs.Name = string(*r.Name)
	}
	for _, m := range r.Matches {
		uri, err := grpcURIMatch(m)
		if err != nil {
			return nil, err
		}
		hm := make([]gw.HTTPHeaderMatch, len(m.Headers))
		for i, h := range m.Headers {
			hm[i] = gw.HTTPHeaderMatch{Name: gw.HTTPHeaderName(h.Name), Value: h.Value}
			if h.Type != nil {
				t := gw.HeaderMatchType(*h.Type)
				hm[i].Type = &t
			}
		}
		headers, err := headerMatches(hm)
		if err != nil {
			return nil, err
		}
		vs.Match = append(vs.Match, &networking.HTTPMatchRequest{Uri: uri, Headers: headers})
	}
	for _, f := range r.Filters {
		switch f.Type {
		case gw.GRPCRouteFilterRequestHeaderModifier:
			if err := addHeaders(&vs.Headers, f.RequestHeaderModifier, false); err != nil {
				return nil, err
			}
		case gw.GRPCRouteFilterResponseHeaderModifier:
			if err := addHeaders(&vs.Headers, f.ResponseHeaderModifier, true); err != nil {
				return nil, err
			}
		case gw.GRPCRouteFilterRequestMirror:
			m, err := c.mirrorFilter(f.RequestMirror, obj.Namespace, enforceGrants, KindGRPCRoute)
			if err != nil {
				return nil, err
			}
			if m != nil {
				vs.Mirrors = append(vs.Mirrors, m)
			}
		default:
			return nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
		}
	}
	sum := 0
	backends := make([]backend, len(r.BackendRefs))
	for i, b := range r.BackendRefs {
		backends[i] = backend{ref: b.BackendRef, grpcFilters: b.Filters}
		sum += int(derefOr(b.Weight, 1))
	}
	if sum == 0 {
		vs.DirectResponse = &networking.HTTPDirectResponse{Status: 500}
		return vs, nil
	}
	route, backendErr, err := c.httpDestinations(backends, obj.Namespace, enforceGrants, KindGRPCRoute)
	if err != nil {
		return nil, err
	}
	vs.Route = route
	return vs, backendErr
}

// backend is a backendRef of an HTTP or gRPC rule with its filters.
type backend struct {
	ref         gw.BackendRef
	httpFilters []gw.HTTPRouteFilter
	grpcFilters []gw.GRPCRouteFilter
}

func httpWeightSum(refs []gw.HTTPBackendRef) int {
	sum := 0
	for _, b := range refs {
		sum += int(derefOr(b.Weight, 1))
	}
	return sum
}

func weightSum(refs []gw.BackendRef) int {
	sum := 0
	for _, b := range refs {
		sum += int(derefOr(b.Weight, 1))
	}
	return sum
}

// weighted drops the backends of weight 0 and gives a lone backend weight
// 0, which Istio's VirtualService reads as all traffic (Istio's
// buildHTTPDestination).
func weighted[T any](refs []T, weight func(T) int32) ([]T, []int32) {
	var keep []T
	var ws []int32
	for _, r := range refs {
		if w := weight(r); w != 0 {
			keep = append(keep, r)
			ws = append(ws, w)
		}
	}
	if len(ws) == 1 {
		ws[0] = 0
	}
	return keep, ws
}

// httpDestinations converts an HTTP or gRPC rule's backends (Istio's
// buildHTTPDestination and buildGRPCDestination): the invalid-backend
// error is reported and the route kept (it answers 500); any other error
// drops the rule.
func (c *converter) httpDestinations(refs []backend, ns string, enforceGrants bool, kind string) ([]*networking.HTTPRouteDestination, *configError, *configError) {
	if refs == nil {
		return nil, nil, nil
	}
	keep, ws := weighted(refs, func(b backend) int32 { return derefOr(b.ref.Weight, 1) })
	var invalid *configError
	out := []*networking.HTTPRouteDestination{}
	for i, b := range keep {
		dst, err := c.destination(b.ref, ns, enforceGrants, kind)
		if err != nil {
			if !invalidBackend(err) {
				return nil, nil, err
			}
			invalid = err
		}
		rd := &networking.HTTPRouteDestination{Destination: dst, Weight: ws[i]}
		type hf struct {
			t        string
			req, res *gw.HTTPHeaderFilter
		}
		var filters []hf
		for _, f := range b.httpFilters {
			filters = append(filters, hf{string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier})
		}
		for _, f := range b.grpcFilters {
			filters = append(filters, hf{string(f.Type), f.RequestHeaderModifier, f.ResponseHeaderModifier})
		}
		for _, f := range filters {
			switch f.t {
			case string(gw.HTTPRouteFilterRequestHeaderModifier):
				if err := addHeaders(&rd.Headers, f.req, false); err != nil {
					return nil, nil, err
				}
			case string(gw.HTTPRouteFilterResponseHeaderModifier):
				if err := addHeaders(&rd.Headers, f.res, true); err != nil {
					return nil, nil, err
				}
			default:
				return nil, nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.t)
			}
		}
		out = append(out, rd)
	}
	return out, invalid, nil
}

// l4Destinations converts a TCP or TLS rule's backends (Istio's
// buildTCPDestination); no backend of weight > 0 routes nowhere.
func (c *converter) l4Destinations(refs []gw.BackendRef, ns string, enforceGrants bool, kind string) ([]*networking.RouteDestination, *configError) {
	if weightSum(refs) == 0 {
		return []*networking.RouteDestination{{
			Destination: &networking.Destination{Host: "internal.cluster.local", Subset: "zero-weight", Port: &networking.PortSelector{Number: 65535}},
		}}, nil
	}
	keep, ws := weighted(refs, func(b gw.BackendRef) int32 { return derefOr(b.Weight, 1) })
	var invalid *configError
	out := []*networking.RouteDestination{}
	for i, b := range keep {
		dst, err := c.destination(b, ns, enforceGrants, kind)
		if err != nil {
			if !invalidBackend(err) {
				return nil, err
			}
			invalid = err
		}
		out = append(out, &networking.RouteDestination{Destination: dst, Weight: ws[i]})
	}
	return out, invalid
}

func invalidBackend(err *configError) bool {
	switch err.reason {
	case string(gw.RouteReasonRefNotPermitted), string(gw.RouteReasonBackendNotFound), string(gw.RouteReasonInvalidKind):
		return true
	}
	return false
}

// destination converts a backendRef (Istio's buildDestination): a
// Service, an Istio Hostname (a ServiceEntry's host) or a ServiceImport;
// a Service of another namespace only with a ReferenceGrant (not needed
// for the mesh).
func (c *converter) destination(to gw.BackendRef, ns string, enforceGrants bool, kind string) (*networking.Destination, *configError) {
	group, k := normalize(to.Group, to.Kind, "", "Service")
	if enforceGrants && to.Namespace != nil && string(*to.Namespace) != ns {
		if !c.grants.allowed(kind, ns, k, string(*to.Namespace), string(to.Name)) || group != "" {
			return &networking.Destination{}, errorf(string(gw.RouteReasonRefNotPermitted),
				"backendRef %v/%v not accessible to a %s in namespace %q (missing a ReferenceGrant?)", to.Name, *to.Namespace, kind, ns)
		}
	}
	namespace := string(derefOr(to.Namespace, gw.Namespace(ns)))
	var host string
	var invalid *configError
	switch {
	case group == "" && k == "Service":
		if strings.Contains(string(to.Name), ".") {
			return nil, errorf(reasonInvalidDestination, "service name invalid; the name of the Service must be used, not the hostname.")
		}
		host = string(to.Name) + "." + namespace + ".svc." + c.in.DomainSuffix
		if _, ok := c.in.Cluster.Service(namespace, string(to.Name)); !ok {
			invalid = errorf(string(gw.RouteReasonBackendNotFound), "backend(%s) not found", host)
		}
	case group == "networking.istio.io" && k == "Hostname":
		if to.Namespace != nil {
			return nil, errorf(reasonInvalidDestination, "namespace may not be set with Hostname type")
		}
		host = string(to.Name)
		if !c.in.Cluster.HostnameKnown(host, namespace) {
			invalid = errorf(string(gw.RouteReasonBackendNotFound), "backend(%s) not found", host)
		}
	case group == "multicluster.x-k8s.io" && k == "ServiceImport":
		host = string(to.Name) + "." + namespace + ".svc." + c.in.DomainSuffix
		if _, ok := c.in.Cluster.Service(namespace, string(to.Name)); !ok {
			invalid = errorf(string(gw.RouteReasonBackendNotFound), "backend(%s) not found", host)
		}
	default:
		return &networking.Destination{}, errorf(string(gw.RouteReasonInvalidKind),
			"referencing unsupported backendRef: group %q kind %q", deref(to.Group), deref(to.Kind))
	}
	if to.Port == nil {
		return nil, errorf(reasonInvalidDestination, "port is required in backendRef")
	}
	return &networking.Destination{Host: host, Port: &networking.PortSelector{Number: uint32(*to.Port)}}, invalid //nolint:gosec // a port number
}

func (c *converter) mirrorFilter(f *gw.HTTPRequestMirrorFilter, ns string, enforceGrants bool, kind string) (*networking.HTTPMirrorPolicy, *configError) {
	if f == nil {
		return nil, nil
	}
	one := int32(1)
	dst, err := c.destination(gw.BackendRef{BackendObjectReference: f.BackendRef, Weight: &one}, ns, enforceGrants, kind)
	if err != nil {
		return nil, err
	}
	var pct *networking.Percent
	switch {
	case f.Fraction != nil:
		pct = &networking.Percent{Value: 100 * float64(f.Fraction.Numerator) / float64(derefOr(f.Fraction.Denominator, 100))}
	case f.Percent != nil:
		pct = &networking.Percent{Value: float64(*f.Percent)}
	}
	return &networking.HTTPMirrorPolicy{Destination: dst, Percentage: pct}, nil
}

func rewriteFilter(f *gw.HTTPURLRewriteFilter) *networking.HTTPRewrite {
	if f == nil {
		return nil
	}
	rw := &networking.HTTPRewrite{}
	if f.Path != nil {
		switch f.Path.Type {
		case gw.PrefixMatchHTTPPathModifier:
			rw.Uri = strings.TrimSuffix(deref(f.Path.ReplacePrefixMatch), "/")
			if rw.Uri == "" {
				rw.Uri = "/"
			}
		case gw.FullPathHTTPPathModifier:
			rw.UriRegexRewrite = &networking.RegexRewrite{Match: "/.*", Rewrite: deref(f.Path.ReplaceFullPath)}
		}
	}
	if f.Hostname != nil {
		rw.Authority = string(*f.Hostname)
	}
	if rw.Uri == "" && rw.UriRegexRewrite == nil && rw.Authority == "" {
		return nil
	}
	return rw
}

// corsFilter is Istio's createCorsFilter: "*" is any origin with a
// scheme and host, a trailing "*" a prefix, any other "*" a regex.
func corsFilter(f *gw.HTTPCORSFilter) *networking.CorsPolicy {
	if f == nil {
		return nil
	}
	out := &networking.CorsPolicy{}
	for _, o := range f.AllowOrigins {
		s := string(o)
		switch {
		case s == "":
		case s == "*":
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: `^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$`}})
		case !strings.Contains(s, "*"):
			out.AllowOrigins = append(out.AllowOrigins, exact(s))
		case strings.Count(s, "*") == 1 && strings.HasSuffix(s, "*"):
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: strings.TrimSuffix(s, "*")}})
		default:
			re := strings.ReplaceAll(regexp.QuoteMeta(s), `\*`, ".*")
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: "^" + re + "$"}})
		}
	}
	if deref(f.AllowCredentials) {
		out.AllowCredentials = wrapperspb.Bool(true)
	}
	for _, m := range f.AllowMethods {
		out.AllowMethods = append(out.AllowMethods, string(m))
	}
	for _, h := range f.AllowHeaders {
		out.AllowHeaders = append(out.AllowHeaders, string(h))
	}
	for _, h := range f.ExposeHeaders {
		out.ExposeHeaders = append(out.ExposeHeaders, string(h))
	}
	if f.MaxAge > 0 {
		out.MaxAge = durationpb.New(time.Duration(f.MaxAge) * time.Second)
	}
	out.UnmatchedPreflights = networking.CorsPolicy_IGNORE
	return out
}

func redirectFilter(f *gw.HTTPRequestRedirectFilter) *networking.HTTPRedirect {
	if f == nil {
		return nil
	}
	out := &networking.HTTPRedirect{}
	if f.StatusCode != nil {
		out.RedirectCode = uint32(*f.StatusCode) //nolint:gosec // the CRD bounds the code
	}
	if f.Hostname != nil {
		out.Authority = string(*f.Hostname)
	}
	if f.Scheme != nil {
		out.Scheme = *f.Scheme
	}
	switch {
	case f.Port != nil:
		out.RedirectPort = &networking.HTTPRedirect_Port{Port: uint32(*f.Port)} //nolint:gosec // a port number
	case f.Scheme != nil:
		out.RedirectPort = &networking.HTTPRedirect_DerivePort{DerivePort: networking.HTTPRedirect_FROM_PROTOCOL_DEFAULT}
	default:
		out.RedirectPort = &networking.HTTPRedirect_DerivePort{DerivePort: networking.HTTPRedirect_FROM_REQUEST_PORT}
	}
	if f.Path != nil {
		switch f.Path.Type {
		case gw.FullPathHTTPPathModifier:
			out.Uri = deref(f.Path.ReplaceFullPath)
		case gw.PrefixMatchHTTPPathModifier:
			out.PrefixRewrite = deref(f.Path.ReplacePrefixMatch)
		}
	}
	return out
}

func validHeaderValue(v string) bool {
	for _, c := range []byte(v) {
		if c != 0x09 && (c < 0x20 || c == 0x7f) {
			return false
		}
	}
	return true
}

func headerFilter(f *gw.HTTPHeaderFilter) (*networking.Headers_HeaderOperations, *configError) {
	if f == nil {
		return nil, nil
	}
	for _, h := range append(append([]gw.HTTPHeader{}, f.Set...), f.Add...) {
		if !validHeaderValue(h.Value) {
			return nil, errorf(reasonInvalidFilter, "header %q value contains invalid characters", h.Name)
		}
	}
	return &networking.Headers_HeaderOperations{Add: headerMap(f.Add), Remove: f.Remove, Set: headerMap(f.Set)}, nil
}

// addHeaders sets a RequestHeaderModifier's (or, response, a
// ResponseHeaderModifier's) operations on headers.
func addHeaders(headers **networking.Headers, f *gw.HTTPHeaderFilter, response bool) *configError {
	h, err := headerFilter(f)
	if err != nil || h == nil {
		return err
	}
	if *headers == nil {
		*headers = &networking.Headers{}
	}
	if response {
		(*headers).Response = h
	} else {
		(*headers).Request = h
	}
	return nil
}

// headerMap lowercases names; the first of a name wins.
func headerMap(hs []gw.HTTPHeader) map[string]string {
	if len(hs) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, h := range hs {
		k := strings.ToLower(string(h.Name))
		if _, ok := out[k]; !ok {
			out[k] = h.Value
		}
	}
	return out
}

func exact(s string) *networking.StringMatch {
	return &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: s}}
}

func regex(s string) *networking.StringMatch {
	return &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: s}}
}

func queryMatches(qs []gw.HTTPQueryParamMatch) (map[string]*networking.StringMatch, *configError) {
	out := map[string]*networking.StringMatch{}
	for _, q := range qs {
		switch t := derefOr(q.Type, gw.QueryParamMatchExact); t {
		case gw.QueryParamMatchExact:
			out[string(q.Name)] = exact(q.Value)
		case gw.QueryParamMatchRegularExpression:
			out[string(q.Name)] = regex(q.Value)
		default:
			return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported QueryParams type", t)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func headerMatches(hs []gw.HTTPHeaderMatch) (map[string]*networking.StringMatch, *configError) {
	out := map[string]*networking.StringMatch{}
	for _, h := range hs {
		switch t := derefOr(h.Type, gw.HeaderMatchExact); t {
		case gw.HeaderMatchExact:
			out[string(h.Name)] = exact(h.Value)
		case gw.HeaderMatchRegularExpression:
			out[string(h.Name)] = regex(h.Value)
		default:
			return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported HeaderMatch type", t)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// uriMatch is Istio's createURIMatch: a PathPrefix loses a trailing "/".
func uriMatch(m gw.HTTPRouteMatch) (*networking.StringMatch, *configError) {
	t, v := gw.PathMatchPathPrefix, "/"
	if m.Path != nil {
		t = derefOr(m.Path.Type, gw.PathMatchPathPrefix)
		v = derefOr(m.Path.Value, "/")
	}
	switch t {
	case gw.PathMatchPathPrefix:
		if v != "/" {
			v = strings.TrimSuffix(v, "/")
		}
		return &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: v}}, nil
	case gw.PathMatchExact:
		return exact(v), nil
	case gw.PathMatchRegularExpression:
		return regex(v), nil
	}
	return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported Path match type", t)
}

// grpcURIMatch is Istio's createGRPCURIMatch.
func grpcURIMatch(m gw.GRPCRouteMatch) (*networking.StringMatch, *configError) {
	mm := m.Method
	if mm == nil {
		return nil, nil
	}
	if mm.Method == nil && mm.Service == nil {
		return nil, errorf(reasonInvalidConfig, "gRPC match must have method or service defined")
	}
	switch t := derefOr(mm.Type, gw.GRPCMethodMatchExact); t {
	case gw.GRPCMethodMatchExact:
		switch {
		case mm.Method == nil:
			return &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/" + *mm.Service + "/"}}, nil
		case mm.Service == nil:
			return regex("/[^/]+/" + *mm.Method), nil
		}
		return exact("/" + *mm.Service + "/" + *mm.Method), nil
	case gw.GRPCMethodMatchRegularExpression:
		switch {
		case mm.Method == nil:
			return regex("/" + *mm.Service + "/.+"), nil
		case mm.Service == nil:
			return regex("/[^/]+/" + *mm.Method), nil
		}
		return regex("/" + *mm.Service + "/" + *mm.Method), nil
	default:
		return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported Path match type", t)
	}
}

func cloneProto[T proto.Message](m T) T { return proto.Clone(m).(T) } //nolint:forcetypeassert // Clone returns the type it is given
