// Package authz translates Istio AuthorizationPolicy rules into Envoy RBAC
// policies (envoy.config.rbac.v3), the way Istio's
// pilot/pkg/security/authz/model does, for three targets: Envoy's HTTP
// RBAC filter, Envoy's network (TCP) RBAC filter, and grpc-go's
// server-side RBAC (gRFC A41).
//
// The translation is pure: the same rule gives the same policy, nothing
// is read but the arguments, and the input is never modified.
//
// The one rule this package never breaks: the result is never more
// permissive than the rule. A field the target cannot evaluate (an HTTP
// attribute on a TCP chain, a header grpc-go refuses) makes an ALLOW rule
// fail, so it is left out and allows nothing; in DENY, AUDIT and CUSTOM
// rules that field is left out of the rule, so it matches more requests
// and denies (or audits, or sends to the authorizer) more, never fewer.
package authz

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	uritemplatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/path/match/uri_template/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Target is the RBAC engine a policy is built for.
type Target int

// Targets.
const (
	// HTTP is Envoy's HTTP RBAC filter (envoy.filters.http.rbac).
	HTTP Target = iota
	// TCP is Envoy's network RBAC filter (envoy.filters.network.rbac): no
	// request attributes (headers, paths, methods, hosts, JWT claims).
	TCP
	// GRPC is grpc-go's server RBAC: as HTTP, but no uri_template paths
	// (path templates become regular expressions) and no header matchers
	// on grpc-* headers or :scheme, which grpc-go refuses (A41).
	GRPC
)

// Attribute keys of "when" conditions, as Istio names them.
const (
	keyRequestHeader     = "request.headers"
	keySrcIP             = "source.ip"
	keyRemoteIP          = "remote.ip"
	keySrcNamespace      = "source.namespace"
	keySrcServiceAccount = "source.serviceAccount"
	keySrcTrustDomain    = "source.trustDomain"
	keySrcPrincipal      = "source.principal"
	keyRequestPrincipal  = "request.auth.principal"
	keyRequestAudiences  = "request.auth.audiences"
	keyRequestPresenter  = "request.auth.presenter"
	keyRequestClaims     = "request.auth.claims"
	keyDestIP            = "destination.ip"
	keyDestPort          = "destination.port"
	keyConnSNI           = "connection.sni"
	keyEnvoyFilter       = "experimental.envoy.filters."

	// Internal keys of "to" fields.
	keyMethod = ":method"
	keyPath   = "path"
	keyHost   = ":authority"
)

// JWT metadata: where Envoy's jwt_authn filter puts a verified token's
// payload, which requestPrincipals and request.auth.* match.
const (
	JWTFilter  = "envoy.filters.http.jwt_authn"
	JWTPayload = "payload"
)

// Options are the settings one translation uses.
type Options struct {
	Target Target
	// TrustDomains are the mesh's trust domain, then its aliases: a
	// principal naming any of them (or cluster.local) matches peers of
	// all of them, as Istio's trust domain migration does.
	TrustDomains []string
}

// errHTTPOnly is a field a TCP chain cannot evaluate.
var errHTTPOnly = errors.New("is HTTP only")

// condition is one field of a rule: values any of which matches, and
// notValues none of which may.
type condition struct {
	key               string
	values, notValues []string
	// principal: the field is about the source (Envoy's principals),
	// else the operation (Envoy's permissions).
	principal bool
	// whole: the field's values are translated together into one matcher
	// (Istio's extended generators: JWT claims and principals, and
	// Envoy filter metadata).
	whole bool
}

