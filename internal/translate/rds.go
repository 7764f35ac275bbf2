package translate

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

const (
	// defaultRetryOn is what Istio retries when a route says nothing.
	defaultRetryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
)

// routeCandidates names every route configuration the proxy has (its
// flavour's routeNames).
func (g *gen) routeCandidates() []string { return g.fl.routeNames(g) }

// route builds, checks and remembers one route configuration; nil when
// the proxy has none of that name or it failed validation (reported).
func (g *gen) route(name string) *routev3.RouteConfiguration {
	if rc, ok := g.routesBy[name]; ok {
		return rc
	}
	var rc *routev3.RouteConfiguration
	if key, ok := g.fl.sharedRouteKey(g, name); ok {
		v := g.pc.Memo(key, func() any {
			sub := g.isolated()
			rc := sub.buildRoute(name)
			if rc != nil {
				g.pc.Share(rc)
			}
			return &shared{value: rc, problems: sub.problems}
		}).(*shared)
		for _, p := range v.problems {
			g.problem("%s", p)
		}
		rc, _ = v.value.(*routev3.RouteConfiguration)
	} else {
		rc = g.buildRoute(name)
	}
	g.routesBy[name] = rc
	return rc
}

// scopeKey is the push-context key of something a sidecar shares with the
// others of its scope: kind and name, the scope, and the proxy's labels
// and addresses when what is built reads them.
func (g *gen) scopeKey(kind, name string, labels, ips bool) string {
	var key strings.Builder
	fmt.Fprintf(&key, "%s|%p|%s", kind, g.scope, name)
	if g.client.allocatedAddresses {
		v4, v6 := g.addressFamilies()
		fmt.Fprintf(&key, "|allocated-addresses|%t|%t", v4, v6)
	}
	if labels {
		key.WriteString("|labels")
		for _, k := range slices.Sorted(maps.Keys(g.p.Labels)) {
			key.WriteString("|" + strconv.Quote(k) + "=" + strconv.Quote(g.p.Labels[k]))
		}
	}
	if ips {
		key.WriteString("|ips")
		for _, ip := range g.p.IPs {
			key.WriteString("|" + ip.String())
		}
	}
	return key.String()
}

// readsAddresses reports whether a service of the proxy's scope is
// listened for or routed per endpoint address, the proxy's own left out
// (perEndpoint): a passthrough service without a VIP that lists
// endpoints. Listeners are per endpoint for headless services too
// (headless true); their routes do not read the proxy's addresses.
func (g *gen) readsAddresses(headlessToo bool) bool {
	return g.pc.Memo(fmt.Sprintf("reads-addresses|%p|%t", g.scope, headlessToo), func() any {
		return slices.ContainsFunc(g.scope.Services(), func(svc *registryv1.Service) bool {
			return svc.GetResolution() == registryv1.Resolution_RESOLUTION_NONE && len(ipAddresses(svc.GetAddresses())) == 0 &&
				(headlessToo || !headless(svc)) && len(g.pc.Endpoints(svc)) > 0
		})
	}).(bool)
}

// buildRoute builds and checks one route configuration.
func (g *gen) buildRoute(name string) *routev3.RouteConfiguration {
	before := g.packErrs
	rc := g.fl.buildRoute(g, name)
	if rc != nil {
		g.repairRoutes(rc, before)
		// The virtual hosts were validated one by one; validate the rest.
		vhs := rc.VirtualHosts
		rc.VirtualHosts = nil
		err := g.valid(rc, before)
		rc.VirtualHosts = vhs
		if err != nil {
			g.problem("route configuration %s dropped: %v", name, err)
			rc = nil
		}
	}
	return rc
}

func (g *gen) routeOK(name string) bool { return g.route(name) != nil }

