package authz

import (
	"net/netip"
	"regexp"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	uritemplatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/path/match/uri_template/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// This file evaluates Envoy RBAC configurations the way Envoy's
// documentation describes them (envoy.config.rbac.v3, the header,
// string, metadata and value matchers, uri_template), written from the
// documentation and independent of how this package builds them.

// request is one request (or, without http, one TCP connection) as the
// RBAC filters see it.
type request struct {
	// peer is the URI SAN of the client's certificate ("spiffe://…"),
	// empty over plaintext.
	peer               string
	directIP, remoteIP netip.Addr
	destIP             netip.Addr
	destPort           uint32
	sni                string
	http               bool
	method, host, path string
	headers            map[string]string
	// jwt is the payload jwt_authn verified (nil: no token).
	jwt map[string]any
}

// envoyAllows runs the RBAC filters of a set in Envoy's order (CUSTOM's
// shadow rules enforce nothing; AUDIT logs; DENY; ALLOW) and reports
// whether the request goes through.
func envoyAllows(s Set, r request) bool {
	for _, rules := range []*rbacv3.RBAC{s.Audit.Enforce, s.Deny.Enforce, s.Allow.Enforce} {
		if rules == nil {
			continue // Rules absent: the filter enforces nothing.
		}
		matched := false
		for _, p := range rules.GetPolicies() {
			if policyMatches(p, r) {
				matched = true
				break
			}
		}
		switch rules.GetAction() {
		case rbacv3.RBAC_ALLOW:
			if !matched {
				return false
			}
		case rbacv3.RBAC_DENY:
			if matched {
				return false
			}
		case rbacv3.RBAC_LOG:
		}
	}
	return true
}

// policyMatches: "A policy matches if and only if at least one of its
// permissions match the action taking place AND at least one of its
// principals match the downstream." (RBAC's Policy).
func policyMatches(p *rbacv3.Policy, r request) bool {
	perm, prin := false, false
	for _, x := range p.GetPermissions() {
		if permissionMatches(x, r) {
			perm = true
			break
		}
	}
	for _, x := range p.GetPrincipals() {
		if principalMatches(x, r) {
			prin = true
			break
		}
	}
	return perm && prin
}

func permissionMatches(p *rbacv3.Permission, r request) bool {
	switch rule := p.GetRule().(type) {
	case *rbacv3.Permission_AndRules:
		for _, x := range rule.AndRules.GetRules() {
			if !permissionMatches(x, r) {
				return false
			}
		}
		return true
	case *rbacv3.Permission_OrRules:
		for _, x := range rule.OrRules.GetRules() {
			if permissionMatches(x, r) {
				return true
			}
		}
		return false
	case *rbacv3.Permission_Any:
		return rule.Any
	case *rbacv3.Permission_NotRule:
		return !permissionMatches(rule.NotRule, r)
	case *rbacv3.Permission_Header:
		return headerMatches(rule.Header, r)
	case *rbacv3.Permission_UrlPath:
		// "the path … without the query and fragment string"; a TCP
		// connection has none.
		return r.http && stringMatches(rule.UrlPath.GetPath(), strings.SplitN(r.path, "?", 2)[0])
	case *rbacv3.Permission_DestinationIp:
		return inCIDR(rule.DestinationIp, r.destIP)
	case *rbacv3.Permission_DestinationPort:
		return rule.DestinationPort == r.destPort
	case *rbacv3.Permission_RequestedServerName:
		return stringMatches(rule.RequestedServerName, r.sni)
	case *rbacv3.Permission_Metadata:
		return metadataMatches(rule.Metadata, r) //nolint:staticcheck // what the translation emits
	case *rbacv3.Permission_UriTemplate:
		cfg := &uritemplatev3.UriTemplateMatchConfig{}
		if err := rule.UriTemplate.GetTypedConfig().UnmarshalTo(cfg); err != nil {
			panic(err)
		}
		return r.http && templateMatches(cfg.GetPathTemplate(), strings.SplitN(r.path, "?", 2)[0])
	}
	panic("unexpected permission")
}

func principalMatches(p *rbacv3.Principal, r request) bool {
	switch id := p.GetIdentifier().(type) {
	case *rbacv3.Principal_AndIds:
		for _, x := range id.AndIds.GetIds() {
			if !principalMatches(x, r) {
				return false
			}
		}
		return true
	case *rbacv3.Principal_OrIds:
		for _, x := range id.OrIds.GetIds() {
			if principalMatches(x, r) {
				return true
			}
		}
		return false
	case *rbacv3.Principal_Any:
		return id.Any
	case *rbacv3.Principal_NotId:
		return !principalMatches(id.NotId, r)
	case *rbacv3.Principal_Authenticated_:
		// "The name of the principal. If set, The URI SAN or DNS SAN in
		// that order is used from the certificate"; without a
		// certificate nothing is authenticated.
		if r.peer == "" {
			return false
		}
		return id.Authenticated.GetPrincipalName() == nil || stringMatches(id.Authenticated.GetPrincipalName(), r.peer)
	case *rbacv3.Principal_DirectRemoteIp:
		return inCIDR(id.DirectRemoteIp, r.directIP)
	case *rbacv3.Principal_RemoteIp:
		return inCIDR(id.RemoteIp, r.remoteIP)
	case *rbacv3.Principal_Header:
		return headerMatches(id.Header, r)
	case *rbacv3.Principal_Metadata:
		return metadataMatches(id.Metadata, r) //nolint:staticcheck // what the translation emits
	}
	panic("unexpected principal")
}

// headerMatches: the pseudo-headers :method, :authority and :path are
// headers too; a missing header matches only present_match: false (and
// inverted matchers).
func headerMatches(h *routev3.HeaderMatcher, r request) bool {
	if !r.http {
		return false
	}
	var v string
	ok := true
	switch h.GetName() {
	case ":method":
		v = r.method
	case ":authority":
		v = r.host
	case ":path":
		v = r.path
	default:
		v, ok = r.headers[strings.ToLower(h.GetName())]
	}
	var m bool
	switch spec := h.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_PresentMatch:
		m = ok == spec.PresentMatch
	case *routev3.HeaderMatcher_StringMatch:
		m = ok && stringMatches(spec.StringMatch, v)
	default:
		panic("unexpected header matcher")
	}
	return m != h.GetInvertMatch()
}