// Rule translates one rule of an AuthorizationPolicy in namespace ns into
// an RBAC policy for a filter of the given action. The "from" sources are
// ORed into principals, the "to" operations into permissions, each "when"
// condition ANDed into every one of them (as Istio's model.New).
//
// An error means the rule must be left out. That happens only for ALLOW
// (a field the target cannot evaluate, or a value that cannot be read)
// and for an unknown "when" key (galley rejects those). For the other
// actions such a field or value is dropped instead.
func Rule(ns string, r *security.Rule, action rbacv3.RBAC_Action, o Options) (*rbacv3.Policy, error) {
	var basePerm, basePrin []condition
	for _, w := range r.GetWhen() {
		c, err := whenCondition(w)
		if err != nil {
			return nil, err
		}
		if c.principal {
			basePrin = append(basePrin, c)
		} else {
			basePerm = append(basePerm, c)
		}
	}
	t := translator{ns: ns, action: action, o: o}
	out := &rbacv3.Policy{}
	for _, from := range r.GetFrom() {
		s := from.GetSource()
		var cs []condition
		add := func(key string, values, notValues []string, whole bool) {
			if len(values) > 0 || len(notValues) > 0 {
				cs = append(cs, condition{key: key, values: values, notValues: notValues, principal: true, whole: whole})
			}
		}
		// Istio's order: principals first, ipBlocks last, then "when".
		add(keySrcPrincipal, s.GetPrincipals(), s.GetNotPrincipals(), false)
		add(keyRequestPrincipal, s.GetRequestPrincipals(), s.GetNotRequestPrincipals(), true)
		add(keySrcServiceAccount, s.GetServiceAccounts(), s.GetNotServiceAccounts(), false)
		add(keySrcTrustDomain, s.GetTrustDomains(), s.GetNotTrustDomains(), false)
		add(keySrcNamespace, s.GetNamespaces(), s.GetNotNamespaces(), false)
		add(keyRemoteIP, s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), false)
		add(keySrcIP, s.GetIpBlocks(), s.GetNotIpBlocks(), false)
		p, err := t.principal(append(cs, basePrin...))
		if err != nil {
			return nil, err
		}
		out.Principals = append(out.Principals, p)
	}
	if len(r.GetFrom()) == 0 {
		p, err := t.principal(basePrin)
		if err != nil {
			return nil, err
		}
		out.Principals = append(out.Principals, p)
	}
	for _, to := range r.GetTo() {
		op := to.GetOperation()
		var cs []condition
		add := func(key string, values, notValues []string) {
			if len(values) > 0 || len(notValues) > 0 {
				cs = append(cs, condition{key: key, values: values, notValues: notValues})
			}
		}
		add(keyHost, op.GetHosts(), op.GetNotHosts())
		add(keyMethod, op.GetMethods(), op.GetNotMethods())
		add(keyPath, op.GetPaths(), op.GetNotPaths())
		add(keyDestPort, op.GetPorts(), op.GetNotPorts())
		p, err := t.permission(append(cs, basePerm...))
		if err != nil {
			return nil, err
		}
		out.Permissions = append(out.Permissions, p)
	}
	if len(r.GetTo()) == 0 {
		p, err := t.permission(basePerm)
		if err != nil {
			return nil, err
		}
		out.Permissions = append(out.Permissions, p)
	}
	return out, nil
}

// whenCondition sorts a "when" condition by its key.
func whenCondition(w *security.Condition) (condition, error) {
	c := condition{key: w.GetKey(), values: w.GetValues(), notValues: w.GetNotValues()}
	k := c.key
	switch {
	case k == keyDestIP, k == keyDestPort, k == keyConnSNI:
	case strings.HasPrefix(k, keyEnvoyFilter):
		c.whole = true
	case k == keySrcIP, k == keyRemoteIP, k == keySrcNamespace, k == keySrcTrustDomain,
		k == keySrcServiceAccount, k == keySrcPrincipal, strings.HasPrefix(k, keyRequestHeader):
		c.principal = true
	case k == keyRequestPrincipal, k == keyRequestAudiences, k == keyRequestPresenter, strings.HasPrefix(k, keyRequestClaims):
		c.principal, c.whole = true, true
	default:
		return c, fmt.Errorf("unknown attribute %q", k)
	}
	return c, nil
}

type translator struct {
	ns     string
	action rbacv3.RBAC_Action
	o      Options
}