// virtualHost is "<host>:<port>", reached by every name of the service,
// with and without the port.
//
// A sidecar's route configurations ignore the Host's port
// (IgnorePortInHostMatching, as Istio's buildSidecarOutboundHTTPRouteConfig),
// so the domains carry none (Istio's SidecarIgnorePort): "reviews:9080"
// and "reviews" match alike.
func (g *gen) virtualHost(svc *registryv1.Service, port *registryv1.ServicePort) *routev3.VirtualHost {
	var domains []string
	names := g.serviceNames(svc)
	if headless(svc) {
		// As Istio's generateVirtualHostDomains: each name also with "*."
		// in front, so a pod's own name ("web-0.web.default.svc…", a
		// StatefulSet's) follows the service's routes to that pod.
		for _, n := range slices.Clone(names) {
			names = append(names, "*."+n)
		}
	}
	for _, n := range append(names, g.serviceAddresses(svc)...) {
		if strings.Contains(n, ":") && !strings.Contains(n, ".") { // IPv6 VIP
			n = "[" + n + "]"
		}
		domains = append(domains, n)
	}
	return &routev3.VirtualHost{
		Name:    ListenerName(svc.GetHostname(), port.GetNumber()),
		Domains: domains,
		Routes:  g.httpRoutes(svc, port),
		// Envoy's x-envoy-attempt-count, as Istio's virtual hosts.
		IncludeRequestAttemptCount: g.client.envoyHTTP && g.proxyHeaders(outboundClass).attemptCount,
	}
}

// fallbackVirtualHost catches hosts the mesh does not know: passed
// through (ALLOW_ANY, to the egress proxy when the Sidecar names one) or
// refused with 502 (REGISTRY_ONLY).
func (g *gen) fallbackVirtualHost() *routev3.VirtualHost {
	attempts := g.client.envoyHTTP && g.proxyHeaders(outboundClass).attemptCount
	if target := g.unknownTarget(); target != BlackHoleCluster {
		return &routev3.VirtualHost{Name: "allow_any", Domains: []string{"*"}, IncludeRequestAttemptCount: attempts, Routes: []*routev3.Route{{
			Name:   "allow_any",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: target}, Timeout: dur(0)}},
		}}}
	}
	return &routev3.VirtualHost{Name: "block_all", Domains: []string{"*"}, IncludeRequestAttemptCount: attempts, Routes: []*routev3.Route{{
		Name:   "block_all",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 502}},
	}}}
}

// HTTPRoutes are the Envoy routes of one service port (host, port) as
// this proxy sees it; Istio's BuildHTTPRoutesForVirtualService is the
// model. When a VirtualService with HTTP routes applies to the host for
// this proxy (Scope.VirtualService: exact host before wildcard, the
// proxy's namespace first), each of its http entries becomes one route per
// match that can apply here — matches for another port, other
// sourceLabels or sourceNamespace, or gateways without "mesh" are left
// out, and an entry all of whose matches are left out is skipped — in the
// VirtualService's order, and nothing follows a catch-all. A route keeps
// the entry's name, else is named "<namespace>/<name>#<index>"; its
// destinations, weights, retries, timeout, faults, mirrors, header
// operations, redirect, rewrite or direct response follow the entry.
// Without such a VirtualService one route, "default", sends everything to
// the service's cluster with Istio's default retries. It is nil when the
// proxy sees no such service port.
func (x *Generator) HTTPRoutes(host string, port uint32) []*routev3.Route {
	svc := x.g.scope.Service(host)
	sp := servicePort(svc, port)
	if svc == nil || sp == nil {
		return nil
	}
	return x.g.httpRoutes(svc, sp)
}

// httpRoutes are HTTPRoutes for a service port the proxy sees.
func (g *gen) httpRoutes(svc *registryv1.Service, port *registryv1.ServicePort) []*routev3.Route {
	vs := g.scope.VirtualService(svc.GetHostname())
	for _, p := range vs.GetProblems() {
		g.problem("VirtualService %s/%s: %s", vs.Namespace, vs.Name, p)
	}
	if vs == nil || len(vs.Spec.GetHttp()) == 0 {
		name := ClusterName(outbound, port.GetNumber(), "", svc.GetHostname())
		ra := &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}, Timeout: dur(0)}
		g.hashPolicy(ra, svc, name)
		ra.RetryPolicy = g.retryPolicy(nil, len(ra.HashPolicy) > 0)
		return []*routev3.Route{{
			Name:   "default",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: ra},
		}}
	}
	return g.vsRoutes(vs, svc, port, model.MeshGateway)
}

// vsRoutes are a VirtualService's http entries as routes for a port,
// for the sidecars (gateway "mesh") or a Gateway ("namespace/name").
func (g *gen) vsRoutes(vs *model.VirtualService, svc *registryv1.Service, port *registryv1.ServicePort, gateway string) []*routev3.Route {
	var out []*routev3.Route
	meta := configMetadata("virtual-service", vs.Namespace, vs.Name)
	for i, hr := range vs.Spec.GetHttp() {
		matches := g.applicableMatches(hr, port.GetNumber(), gateway)
		if len(hr.GetMatch()) > 0 && len(matches) == 0 {
			continue
		}
		if len(matches) == 0 {
			matches = []*networking.HTTPMatchRequest{nil}
		}
		name := hr.GetName()
		if name == "" {
			name = vs.Namespace + "/" + vs.Name + "#" + strconv.Itoa(i)
		}
		catchAll := false
		for _, m := range matches {
			r := &routev3.Route{Name: name, Match: g.routeMatch(m, vs.GatewaySemantics), Metadata: meta}
			g.routeBody(r, hr, vs, svc, port)
			out = append(out, r)
			if isCatchAll(m) {
				catchAll = true
				break
			}
		}
		if catchAll {
			break // later routes could never match
		}
	}
	return out
}

