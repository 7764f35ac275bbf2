package validation

import (
	"slices"
	"strconv"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

func (v *validator) virtualService() {
	vs := v.obj.Spec.(*networking.VirtualService)
	appliesToMesh := len(vs.GetGateways()) == 0 || slices.Contains(vs.GetGateways(), "mesh")
	delegate := len(vs.GetHosts()) == 0 && len(vs.GetGateways()) == 0

	if len(vs.GetHosts()) == 0 && !delegate {
		v.r.errorf("spec.hosts", "at least one host is required (only a delegate VirtualService, with no hosts and no gateways, may omit them)")
	}
	seen := map[string]bool{}
	for i, h := range vs.GetHosts() {
		p := at("spec.hosts", i)
		if h == "*" && appliesToMesh {
			v.r.errorf(p, "wildcard host * is not allowed for routes applied to sidecars (the mesh gateway); bind it to a gateway")
		} else {
			v.host(p, h, true)
		}
		if seen[strings.ToLower(h)] {
			v.r.errorf(p, "host %q is listed twice", h)
		}
		seen[strings.ToLower(h)] = true
	}
	for i, g := range vs.GetGateways() {
		v.gatewayRef(at("spec.gateways", i), g)
	}
	if len(vs.GetHttp()) == 0 && len(vs.GetTcp()) == 0 && len(vs.GetTls()) == 0 {
		v.r.errorf("spec", "at least one of http, tcp or tls routes is required")
	}
	v.exportTo("spec.exportTo", vs.GetExportTo())
	for i, route := range vs.GetHttp() {
		v.httpRoute(at("spec.http", i), route, delegate)
	}
	for i, route := range vs.GetTcp() {
		p := at("spec.tcp", i)
		for j, m := range route.GetMatch() {
			v.l4Match(at(field(p, "match"), j), m.GetPort(), m.GetDestinationSubnets(), m.GetSourceLabels(), m.GetGateways())
			if m.GetSourceSubnet() != "" {
				v.addressOrCIDR(field(at(field(p, "match"), j), "sourceSubnet"), m.GetSourceSubnet())
			}
		}
		v.routeDestinations(field(p, "route"), route.GetRoute())
	}
	for i, route := range vs.GetTls() {
		p := at("spec.tls", i)
		if len(route.GetMatch()) == 0 {
			v.r.errorf(field(p, "match"), "a TLS route needs at least one match with sniHosts")
		}
		for j, m := range route.GetMatch() {
			mp := at(field(p, "match"), j)
			if len(m.GetSniHosts()) == 0 {
				v.r.errorf(field(mp, "sniHosts"), "at least one SNI host is required")
			}
			for k, sni := range m.GetSniHosts() {
				sp := at(field(mp, "sniHosts"), k)
				v.host(sp, sni, true)
				if !sniCovered(sni, vs.GetHosts()) {
					v.r.errorf(sp, "SNI host %q is not covered by any host of the VirtualService %s", sni, quoted(vs.GetHosts()))
				}
			}
			v.l4Match(mp, m.GetPort(), m.GetDestinationSubnets(), m.GetSourceLabels(), m.GetGateways())
		}
		v.routeDestinations(field(p, "route"), route.GetRoute())
	}
	v.unreachableRules(vs)
}

// sniCovered reports whether sni equals or falls under one of hosts.
func sniCovered(sni string, hosts []string) bool {
	for _, h := range hosts {
		switch {
		case h == "*" || strings.EqualFold(h, sni):
			return true
		case strings.HasPrefix(h, "*."):
			suffix := h[1:]
			if strings.HasSuffix(strings.ToLower(sni), strings.ToLower(suffix)) {
				return true
			}
		}
	}
	return false
}

// gatewayRef checks "mesh", "name" or "namespace/name".
func (v *validator) gatewayRef(path, g string) {
	if g == "mesh" {
		return
	}
	ns, name, ok := strings.Cut(g, "/")
	if !ok {
		name, ns = ns, ""
	}
	if ns != "" && dns1123Label(ns) != "" {
		v.r.errorf(path, "gateway %q: namespace %q is not a valid namespace name", g, ns)
	}
	if dns1123Subdomain(name) != "" {
		v.r.errorf(path, "gateway %q: %q is not a valid gateway name", g, name)
	}
}

func (v *validator) l4Match(path string, port uint32, subnets []string, sourceLabels map[string]string, gateways []string) {
	if port != 0 {
		v.port(field(path, "port"), port)
	}
	for i, s := range subnets {
		v.addressOrCIDR(at(field(path, "destinationSubnets"), i), s)
	}
	v.labels(field(path, "sourceLabels"), sourceLabels)
	for i, g := range gateways {
		v.gatewayRef(at(field(path, "gateways"), i), g)
	}
}

func (v *validator) httpRoute(path string, h *networking.HTTPRoute, inDelegate bool) {
	actions := 0
	for _, set := range []bool{len(h.GetRoute()) > 0, h.GetRedirect() != nil, h.GetDirectResponse() != nil, h.GetDelegate() != nil} {
		if set {
			actions++
		}
	}
	switch {
	case actions == 0:
		v.r.errorf(path, "one of route, redirect, directResponse or delegate is required")
	case actions > 1:
		v.r.errorf(path, "only one of route, redirect, directResponse or delegate may be set")
	}
	if d := h.GetDelegate(); d != nil {
		if inDelegate {
			v.r.errorf(field(path, "delegate"), "a delegate VirtualService cannot delegate further")
		}
		if dns1123Subdomain(d.GetName()) != "" {
			v.r.errorf(field(path, "delegate.name"), "%q is not a valid VirtualService name", d.GetName())
		}
		if d.GetNamespace() != "" && dns1123Label(d.GetNamespace()) != "" {
			v.r.errorf(field(path, "delegate.namespace"), "%q is not a valid namespace name", d.GetNamespace())
		}
	}
	if h.GetRewrite() != nil && h.GetRedirect() != nil {
		v.r.errorf(field(path, "rewrite"), "rewrite cannot be combined with redirect")
	}
	for i, m := range h.GetMatch() {
		v.httpMatch(at(field(path, "match"), i), m)
	}
	v.httpRouteDestinations(field(path, "route"), h.GetRoute())
	if r := h.GetRedirect(); r != nil {
		rp := field(path, "redirect")
		switch r.GetRedirectCode() {
		case 0, 301, 302, 303, 307, 308:
		default:
			v.r.errorf(field(rp, "redirectCode"), "redirect code %d must be 301, 302, 303, 307 or 308", r.GetRedirectCode())
		}
		if r.GetUri() == "" && r.GetAuthority() == "" && r.GetScheme() == "" && r.GetPort() == 0 &&
			r.GetPrefixRewrite() == "" && r.GetDerivePort() == networking.HTTPRedirect_FROM_PROTOCOL_DEFAULT {
			v.r.errorf(rp, "a redirect must change at least one of uri, prefixRewrite, authority, scheme or port")
		}
		if r.GetUri() != "" && r.GetPrefixRewrite() != "" {
			v.r.errorf(rp, "uri and prefixRewrite cannot both be set")
		}
		if p, ok := r.GetRedirectPort().(*networking.HTTPRedirect_Port); ok {
			v.port(field(rp, "port"), p.Port)
		}
	}
	if d := h.GetDirectResponse(); d != nil {
		if d.GetStatus() < 200 || d.GetStatus() > 599 {
			v.r.errorf(field(path, "directResponse.status"), "status %d must be between 200 and 599", d.GetStatus())
		}
		if len(d.GetBody().GetString_())+len(d.GetBody().GetBytes()) > 1<<20 {
			v.r.errorf(field(path, "directResponse.body"), "body is larger than 1 MiB")
		}
	}
	if rw := h.GetRewrite(); rw != nil {
		rp := field(path, "rewrite")
		if rw.GetUri() != "" && rw.GetUriRegexRewrite() != nil {
			v.r.errorf(rp, "uri and uriRegexRewrite cannot both be set")
		}
		if rr := rw.GetUriRegexRewrite(); rr != nil {
			v.regex(field(rp, "uriRegexRewrite.match"), rr.GetMatch())
		}
		if rw.GetUri() == "" && rw.GetAuthority() == "" && rw.GetUriRegexRewrite() == nil {
			v.r.errorf(rp, "a rewrite must set uri, uriRegexRewrite or authority")
		}
	}
	if h.GetTimeout() != nil {
		v.duration(field(path, "timeout"), h.GetTimeout(), 0)
	}
	v.retries(field(path, "retries"), h.GetRetries())
	v.fault(field(path, "fault"), h.GetFault())
	if h.GetMirror() != nil && len(h.GetMirrors()) > 0 {
		v.r.errorf(field(path, "mirror"), "mirror and mirrors cannot both be set")
	}
	if h.GetMirror() != nil {
		v.destination(field(path, "mirror"), h.GetMirror())
	}
	if h.GetMirrorPercentage() != nil {
		v.percent(field(path, "mirrorPercentage.value"), h.GetMirrorPercentage().GetValue())
	}
	if mp := h.GetMirrorPercent(); mp != nil { //nolint:staticcheck // deprecated, still accepted from users
		v.r.warnc(CodeDeprecated, field(path, "mirrorPercent"), "mirrorPercent is deprecated; use mirrorPercentage")
		if mp.GetValue() > 100 {
			v.r.errorf(field(path, "mirrorPercent"), "percentage %d must be between 0 and 100", mp.GetValue())
		}
	}
	for i, m := range h.GetMirrors() {
		mp := at(field(path, "mirrors"), i)
		if m.GetDestination() == nil {
			v.r.errorf(field(mp, "destination"), "destination is required")
		} else {
			v.destination(field(mp, "destination"), m.GetDestination())
		}
		if m.GetPercentage() != nil {
			v.percent(field(mp, "percentage.value"), m.GetPercentage().GetValue())
		}
	}
	v.headerOps(field(path, "headers.request"), h.GetHeaders().GetRequest())
	v.headerOps(field(path, "headers.response"), h.GetHeaders().GetResponse())
	if c := h.GetCorsPolicy(); c != nil {
		for i, o := range c.GetAllowOrigins() {
			v.stringMatch(at(field(path, "corsPolicy.allowOrigins"), i), o)
		}
		if c.GetMaxAge() != nil {
			v.duration(field(path, "corsPolicy.maxAge"), c.GetMaxAge(), 0)
		}
	}
}

func (v *validator) httpMatch(path string, m *networking.HTTPMatchRequest) {
	v.stringMatch(field(path, "uri"), m.GetUri())
	v.stringMatch(field(path, "scheme"), m.GetScheme())
	v.stringMatch(field(path, "method"), m.GetMethod())
	v.stringMatch(field(path, "authority"), m.GetAuthority())
	for _, set := range []struct {
		name string
		m    map[string]*networking.StringMatch
	}{{"headers", m.GetHeaders()}, {"withoutHeaders", m.GetWithoutHeaders()}} {
		for name, sm := range set.m {
			hp := key(field(path, set.name), name)
			if _, claim := authz.RoutingClaim(name); claim {
				// A JWT claim (Istio's ValidateHTTPHeaderNameOrJwtClaimRoute),
				// which only a gateway's JWT filter makes available to routing.
				if vs, ok := v.obj.Spec.(*networking.VirtualService); ok && (len(vs.GetGateways()) == 0 || slices.Contains(vs.GetGateways(), model.MeshGateway)) {
					v.r.errorf(hp, "JWT claim based routing (key: %s) is only supported for gateway, found no gateways: %v", name, vs.GetGateways())
				}
				if sm.GetMatchType() != nil {
					v.stringMatch(hp, sm)
				}
				continue
			}
			if v.headerName(hp, name) && name != strings.ToLower(name) {
				v.r.errorf(hp, "header name %q must be lower case: Envoy matches lower-cased names, so it would never match", name)
			}
			// An empty match means "header present": allowed.
			if sm.GetMatchType() != nil {
				v.stringMatch(hp, sm)
			}
		}
	}
	for name, sm := range m.GetQueryParams() {
		qp := key(field(path, "queryParams"), name)
		if name == "" {
			v.r.errorf(qp, "query parameter name must not be empty")
		}
		if sm.GetMatchType() != nil {
			v.stringMatch(qp, sm)
		}
	}
	if m.GetPort() != 0 {
		v.port(field(path, "port"), m.GetPort())
	}
	v.labels(field(path, "sourceLabels"), m.GetSourceLabels())
	for i, g := range m.GetGateways() {
		v.gatewayRef(at(field(path, "gateways"), i), g)
	}
	if ns := m.GetSourceNamespace(); ns != "" && dns1123Label(ns) != "" {
		v.r.errorf(field(path, "sourceNamespace"), "%q is not a valid namespace name", ns)
	}
}

func (v *validator) httpRouteDestinations(path string, routes []*networking.HTTPRouteDestination) {
	checkDestinations(v, path, routes)
	for i, rd := range routes {
		v.headerOps(field(at(path, i), "headers.request"), rd.GetHeaders().GetRequest())
		v.headerOps(field(at(path, i), "headers.response"), rd.GetHeaders().GetResponse())
	}
}

func (v *validator) routeDestinations(path string, routes []*networking.RouteDestination) {
	if len(routes) == 0 {
		v.r.errorf(path, "at least one route destination is required")
	}
	checkDestinations(v, path, routes)
}

// weighted is what HTTP, TCP and TLS route destinations have in common.
type weighted interface {
	GetDestination() *networking.Destination
	GetWeight() int32
}

// checkDestinations checks each destination and the weights together.
func checkDestinations[T weighted](v *validator, path string, routes []T) {
	weights := make([]int32, len(routes))
	for i, rd := range routes {
		p := at(path, i)
		if rd.GetDestination() == nil {
			v.r.errorf(field(p, "destination"), "destination is required")
		} else {
			v.destination(field(p, "destination"), rd.GetDestination())
		}
		weights[i] = rd.GetWeight()
	}
	v.weights(path, weights)
}

// weights checks destination weights: each 0-100 and, with more than one
// destination, a total of 100.
func (v *validator) weights(path string, weights []int32) {
	total := int64(0)
	bad := false
	for i, w := range weights {
		if w < 0 || w > 100 {
			v.r.errorf(field(at(path, i), "weight"), "weight %d must be between 0 and 100", w)
			bad = true
		}
		total += int64(w)
	}
	if len(weights) > 1 && total != 100 && !bad {
		parts := make([]string, len(weights))
		for i, w := range weights {
			parts[i] = strconv.Itoa(int(w))
		}
		v.r.errorf(path, "destination weights must add up to 100, not %d (%s)", total, strings.Join(parts, "+"))
	}
	if len(weights) == 1 && weights[0] != 0 && weights[0] != 100 {
		v.r.warnf(field(at(path, 0), "weight"), "a single destination receives all traffic whatever its weight (%d)", weights[0])
	}
}

func (v *validator) destination(path string, d *networking.Destination) {
	v.host(field(path, "host"), d.GetHost(), false)
	if d.GetPort() != nil {
		v.port(field(path, "port.number"), d.GetPort().GetNumber())
	}
	if d.GetSubset() == "" {
		return
	}
	if msg := dns1123Label(d.GetSubset()); msg != "" {
		v.r.errorf(field(path, "subset"), "subset name %q %s", d.GetSubset(), msg)
		return
	}
	if v.ctx == nil {
		return
	}
	names, found := v.ctx.Subsets(v.obj.Meta.Namespace, d.GetHost())
	switch {
	case !found:
		v.r.warnc(CodeSubsetNotFound, field(path, "subset"), "subset %q: no DestinationRule for host %q defines subsets; traffic to it will fail", d.GetSubset(), d.GetHost())
	case !slices.Contains(names, d.GetSubset()):
		v.r.warnc(CodeSubsetNotFound, field(path, "subset"), "subset %q is not defined by the DestinationRule for host %q (it defines %s)", d.GetSubset(), d.GetHost(), quoted(names))
	}
}

// retryOn lists Envoy's retry conditions Istio passes through.
func knownRetryOn(s string) bool {
	switch s {
	case "5xx", "gateway-error", "reset", "reset-before-request", "connect-failure", "envoy-ratelimited",
		"retriable-4xx", "refused-stream", "retriable-status-codes", "retriable-headers", "http3-post-connect-failure",
		"cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable":
		return true
	}
	n, err := strconv.Atoi(s)
	return err == nil && n >= 100 && n <= 599
}

func (v *validator) retries(path string, r *networking.HTTPRetry) {
	if r == nil {
		return
	}
	if r.GetAttempts() < 0 {
		v.r.errorf(field(path, "attempts"), "attempts %d must not be negative", r.GetAttempts())
	}
	if r.GetPerTryTimeout() != nil {
		v.duration(field(path, "perTryTimeout"), r.GetPerTryTimeout(), minTimeout)
	}
	if r.GetBackoff() != nil {
		v.duration(field(path, "backoff"), r.GetBackoff(), minTimeout)
	}
	if r.GetRetryOn() != "" {
		for _, c := range strings.Split(r.GetRetryOn(), ",") {
			if c = strings.TrimSpace(c); !knownRetryOn(c) {
				v.r.errorf(field(path, "retryOn"), "unknown retry condition %q", c)
			}
		}
	}
}

func (v *validator) fault(path string, f *networking.HTTPFaultInjection) {
	if f == nil {
		return
	}
	if f.GetDelay() == nil && f.GetAbort() == nil {
		v.r.errorf(path, "a fault needs a delay, an abort or both")
	}
	if d := f.GetDelay(); d != nil {
		dp := field(path, "delay")
		switch t := d.GetHttpDelayType().(type) {
		case *networking.HTTPFaultInjection_Delay_FixedDelay:
			v.duration(field(dp, "fixedDelay"), t.FixedDelay, minTimeout)
		case *networking.HTTPFaultInjection_Delay_ExponentialDelay:
			v.r.errorf(field(dp, "exponentialDelay"), "exponentialDelay is not supported; use fixedDelay")
		default:
			v.r.errorf(field(dp, "fixedDelay"), "fixedDelay is required")
		}
		if d.GetPercentage() != nil {
			v.percent(field(dp, "percentage.value"), d.GetPercentage().GetValue())
		}
		if pct := d.GetPercent(); pct < 0 || pct > 100 { //nolint:staticcheck // deprecated, still accepted from users
			v.r.errorf(field(dp, "percent"), "percent %d must be between 0 and 100", pct)
		} else if pct > 0 {
			// Istio's deprecation analyzer: HTTPRoute.fault.delay.percent.
			v.r.warnc(CodeDeprecated, field(dp, "percent"), "percent is deprecated; use percentage")
		}
	}
	if a := f.GetAbort(); a != nil {
		ap := field(path, "abort")
		switch t := a.GetErrorType().(type) {
		case *networking.HTTPFaultInjection_Abort_HttpStatus:
			if t.HttpStatus < 200 || t.HttpStatus > 599 {
				v.r.errorf(field(ap, "httpStatus"), "HTTP status %d must be between 200 and 599", t.HttpStatus)
			}
		case *networking.HTTPFaultInjection_Abort_GrpcStatus:
			if !knownGRPCStatus(t.GrpcStatus) {
				v.r.errorf(field(ap, "grpcStatus"), "unknown gRPC status %q (e.g. UNAVAILABLE, DEADLINE_EXCEEDED)", t.GrpcStatus)
			}
		default:
			v.r.errorf(ap, "one of httpStatus or grpcStatus is required")
		}
		if a.GetPercentage() != nil {
			v.percent(field(ap, "percentage.value"), a.GetPercentage().GetValue())
		}
	}
}

func knownGRPCStatus(s string) bool {
	switch s {
	case "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
		"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
		"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED":
		return true
	}
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0 && n <= 16
}