// keep decides what a field's error does: an ALLOW rule fails, other
// actions drop the value (true: go on without it).
func (t translator) keep(c condition, err error) error {
	if t.action == rbacv3.RBAC_ALLOW {
		return fmt.Errorf("%s: %w", c.key, err)
	}
	return nil
}

// builder makes one kind of matcher (Envoy's principals or permissions):
// from a field's values together (whole) or one value, and the
// combinators.
type builder[T any] struct {
	whole, value func(key string, vs []string) (T, error)
	or, and      func([]T) T
	not          func(T) T
	always       T
}

// conditions ANDs the fields of cs, each field the OR of its values and
// the NOT of the OR of its notValues. A value (or a whole field) that
// cannot be translated fails an ALLOW rule, and is left out of the
// others (keep).
func conditions[T any](t translator, cs []condition, b builder[T]) (T, error) {
	var zero T
	var and []T
	for _, c := range cs {
		for _, neg := range []bool{false, true} {
			vs := c.values
			if neg {
				vs = c.notValues
			}
			if len(vs) == 0 {
				continue
			}
			if err := validUTF8(c.key, vs); err != nil {
				if err := t.keep(c, err); err != nil {
					return zero, err
				}
				continue
			}
			var one T
			if c.whole {
				m, err := b.whole(c.key, vs)
				if err != nil {
					if err := t.keep(c, err); err != nil {
						return zero, err
					}
					continue
				}
				one = m
			} else {
				var or []T
				for _, v := range vs {
					m, err := b.value(c.key, []string{v})
					if err != nil {
						if err := t.keep(c, err); err != nil {
							return zero, err
						}
						continue
					}
					or = append(or, m)
				}
				if len(or) == 0 {
					continue
				}
				one = b.or(or)
			}
			if neg {
				one = b.not(one)
			}
			and = append(and, one)
		}
	}
	if len(and) == 0 {
		and = []T{b.always}
	}
	return b.and(and), nil
}

func (t translator) principal(cs []condition) (*rbacv3.Principal, error) {
	for i, c := range cs {
		switch c.key {
		case keySrcPrincipal:
			cs[i].values, cs[i].notValues = t.withAliases(c.values), t.withAliases(c.notValues)
		case keySrcTrustDomain:
			cs[i].values, cs[i].notValues = t.expandTrustDomains(c.values), t.expandTrustDomains(c.notValues)
		}
	}
	return conditions(t, cs, builder[*rbacv3.Principal]{
		whole: t.wholePrincipal,
		value: func(key string, vs []string) (*rbacv3.Principal, error) { return t.valuePrincipal(key, vs[0]) },
		or:    principalOr,
		and: func(l []*rbacv3.Principal) *rbacv3.Principal {
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: l}}}
		},
		not: func(p *rbacv3.Principal) *rbacv3.Principal {
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: p}}
		},
		always: &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}},
	})
}

func (t translator) permission(cs []condition) (*rbacv3.Permission, error) {
	return conditions(t, cs, builder[*rbacv3.Permission]{
		whole: t.wholePermission,
		value: func(key string, vs []string) (*rbacv3.Permission, error) { return t.valuePermission(key, vs[0]) },
		or: func(l []*rbacv3.Permission) *rbacv3.Permission {
			return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: l}}}
		},
		and: func(l []*rbacv3.Permission) *rbacv3.Permission {
			return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: l}}}
		},
		not: func(p *rbacv3.Permission) *rbacv3.Permission {
			return &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: p}}
		},
		always: &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}},
	})
}

// validUTF8 refuses values protobuf cannot carry (galley's decoding
// never produces them; the check keeps the translation total).
func validUTF8(key string, vs []string) error {
	for _, v := range append([]string{key}, vs...) {
		if !utf8.ValidString(v) {
			return errors.New("a value is not valid UTF-8")
		}
	}
	return nil
}

func principalOr(or []*rbacv3.Principal) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: or}}}
}

// httpOnly fails for a request attribute on a TCP chain.
func (t translator) httpOnly() error {
	if t.o.Target == TCP {
		return errHTTPOnly
	}
	return nil
}