// applicableMatches drops the match conditions that cannot apply to this
// proxy and port: another port, other source labels or namespace, or
// other gateways than the one routed for.
func (g *gen) applicableMatches(hr *networking.HTTPRoute, port uint32, gateway string) []*networking.HTTPMatchRequest {
	var out []*networking.HTTPMatchRequest
	for _, m := range hr.GetMatch() {
		if m.GetPort() != 0 && m.GetPort() != port {
			continue
		}
		if !model.LabelsMatch(m.GetSourceLabels(), g.p.Labels) {
			continue
		}
		if ns := m.GetSourceNamespace(); ns != "" && ns != g.p.Namespace {
			continue
		}
		if gws := m.GetGateways(); len(gws) > 0 && !slices.Contains(gws, gateway) {
			continue
		}
		out = append(out, m)
	}
	return out
}

func isCatchAll(m *networking.HTTPMatchRequest) bool {
	if m == nil {
		return true
	}
	uri := m.GetUri()
	prefixAll := uri == nil || (uri.GetPrefix() == "/" && !m.GetIgnoreUriCase())
	return prefixAll && len(m.GetHeaders()) == 0 && len(m.GetWithoutHeaders()) == 0 && len(m.GetQueryParams()) == 0 &&
		m.GetMethod() == nil && m.GetAuthority() == nil && m.GetScheme() == nil
}

// routeMatch converts a match; with the Gateway API's semantics a path
// prefix matches whole segments ("/a" matches "/a/b", not "/ab"), as
// Istio's translateRouteMatch does for them.
func (g *gen) routeMatch(m *networking.HTTPMatchRequest, gatewaySemantics bool) *routev3.RouteMatch {
	rm := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	if m == nil {
		return rm
	}
	switch u := m.GetUri().GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		rm.PathSpecifier = &routev3.RouteMatch_Path{Path: u.Exact}
	case *networking.StringMatch_Prefix:
		rm.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: u.Prefix}
		if gatewaySemantics && u.Prefix != "/" {
			rm.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: strings.TrimSuffix(u.Prefix, "/")}
		}
	case *networking.StringMatch_Regex:
		rm.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: u.Regex}}
	}
	if m.GetIgnoreUriCase() {
		rm.CaseSensitive = wrapperspb.Bool(false)
	}
	// A JWT claim named as a header (@request.auth.claims…, gateways
	// only) matches the verified token's payload, which the JWT filter
	// leaves in metadata and clears the route cache for (Istio's
	// translateMetadataMatch).
	for _, set := range []struct {
		m      map[string]*networking.StringMatch
		invert bool
	}{{m.GetHeaders(), false}, {m.GetWithoutHeaders(), true}} {
		for _, name := range sortedKeys(set.m) {
			if claims, ok := authz.RoutingClaim(name); ok {
				v := &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_PresentMatch{PresentMatch: true}}
				if sm := stringMatcher(set.m[name]); sm != nil {
					v = &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: sm}}
				}
				cm := authz.ClaimMatcher(claims, v)
				cm.Invert = set.invert
				rm.DynamicMetadata = append(rm.DynamicMetadata, cm)
				continue
			}
			rm.Headers = append(rm.Headers, headerMatcher(name, set.m[name], set.invert))
		}
	}
	for _, pseudo := range []struct {
		name string
		sm   *networking.StringMatch
	}{{":method", m.GetMethod()}, {":authority", m.GetAuthority()}, {":scheme", m.GetScheme()}} {
		if pseudo.sm != nil {
			rm.Headers = append(rm.Headers, headerMatcher(pseudo.name, pseudo.sm, false))
		}
	}
	for _, name := range sortedKeys(m.GetQueryParams()) {
		qm := &routev3.QueryParameterMatcher{Name: name}
		if sm := stringMatcher(m.GetQueryParams()[name]); sm != nil {
			qm.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_StringMatch{StringMatch: sm}
		} else {
			qm.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}
		}
		rm.QueryParameters = append(rm.QueryParameters, qm)
	}
	return rm
}