func stringMatches(m *matcherv3.StringMatcher, v string) bool {
	cmp := func(a string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(a)
		}
		return a
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return cmp(v) == cmp(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(cmp(v), cmp(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(cmp(v), cmp(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(cmp(v), cmp(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		// "The regex match string. The string must be supported by the
		// configured engine. The regex is matched against the full
		// string, not as a partial match."
		return regexp.MustCompile(`^(?:` + p.SafeRegex.GetRegex() + `)$`).MatchString(v)
	}
	panic("unexpected string matcher")
}

func inCIDR(c *corev3.CidrRange, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	base, err := netip.ParseAddr(c.GetAddressPrefix())
	if err != nil {
		panic(err)
	}
	p, err := base.Prefix(int(c.GetPrefixLen().GetValue()))
	if err != nil {
		panic(err)
	}
	return p.Contains(a)
}

// metadataMatches reads the dynamic metadata of the request: only
// jwt_authn's, under "payload", is there.
func metadataMatches(m *matcherv3.MetadataMatcher, r request) bool {
	var v any
	if m.GetFilter() == JWTFilter && r.jwt != nil {
		v = map[string]any{JWTPayload: r.jwt}
		for _, seg := range m.GetPath() {
			obj, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			v = obj[seg.GetKey()]
		}
	}
	return (v != nil && valueMatches(m.GetValue(), v)) != m.GetInvert()
}

func valueMatches(m *matcherv3.ValueMatcher, v any) bool {
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.ValueMatcher_StringMatch:
		s, ok := v.(string)
		return ok && stringMatches(p.StringMatch, s)
	case *matcherv3.ValueMatcher_ListMatch:
		l, ok := v.([]any)
		if !ok {
			return false
		}
		for _, e := range l {
			if valueMatches(p.ListMatch.GetOneOf(), e) {
				return true
			}
		}
		return false
	case *matcherv3.ValueMatcher_OrMatch:
		for _, x := range p.OrMatch.GetValueMatchers() {
			if valueMatches(x, v) {
				return true
			}
		}
		return false
	}
	panic("unexpected value matcher")
}

// templateMatches follows Envoy's uri_template documentation: the
// template and the path are split at "/"; "*" matches exactly one
// non-empty segment, "**" (last) the rest of the path, any number of
// segments including none, and everything else matches literally.
func templateMatches(tmpl, path string) bool {
	ts := strings.Split(tmpl, "/")
	ps := strings.Split(path, "/")
	for i, t := range ts {
		if t == "**" {
			// Envoy compiles "/a/**" to "/a/" and any text: "/a/" and
			// "/a/b/c" match, "/a" does not.
			return i < len(ps)
		}
		if i >= len(ps) {
			return false
		}
		if t == "*" {
			if ps[i] == "" {
				return false
			}
			continue
		}
		if t != ps[i] {
			return false
		}
	}
	return len(ts) == len(ps)
}