// valuePrincipal translates one value of a source field.
func (t translator) valuePrincipal(key, v string) (*rbacv3.Principal, error) {
	switch {
	case key == keySrcIP, key == keyRemoteIP:
		cidr, err := cidrRange(v)
		if err != nil {
			return nil, err
		}
		if key == keySrcIP {
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: cidr}}, nil
		}
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: cidr}}, nil
	case key == keySrcNamespace:
		// Istio: "*" in a namespace matches any characters.
		parts := strings.Split(v, "*")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		return authenticated(regexMatcher(".*/ns/" + strings.Join(parts, ".*") + "/.*")), nil
	case key == keySrcServiceAccount:
		if !utf8.ValidString(t.ns) {
			return nil, errors.New("the namespace is not valid UTF-8")
		}
		return authenticated(regexMatcher(serviceAccountRegex(t.ns, v))), nil
	case key == keySrcTrustDomain:
		return authenticated(trustDomainMatcher(v)), nil
	case key == keySrcPrincipal:
		return authenticated(stringMatcher(v, "spiffe://")), nil
	case strings.HasPrefix(key, keyRequestHeader):
		if err := t.httpOnly(); err != nil {
			return nil, err
		}
		name, err := inBrackets(strings.TrimPrefix(key, keyRequestHeader))
		if err != nil {
			return nil, err
		}
		if err := t.grpcHeader(name); err != nil {
			return nil, err
		}
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: headerMatcher(name, v, false)}}, nil
	}
	return nil, fmt.Errorf("%q is not a source attribute", key)
}

// wholePrincipal translates all the values of a JWT field together.
func (t translator) wholePrincipal(key string, vs []string) (*rbacv3.Principal, error) {
	if err := t.httpOnly(); err != nil {
		return nil, err
	}
	switch {
	case key == keyRequestPrincipal:
		var or []*rbacv3.Principal
		for _, v := range vs {
			iss, sub := requestPrincipalMatchers(v)
			or = append(or, &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: []*rbacv3.Principal{
				metadataPrincipal(jwtClaim([]string{"iss"}, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: iss}}, false)),
				metadataPrincipal(jwtClaim([]string{"sub"}, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: sub}}, false)),
			}}}})
		}
		if len(or) == 1 {
			return or[0], nil
		}
		return principalOr(or), nil
	case key == keyRequestAudiences:
		return metadataPrincipal(jwtClaim([]string{"aud"}, stringOr(vs), true)), nil
	case key == keyRequestPresenter:
		return metadataPrincipal(jwtClaim([]string{"azp"}, stringOr(vs), true)), nil
	case strings.HasPrefix(key, keyRequestClaims):
		claims, err := nestedNames(strings.TrimPrefix(key, keyRequestClaims))
		if err != nil {
			return nil, err
		}
		return metadataPrincipal(jwtClaim(claims, stringOr(vs), true)), nil
	}
	return nil, fmt.Errorf("%q is not a request attribute", key)
}

// valuePermission translates one value of an operation field.
func (t translator) valuePermission(key, v string) (*rbacv3.Permission, error) {
	switch key {
	case keyDestIP:
		cidr, err := cidrRange(v)
		if err != nil {
			return nil, err
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationIp{DestinationIp: cidr}}, nil
	case keyDestPort:
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("invalid port %q", v)
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: uint32(p)}}, nil
	case keyConnSNI:
		return &rbacv3.Permission{Rule: &rbacv3.Permission_RequestedServerName{RequestedServerName: stringMatcher(v, "")}}, nil
	case keyHost:
		if err := t.httpOnly(); err != nil {
			return nil, err
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: headerMatcher(keyHost, v, true)}}, nil
	case keyMethod:
		if err := t.httpOnly(); err != nil {
			return nil, err
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: headerMatcher(keyMethod, v, false)}}, nil
	case keyPath:
		if err := t.httpOnly(); err != nil {
			return nil, err
		}
		if IsPathTemplate(v) {
			if t.o.Target == GRPC {
				return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: regexMatcher(TemplateRegex(v))}}}}, nil
			}
			cfg, err := anypb.New(&uritemplatev3.UriTemplateMatchConfig{PathTemplate: templateReplacer.Replace(v)})
			if err != nil {
				return nil, err
			}
			return &rbacv3.Permission{Rule: &rbacv3.Permission_UriTemplate{UriTemplate: &corev3.TypedExtensionConfig{Name: "uri-template", TypedConfig: cfg}}}, nil
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: stringMatcher(v, "")}}}}, nil
	}
	return nil, fmt.Errorf("%q is not an operation attribute", key)
}