func stringMatcher(sm *networking.StringMatch) *matcherv3.StringMatcher {
	switch v := sm.GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v.Exact}}
	case *networking.StringMatch_Prefix:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: v.Prefix}}
	case *networking.StringMatch_Regex:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: v.Regex}}}
	}
	return nil
}

// headerMatcher matches a header's value, or its presence when no value is
// given.
func headerMatcher(name string, sm *networking.StringMatch, invert bool) *routev3.HeaderMatcher {
	hm := &routev3.HeaderMatcher{Name: strings.ToLower(name), InvertMatch: invert}
	if m := stringMatcher(sm); m != nil {
		hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: m}
		// withoutHeaders: a request without the header does not have
		// the value either, so it matches (Istio's translateRouteMatch;
		// Envoy otherwise fails a value match on a missing header,
		// inverted or not).
		hm.TreatMissingHeaderAsEmpty = invert
	} else {
		hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
	}
	return hm
}

// corsPolicy is Istio's TranslateCORSPolicy: allowed origins (allowOrigins
// matches, else the deprecated exact allowOrigin), methods, headers and
// exposed headers comma-joined, max age in seconds, credentials, the
// filter on for every request, and preflights no origin matches forwarded
// unless unmatchedPreflights is IGNORE.
func corsPolicy(in *networking.CorsPolicy) *corsv3.CorsPolicy {
	out := &corsv3.CorsPolicy{
		AllowCredentials: in.GetAllowCredentials(),
		AllowHeaders:     strings.Join(in.GetAllowHeaders(), ","),
		AllowMethods:     strings.Join(in.GetAllowMethods(), ","),
		ExposeHeaders:    strings.Join(in.GetExposeHeaders(), ","),
		FilterEnabled: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{
			Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED,
		}},
		ForwardNotMatchingPreflights: wrapperspb.Bool(in.GetUnmatchedPreflights() != networking.CorsPolicy_IGNORE),
	}
	if in.GetMaxAge() != nil {
		out.MaxAge = strconv.FormatInt(in.GetMaxAge().GetSeconds(), 10)
	}
	if len(in.GetAllowOrigins()) > 0 {
		for _, o := range in.GetAllowOrigins() {
			if m := stringMatcher(o); m != nil {
				out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, m)
			}
		}
	} else {
		for _, o := range in.GetAllowOrigin() { //nolint:staticcheck // deprecated, still accepted from users
			out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: o}})
		}
	}
	return out
}

// routeBody fills what a route does: redirect, direct response, or
// forward (with weights, rewrites, timeout, retries, mirror, fault and
// header changes).
func (g *gen) routeBody(r *routev3.Route, hr *networking.HTTPRoute, vs *model.VirtualService, svc *registryv1.Service, port *registryv1.ServicePort) {
	g.headerOps(hr.GetHeaders(), &r.RequestHeadersToAdd, &r.RequestHeadersToRemove, &r.ResponseHeadersToAdd, &r.ResponseHeadersToRemove)
	if f := fault(hr.GetFault()); f != nil {
		r.TypedPerFilterConfig = map[string]*anypb.Any{faultFilter: g.pack(f)}
	}
	if c := hr.GetCorsPolicy(); c != nil {
		if !g.client.envoyHTTP {
			g.problem("route %s of VirtualService %s/%s: corsPolicy is not available to proxyless gRPC clients; ignored", r.GetName(), vs.Namespace, vs.Name)
		} else {
			if r.TypedPerFilterConfig == nil {
				r.TypedPerFilterConfig = map[string]*anypb.Any{}
			}
			r.TypedPerFilterConfig[corsFilter] = g.pack(corsPolicy(c))
		}
	}
	switch {
	case hr.GetRedirect() != nil:
		r.Action = &routev3.Route_Redirect{Redirect: redirect(hr.GetRedirect())}
		return
	case hr.GetDirectResponse() != nil:
		dr := &routev3.DirectResponseAction{Status: hr.GetDirectResponse().GetStatus()}
		if b := hr.GetDirectResponse().GetBody(); b != nil {
			if s := b.GetString_(); s != "" {
				dr.Body = inlineString(s)
			} else if bs := b.GetBytes(); len(bs) > 0 {
				dr.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: bs}}
			}
		}
		r.Action = &routev3.Route_DirectResponse{DirectResponse: dr}
		return
	}
	ra := &routev3.RouteAction{Timeout: dur(0)}
	if vs.GatewaySemantics {
		// A backend that is not there answers 500, as the Gateway API
		// requires (Istio's translateRoute).
		ra.ClusterNotFoundResponseCode = routev3.RouteAction_INTERNAL_SERVER_ERROR
	}
	if t := hr.GetTimeout(); t != nil {
		ra.Timeout = t
	}
	var wcs []*routev3.WeightedCluster_ClusterWeight
	var firstSvc *registryv1.Service
	var firstCluster string
	for _, d := range hr.GetRoute() {
		if len(hr.GetRoute()) > 1 && d.GetWeight() == 0 {
			continue // weight 0 of several: no traffic
		}
		name, dsvc, ok := g.destination(d.GetDestination(), vs, port)
		if !ok {
			if !vs.GatewaySemantics {
				continue
			}
			// The Gateway API: a backend that is not there keeps its
			// share of the traffic, answered 500 (Istio names the
			// cluster anyway and sets ClusterNotFoundResponseCode).
			dst := d.GetDestination()
			name = ClusterName(outbound, dst.GetPort().GetNumber(), dst.GetSubset(), model.ResolveHost(dst.GetHost(), vs.Namespace, g.pc.DomainSuffix))
		} else if firstSvc == nil {
			firstSvc, firstCluster = dsvc, name
		}
		cw := &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(uint32(max(d.GetWeight(), 0)))}
		g.headerOps(d.GetHeaders(), &cw.RequestHeadersToAdd, &cw.RequestHeadersToRemove, &cw.ResponseHeadersToAdd, &cw.ResponseHeadersToRemove)
		wcs = append(wcs, cw)
	}
	if len(wcs) == 0 {
		g.problem("route %s of VirtualService %s/%s: no destination is a known cluster; answering 503", r.GetName(), vs.Namespace, vs.Name)
		r.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 503}}
		return
	}
	if len(wcs) == 1 {
		ra.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: wcs[0].GetName()}
		r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, wcs[0].GetRequestHeadersToAdd()...)
		r.RequestHeadersToRemove = append(r.RequestHeadersToRemove, wcs[0].GetRequestHeadersToRemove()...)
		r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, wcs[0].GetResponseHeadersToAdd()...)
		r.ResponseHeadersToRemove = append(r.ResponseHeadersToRemove, wcs[0].GetResponseHeadersToRemove()...)
	} else {
		for _, w := range wcs {
			if w.GetWeight().GetValue() == 0 {
				w.Weight = wrapperspb.UInt32(1)
			}
		}
		ra.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wcs}}
	}
	if rw := hr.GetRewrite(); rw != nil {
		switch sep := r.GetMatch().GetPathSeparatedPrefix(); {
		case vs.GatewaySemantics && rw.GetUri() == "/" && sep != "":
			// Replacing a prefix by "/" removes it and the "/" after
			// it (Istio's translateRoute for the Gateway API).
			ra.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{
				Pattern: &matcherv3.RegexMatcher{Regex: "^" + regexp.QuoteMeta(sep) + `(/?)(.*)`}, Substitution: `/\2`,
			}
		case rw.GetUri() != "":
			ra.PrefixRewrite = rw.GetUri()
		}
		if rw.GetAuthority() != "" {
			ra.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: rw.GetAuthority()}
		}
		if rr := rw.GetUriRegexRewrite(); rr != nil {
			ra.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: rr.GetMatch()}, Substitution: rr.GetRewrite()}
		}
	}
	g.mirrors(ra, hr, vs, port)
	if firstSvc != nil {
		g.hashPolicy(ra, firstSvc, firstCluster)
	}
	ra.RetryPolicy = g.retryPolicy(hr.GetRetries(), len(ra.HashPolicy) > 0)
	r.Action = &routev3.Route_Route{Route: ra}
}