// wholePermission translates an Envoy filter metadata condition
// ("experimental.envoy.filters.<filter>[<key>]"): each value a string, or
// "[v]" an element of a list.
func (t translator) wholePermission(key string, vs []string) (*rbacv3.Permission, error) {
	filter, name, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(key, "experimental."), "]"), "[")
	if !ok || filter == "" || name == "" {
		return nil, fmt.Errorf("invalid key %q", key)
	}
	if t.o.Target == GRPC {
		// grpc-go has no filter metadata: a metadata matcher never
		// matches there, which would make a DENY narrower than written.
		return nil, errors.New("is not available on proxyless gRPC servers")
	}
	var ms []*matcherv3.ValueMatcher
	for _, v := range vs {
		if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
			ms = append(ms, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{
				MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: stringMatcher(strings.Trim(v, "[]"), "")}}},
			}}})
			continue
		}
		ms = append(ms, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: stringMatcher(v, "")}})
	}
	// metadata (deprecated for sourced_metadata, which grpc-go refuses
	// and Istio does not use yet).
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Metadata{Metadata: &matcherv3.MetadataMatcher{ //nolint:staticcheck // as above
		Filter: filter,
		Path:   []*matcherv3.MetadataMatcher_PathSegment{{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: name}}},
		Value:  orValues(ms),
	}}}, nil
}

// grpcHeader refuses, for grpc-go, the header names it rejects in a
// policy (A41: grpc-* and :scheme).
func (t translator) grpcHeader(name string) error {
	if t.o.Target != GRPC {
		return nil
	}
	if n := strings.ToLower(name); strings.HasPrefix(n, "grpc-") || n == ":scheme" {
		return fmt.Errorf("header %q cannot be matched by proxyless gRPC servers", name)
	}
	return nil
}

func authenticated(m *matcherv3.StringMatcher) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m}}}
}

func metadataPrincipal(m *matcherv3.MetadataMatcher) *rbacv3.Principal {
	// metadata: see wholePermission.
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Metadata{Metadata: m}} //nolint:staticcheck // grpc-go refuses sourced_metadata
}

// jwtClaim matches a claim of the verified JWT payload. list: the claim
// may be a list with one matching element, or a matching value (Istio's
// MetadataListValueMatcher with extended JWT claims).
func jwtClaim(claims []string, v *matcherv3.ValueMatcher, list bool) *matcherv3.MetadataMatcher {
	path := []*matcherv3.MetadataMatcher_PathSegment{{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: JWTPayload}}}
	for _, c := range claims {
		path = append(path, &matcherv3.MetadataMatcher_PathSegment{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: c}})
	}
	m := &matcherv3.MetadataMatcher{Filter: JWTFilter, Path: path, Value: v}
	if list {
		m.Value = &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: []*matcherv3.ValueMatcher{
			{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: v}}}},
			v,
		}}}}
	}
	return m
}