// destination resolves a route destination to a cluster this proxy has.
// The port defaults to the service's only port, else the port being
// routed.
func (g *gen) destination(d *networking.Destination, vs *model.VirtualService, port *registryv1.ServicePort) (string, *registryv1.Service, bool) {
	host := model.ResolveHost(d.GetHost(), vs.Namespace, g.pc.DomainSuffix)
	svc := g.scope.Service(host)
	if svc == nil {
		g.problem("VirtualService %s/%s: destination host %q is not a service this proxy sees", vs.Namespace, vs.Name, host)
		return "", nil, false
	}
	num := d.GetPort().GetNumber()
	if num == 0 {
		switch {
		case len(svc.GetPorts()) == 1:
			num = svc.GetPorts()[0].GetNumber()
		case servicePort(svc, port.GetNumber()) != nil:
			num = port.GetNumber()
		default:
			g.problem("VirtualService %s/%s: destination %s has several ports and names none", vs.Namespace, vs.Name, host)
			return "", nil, false
		}
	}
	name := ClusterName(outbound, num, d.GetSubset(), host)
	if !g.clusterOK(name) {
		if d.GetSubset() != "" {
			g.problem("VirtualService %s/%s: subset %q of %s is not defined by a DestinationRule this proxy sees", vs.Namespace, vs.Name, d.GetSubset(), host)
		} else {
			g.problem("VirtualService %s/%s: %s has no port %d", vs.Namespace, vs.Name, host, num)
		}
		return "", nil, false
	}
	return name, svc, true
}

func (g *gen) headerOps(h *networking.Headers, reqAdd *[]*corev3.HeaderValueOption, reqRemove *[]string, respAdd *[]*corev3.HeaderValueOption, respRemove *[]string) {
	if h == nil {
		return
	}
	ops := func(o *networking.Headers_HeaderOperations, add *[]*corev3.HeaderValueOption, remove *[]string) {
		for _, k := range sortedKeys(o.GetSet()) {
			*add = append(*add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: o.GetSet()[k]}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
		}
		for _, k := range sortedKeys(o.GetAdd()) {
			*add = append(*add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: o.GetAdd()[k]}, AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
		}
		*remove = append(*remove, o.GetRemove()...)
	}
	ops(h.GetRequest(), reqAdd, reqRemove)
	ops(h.GetResponse(), respAdd, respRemove)
}

// defaultRetryPolicy is Istio's default (retry.DefaultPolicy): two
// retries on connection failures, refused streams and gRPC unavailable or
// cancelled — no HTTP status is retried, "retriable-status-codes" naming
// none — on another host, unless the route hashes to a host (then the
// same one: retry.DefaultConsistentHashPolicy).
func (g *gen) defaultRetryPolicy(hashed bool) *routev3.RetryPolicy {
	rp := &routev3.RetryPolicy{
		RetryOn:                       defaultRetryOn,
		NumRetries:                    wrapperspb.UInt32(2),
		HostSelectionRetryMaxAttempts: 5,
	}
	if !hashed {
		rp.RetryHostPredicate = []*routev3.RetryPolicy_RetryHostPredicate{g.previousHosts()}
	}
	return rp
}

// sharedDefaultRetryPolicy is defaultRetryPolicy made once per generator
// and shared by the routes that keep the default (a gateway's thousand
// routes, a sidecar's every route without retries of its own); it is
// never changed once made.
func (g *gen) sharedDefaultRetryPolicy(hashed bool) *routev3.RetryPolicy {
	i := 0
	if hashed {
		i = 1
	}
	if g.defaultRetries[i] == nil {
		g.defaultRetries[i] = g.defaultRetryPolicy(hashed)
	}
	return g.defaultRetries[i]
}

func (g *gen) previousHosts() *routev3.RetryPolicy_RetryHostPredicate {
	return &routev3.RetryPolicy_RetryHostPredicate{
		Name:       "envoy.retry_host_predicates.previous_hosts",
		ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: g.pack(&previoushostsv3.PreviousHostsPredicate{})},
	}
}

// retryPolicy maps HTTPRetry as Istio's retry.ConvertPolicy does: nil
// keeps the default, attempts 0 turns retries off; retryOn replaces the
// default conditions (numbers in it are retriable status codes, and
// "retriable-status-codes" is added for them); retryIgnorePreviousHosts,
// retryRemoteLocalities and backoff are honoured. hashed says the route
// hashes to a host. gRPC clients get only the conditions they understand.
func (g *gen) retryPolicy(r *networking.HTTPRetry, hashed bool) *routev3.RetryPolicy {
	if r == nil {
		if g.client.retries != nil {
			return g.grpcDefaultRetryPolicy()
		}
		return g.sharedDefaultRetryPolicy(hashed)
	}
	attempts := r.GetAttempts()
	if attempts <= 0 {
		return nil
	}
	rp := g.defaultRetryPolicy(hashed)
	rp.NumRetries = wrapperspb.UInt32(uint32(attempts))
	rp.PerTryTimeout = r.GetPerTryTimeout()
	on := strings.Split(defaultRetryOn, ",")
	if retryOn := r.GetRetryOn(); retryOn != "" {
		on = nil
		for _, c := range strings.Split(retryOn, ",") {
			c = strings.TrimSpace(c)
			if code, err := strconv.ParseUint(c, 10, 32); err == nil {
				rp.RetriableStatusCodes = append(rp.RetriableStatusCodes, uint32(code))
				c = "retriable-status-codes"
			}
			if c != "" && !slices.Contains(on, c) {
				on = append(on, c)
			}
		}
	}
	slices.Sort(rp.RetriableStatusCodes)
	rp.RetriableStatusCodes = slices.Compact(rp.RetriableStatusCodes)
	if ignore := r.GetRetryIgnorePreviousHosts(); ignore != nil {
		rp.RetryHostPredicate = nil
		if ignore.GetValue() {
			rp.RetryHostPredicate = []*routev3.RetryPolicy_RetryHostPredicate{g.previousHosts()}
		}
	}
	if r.GetRetryRemoteLocalities().GetValue() {
		rp.RetryPriority = &routev3.RetryPolicy_RetryPriority{
			Name:       "envoy.retry_priorities.previous_priorities",
			ConfigType: &routev3.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: g.pack(&previousprioritiesv3.PreviousPrioritiesConfig{UpdateFrequency: 2})},
		}
	}
	if b := r.GetBackoff(); b != nil {
		rp.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: b}
	}
	if retries := g.client.retries; retries != nil {
		on = slices.DeleteFunc(on, func(c string) bool { return !retries(c) })
		if len(on) == 0 {
			return nil
		}
		return &routev3.RetryPolicy{RetryOn: strings.Join(on, ","), NumRetries: rp.NumRetries, RetryBackOff: rp.RetryBackOff}
	}
	rp.RetryOn = strings.Join(on, ",")
	return rp
}

func redirect(r *networking.HTTPRedirect) *routev3.RedirectAction {
	ra := &routev3.RedirectAction{ResponseCode: routev3.RedirectAction_MOVED_PERMANENTLY}
	if r.GetUri() != "" {
		ra.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: r.GetUri()}
	}
	if r.GetAuthority() != "" {
		ra.HostRedirect = r.GetAuthority()
	}
	if p := r.GetPort(); p != 0 {
		ra.PortRedirect = p
	}
	if s := r.GetScheme(); s != "" {
		ra.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: s}
	}
	switch r.GetRedirectCode() {
	case 302:
		ra.ResponseCode = routev3.RedirectAction_FOUND
	case 303:
		ra.ResponseCode = routev3.RedirectAction_SEE_OTHER
	case 307:
		ra.ResponseCode = routev3.RedirectAction_TEMPORARY_REDIRECT
	case 308:
		ra.ResponseCode = routev3.RedirectAction_PERMANENT_REDIRECT
	}
	return ra
}

// percent converts a percentage (0–100, fractions allowed) to parts per
// million; nil means 100 %.
func percent(p *networking.Percent, legacy int32) *typev3.FractionalPercent {
	v := 100.0
	switch {
	case p != nil:
		v = p.GetValue()
	case legacy > 0:
		v = float64(legacy)
	}
	v = min(max(v, 0), 100)
	return &typev3.FractionalPercent{Numerator: uint32(v * 10000), Denominator: typev3.FractionalPercent_MILLION}
}

func fault(f *networking.HTTPFaultInjection) *faultv3.HTTPFault {
	if f == nil || (f.GetDelay() == nil && f.GetAbort() == nil) {
		return nil
	}
	out := &faultv3.HTTPFault{}
	if d := f.GetDelay(); d != nil && d.GetFixedDelay() != nil {
		out.Delay = &faultcommonv3.FaultDelay{
			FaultDelaySecifier: &faultcommonv3.FaultDelay_FixedDelay{FixedDelay: d.GetFixedDelay()},
			Percentage:         percent(d.GetPercentage(), d.GetPercent()), //nolint:staticcheck // percent is still accepted
		}
	}
	if a := f.GetAbort(); a != nil {
		fa := &faultv3.FaultAbort{Percentage: percent(a.GetPercentage(), 0)}
		switch e := a.GetErrorType().(type) {
		case *networking.HTTPFaultInjection_Abort_HttpStatus:
			if code := e.HttpStatus; code >= 200 && code < 600 {
				fa.ErrorType = &faultv3.FaultAbort_HttpStatus{HttpStatus: uint32(code)}
			}
		case *networking.HTTPFaultInjection_Abort_GrpcStatus:
			fa.ErrorType = &faultv3.FaultAbort_GrpcStatus{GrpcStatus: grpcStatusCode(e.GrpcStatus)}
		}
		if fa.ErrorType != nil {
			out.Abort = fa
		}
	}
	if out.Delay == nil && out.Abort == nil {
		return nil
	}
	return out
}