// requestPrincipalMatchers match the issuer and subject of an
// "issuer/subject" request principal, with Istio's wildcards: "*" any,
// "*x" a suffix, "x*" a prefix; the issuer ends at the last "/" (it may
// be a URL).
func requestPrincipalMatchers(v string) (iss, sub *matcherv3.StringMatcher) {
	anyValue := regexMatcher(".+")
	i := strings.LastIndex(v, "/")
	found := i >= 0
	is, su := v, ""
	if found {
		is, su = v[:i], v[i+1:]
	}
	switch {
	case v == "*":
		return anyValue, anyValue
	case strings.HasPrefix(v, "*"):
		if !found {
			return anyValue, suffix(strings.TrimPrefix(v, "*"), false)
		}
		if is == "*" {
			return anyValue, exact(su, false)
		}
		return suffix(strings.TrimPrefix(is, "*"), false), exact(su, false)
	case strings.HasSuffix(v, "*"):
		if !found {
			return prefix(strings.TrimSuffix(v, "*"), false), anyValue
		}
		if su == "*" {
			return exact(is, false), anyValue
		}
		return exact(is, false), prefix(strings.TrimSuffix(su, "*"), false)
	}
	return exact(is, false), exact(su, false)
}

func stringOr(vs []string) *matcherv3.ValueMatcher {
	ms := make([]*matcherv3.ValueMatcher, 0, len(vs))
	for _, v := range vs {
		ms = append(ms, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: stringMatcher(v, "")}})
	}
	return orValues(ms)
}

func orValues(ms []*matcherv3.ValueMatcher) *matcherv3.ValueMatcher {
	if len(ms) == 1 {
		return ms[0]
	}
	return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: ms}}}
}

// stringMatcher reads Istio's string wildcards: "*" any non-empty value,
// "*x" a suffix, "x*" a prefix, else exact; pre is prepended to what is
// matched (as "spiffe://" to principals).
func stringMatcher(v, pre string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return regexMatcher(".+")
	case strings.HasPrefix(v, "*"):
		if pre == "" {
			return suffix(v[1:], false)
		}
		return regexMatcher(regexp.QuoteMeta(pre) + ".*" + regexp.QuoteMeta(v[1:]))
	case strings.HasSuffix(v, "*"):
		return prefix(pre+strings.TrimSuffix(v, "*"), false)
	}
	return exact(pre+v, false)
}

// headerMatcher reads Istio's wildcards for a header value: "*" the
// header present, "*x" a suffix, "x*" a prefix, else exact.
func headerMatcher(name, v string, ignoreCase bool) *routev3.HeaderMatcher {
	h := &routev3.HeaderMatcher{Name: name}
	switch {
	case v == "*":
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
		return h
	case strings.HasPrefix(v, "*"):
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: suffix(v[1:], ignoreCase)}
	case strings.HasSuffix(v, "*"):
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: prefix(v[:len(v)-1], ignoreCase)}
	default:
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: exact(v, ignoreCase)}
	}
	return h
}

func exact(s string, ic bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ic, MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
}

func prefix(s string, ic bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ic, MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: s}}
}

func suffix(s string, ic bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ic, MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}}
}

func regexMatcher(re string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

// serviceAccountRegex matches the SPIFFE identities of a service account
// given as "name" (of the policy's namespace) or "namespace/name", as
// Istio's serviceAccountRegex: any trust domain, then /ns/<ns>/, then
// /sa/<name> at the end or before another "/".
func serviceAccountRegex(ns, v string) string {
	sans, sa, ok := strings.Cut(v, "/")
	if !ok {
		sans, sa = ns, v
	}
	return "spiffe://.+/ns/" + regexp.QuoteMeta(sans) + "/(.+/|)sa/" + regexp.QuoteMeta(sa) + "(/.+)?"
}

// trustDomainMatcher matches the SPIFFE identities of a trust domain:
// "*" any, a name exactly, one "*" inside a name any characters but "/".
func trustDomainMatcher(v string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return prefix("spiffe://", false)
	case !strings.Contains(v, "*"):
		return prefix("spiffe://"+v+"/", false)
	}
	before, after, _ := strings.Cut(v, "*")
	return regexMatcher("spiffe://" + regexp.QuoteMeta(before) + "[^/]*" + regexp.QuoteMeta(after) + "/.*")
}

// cidrRange reads an address or a CIDR block.
func cidrRange(v string) (*corev3.CidrRange, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("invalid CIDR %q", v)
		}
		return &corev3.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))}, nil //nolint:gosec // 0..128
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return nil, fmt.Errorf("invalid IP address %q", v)
	}
	return &corev3.CidrRange{AddressPrefix: a.String(), PrefixLen: wrapperspb.UInt32(uint32(a.BitLen()))}, nil //nolint:gosec // 32 or 128
}

// inBrackets reads "[name]".
func inBrackets(s string) (string, error) {
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return "", fmt.Errorf("expecting [<NAME>], found %q", s)
	}
	return s[1 : len(s)-1], nil
}

// nestedNames reads "[a][b]" as a claim path; "[a.b]" (or anything not
// a sequence of bracketed names) as one name, as Istio does.
func nestedNames(s string) ([]string, error) {
	var out []string
	for rest := s; rest != ""; {
		end := strings.IndexByte(rest, ']')
		if rest[0] != '[' || end < 0 || strings.IndexByte(rest[1:end], '[') >= 0 {
			n, err := inBrackets(s)
			if err != nil {
				return nil, err
			}
			return []string{n}, nil
		}
		out = append(out, rest[1:end])
		rest = rest[end+1:]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("expecting [<NAME>], found %q", s)
	}
	return out, nil
}

// withAliases replaces a principal "<td>/ns/<ns>/sa/<sa>" whose trust
// domain is the mesh's, one of its aliases or cluster.local (which names
// the local trust domain, whatever it is) by the same principal in each
// of the mesh's trust domains (Istio's ReplaceTrustDomainAliases).
func (t translator) withAliases(principals []string) []string {
	if len(t.o.TrustDomains) == 0 {
		return principals
	}
	var out []string
	for _, p := range principals {
		parts := strings.Split(p, "/")
		ours := slices.Contains(t.o.TrustDomains, parts[0]) || parts[0] == model.DefaultTrustDomain
		if len(parts) != 5 || parts[0] == "*" || !ours {
			out = appendNew(out, p)
			continue
		}
		for _, td := range t.o.TrustDomains {
			out = appendNew(out, td+"/"+strings.Join(parts[1:], "/"))
		}
	}
	return out
}

// expandTrustDomains replaces a trust domain of the mesh by all of them.
func (t translator) expandTrustDomains(values []string) []string {
	var out []string
	for _, v := range values {
		if slices.Contains(t.o.TrustDomains, v) {
			for _, td := range t.o.TrustDomains {
				out = appendNew(out, td)
			}
			continue
		}
		out = appendNew(out, v)
	}
	return out
}

func appendNew(l []string, s string) []string {
	if slices.Contains(l, s) {
		return l
	}
	return append(l, s)
}

// RoutingClaimPrefix starts a VirtualService header match that matches a
// claim of the request's verified JWT instead of a header (Istio's
// jwt.HeaderJWTClaim): "@request.auth.claims.group.id" or
// "@request.auth.claims[group][id]".
const RoutingClaimPrefix = "@request.auth.claims"

// RoutingClaim reads a header match name as Istio's jwt.ToRoutingClaim
// does: the claim path it names, and whether it names one (the prefix in
// any case, then "." separated names or "[...]" brackets).
func RoutingClaim(name string) ([]string, bool) {
	if len(name) < len(RoutingClaimPrefix) || !strings.EqualFold(name[:len(RoutingClaimPrefix)], RoutingClaimPrefix) {
		return nil, false
	}
	rest := name[len(RoutingClaimPrefix):]
	switch {
	case strings.HasPrefix(rest, ".") && len(rest) > 1:
		return strings.Split(rest[1:], "."), true
	case strings.HasPrefix(rest, "[") && strings.HasSuffix(rest, "]") && len(rest) > 2:
		return strings.Split(rest[1:len(rest)-1], "]["), true
	}
	return nil, false
}

// ClaimMatcher matches a claim of the verified JWT payload against v
// (a list claim matches when one element does), as Istio's
// MetadataMatcherForJWTClaims.
func ClaimMatcher(claims []string, v *matcherv3.ValueMatcher) *matcherv3.MetadataMatcher {
	return jwtClaim(claims, v, true)
}