// grpcStatusCode maps a gRPC status name ("UNAVAILABLE") to its number.
func grpcStatusCode(name string) uint32 {
	codes := map[string]uint32{
		"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
		"ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
		"OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
	}
	if c, ok := codes[strings.ToUpper(name)]; ok {
		return c
	}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil && n <= 16 {
		return uint32(n)
	}
	return codes["UNKNOWN"]
}

// mirrors copies a share of the traffic to other destinations.
func (g *gen) mirrors(ra *routev3.RouteAction, hr *networking.HTTPRoute, vs *model.VirtualService, port *registryv1.ServicePort) {
	type m struct {
		d   *networking.Destination
		pct *typev3.FractionalPercent
	}
	var ms []m
	if hr.GetMirror() != nil {
		ms = append(ms, m{hr.GetMirror(), percent(hr.GetMirrorPercentage(), 0)})
	}
	for _, mp := range hr.GetMirrors() {
		ms = append(ms, m{mp.GetDestination(), percent(mp.GetPercentage(), 0)})
	}
	for _, x := range ms {
		name, _, ok := g.destination(x.d, vs, port)
		if !ok {
			continue
		}
		ra.RequestMirrorPolicies = append(ra.RequestMirrorPolicies, &routev3.RouteAction_RequestMirrorPolicy{
			Cluster:         name,
			RuntimeFraction: &corev3.RuntimeFractionalPercent{DefaultValue: x.pct},
			// The mirror gets the Host the request had: Envoy would append
			// "-shadow", which Istio turns off (DISABLE_SHADOW_HOST_SUFFIX,
			// on by default).
			DisableShadowHostSuffixAppend: true,
		})
	}
}

// hashPolicy adds the consistent-hash key the destination cluster's
// policy names (port-level and subset settings included, as the cluster's
// own load balancer reads them) to the route.
func (g *gen) hashPolicy(ra *routev3.RouteAction, svc *registryv1.Service, cluster string) {
	port, subset, _, ok := ParseClusterName(cluster)
	if !ok {
		return
	}
	dr := g.scope.DestinationRule(g.p, svc)
	ch := EffectivePolicy(drSpec(dr), subset, port).LoadBalancer.GetConsistentHash()
	if ch == nil {
		return
	}
	var hp *routev3.RouteAction_HashPolicy
	switch k := ch.GetHashKey().(type) {
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: k.HttpHeaderName}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		c := &routev3.RouteAction_HashPolicy_Cookie{Name: k.HttpCookie.GetName(), Path: k.HttpCookie.GetPath(), Ttl: k.HttpCookie.GetTtl()}
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Cookie_{Cookie: c}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_ConnectionProperties_{ConnectionProperties: &routev3.RouteAction_HashPolicy_ConnectionProperties{SourceIp: k.UseSourceIp}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_QueryParameter_{QueryParameter: &routev3.RouteAction_HashPolicy_QueryParameter{Name: k.HttpQueryParameterName}}}
	}
	if hp != nil {
		ra.HashPolicy = append(ra.HashPolicy, hp)
	}
}

// grpcDefaultRetryPolicy is defaultRetryPolicy with only the conditions
// gRPC clients understand, made once per generator and never changed.
// Istio gives proxyless clients the default policy too (translateRoute:
// retry.ConvertPolicy of the mesh default); grpc-go reads its unavailable
// and cancelled and retries them twice. It also covers grpc-go's own
// window when a route gains a cluster: the config selector may pick it
// before the cluster manager has it ("unknown cluster selected for RPC",
// UNAVAILABLE), and the retry finds it.
func (g *gen) grpcDefaultRetryPolicy() *routev3.RetryPolicy {
	if g.grpcDefaultRetries == nil {
		on := slices.DeleteFunc(strings.Split(defaultRetryOn, ","), func(c string) bool { return !g.client.retries(c) })
		g.grpcDefaultRetries = &routev3.RetryPolicy{RetryOn: strings.Join(on, ","), NumRetries: wrapperspb.UInt32(2)}
	}
	return g.grpcDefaultRetries
}
