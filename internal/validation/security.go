package validation

import (
	"net/url"
	"strconv"
	"strings"

	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/jwks"
)

func (v *validator) peerAuthentication() {
	pa := v.obj.Spec.(*security.PeerAuthentication)
	if pa.GetSelector() != nil {
		v.optionalSelector("spec.selector.matchLabels", pa.GetSelector().GetMatchLabels())
	}
	// Istio's CRD: portLevelMtls, when present (even empty), needs a
	// selector with labels, and names at least one port.
	if pa.PortLevelMtls != nil && len(pa.GetSelector().GetMatchLabels()) == 0 {
		v.r.errorf("spec.portLevelMtls", "portLevelMtls needs a workload selector: ports mean nothing namespace- or mesh-wide")
	}
	if pa.PortLevelMtls != nil && len(pa.GetPortLevelMtls()) == 0 {
		v.r.errorf("spec.portLevelMtls", "portLevelMtls must name at least one port")
	}
	for port, m := range pa.GetPortLevelMtls() {
		p := key("spec.portLevelMtls", strconv.FormatUint(uint64(port), 10))
		v.port(p, port)
		if m == nil {
			v.r.errorf(p, "mtls settings are required")
		}
	}
}

func (v *validator) requestAuthentication() {
	ra := v.obj.Spec.(*security.RequestAuthentication)
	v.policyTarget("spec", ra.GetSelector(), ra.GetTargetRef(), ra.GetTargetRefs())
	issuers := map[string]bool{}
	for i, rule := range ra.GetJwtRules() {
		p := at("spec.jwtRules", i)
		if rule.GetIssuer() == "" {
			v.r.errorf(field(p, "issuer"), "issuer is required")
		} else if issuers[rule.GetIssuer()] {
			v.r.errorf(field(p, "issuer"), "issuer %q has two rules", rule.GetIssuer())
		}
		issuers[rule.GetIssuer()] = true
		if u := rule.GetJwksUri(); u != "" {
			parsed, err := url.Parse(u)
			if err != nil || (parsed.Scheme != "https" && parsed.Scheme != "http") || parsed.Host == "" {
				v.r.errorf(field(p, "jwksUri"), "%q must be an http or https URL", u)
			}
		}
		if j := rule.GetJwks(); j != "" {
			if _, err := jwks.Parse([]byte(j)); err != nil {
				v.r.errorf(field(p, "jwks"), "%v", err)
			}
		}
		if rule.GetJwksUri() != "" && rule.GetJwks() != "" {
			v.r.warnf(field(p, "jwks"), "jwks and jwksUri are both set: jwks is used")
		}
		for j, a := range rule.GetAudiences() {
			if a == "" {
				v.r.errorf(at(field(p, "audiences"), j), "must not be empty")
			}
		}
		for j, h := range rule.GetFromHeaders() {
			v.headerName(field(at(field(p, "fromHeaders"), j), "name"), h.GetName())
		}
		for name, vals := range map[string][]string{"fromParams": rule.GetFromParams(), "fromCookies": rule.GetFromCookies(), "spaceDelimitedClaims": rule.GetSpaceDelimitedClaims()} {
			for j, val := range vals {
				if val == "" {
					v.r.errorf(at(field(p, name), j), "must not be empty")
				}
			}
		}
		if h := rule.GetOutputPayloadToHeader(); h != "" {
			v.headerName(field(p, "outputPayloadToHeader"), h)
		}
		for j, c := range rule.GetOutputClaimToHeaders() {
			cp := at(field(p, "outputClaimToHeaders"), j)
			if v.headerName(field(cp, "header"), c.GetHeader()) && (strings.HasPrefix(c.GetHeader(), ":") || strings.EqualFold(c.GetHeader(), "host")) {
				v.r.errorf(field(cp, "header"), "header %q cannot be set from a claim", c.GetHeader())
			}
			if c.GetClaim() == "" {
				v.r.errorf(field(cp, "claim"), "claim is required")
			}
		}
		if rule.GetTimeout() != nil {
			v.duration(field(p, "timeout"), rule.GetTimeout(), minTimeout)
		}
	}
}

func (v *validator) authorizationPolicy() {
	ap := v.obj.Spec.(*security.AuthorizationPolicy)
	v.policyTarget("spec", ap.GetSelector(), ap.GetTargetRef(), ap.GetTargetRefs())
	custom := ap.GetAction() == security.AuthorizationPolicy_CUSTOM
	switch {
	case custom && ap.GetProvider().GetName() == "":
		v.r.errorf("spec.provider.name", "action CUSTOM needs a provider name")
	case !custom && ap.GetProvider() != nil:
		v.r.errorf("spec.provider", "a provider is only used with action CUSTOM")
	}
	if ap.GetAction() == security.AuthorizationPolicy_DENY && len(ap.GetRules()) == 0 {
		v.r.warnf("spec.rules", "a DENY policy without rules denies nothing")
	}
	for i, rule := range ap.GetRules() {
		p := at("spec.rules", i)
		for j, from := range rule.GetFrom() {
			v.source(field(at(field(p, "from"), j), "source"), from.GetSource())
		}
		for j, to := range rule.GetTo() {
			v.operation(field(at(field(p, "to"), j), "operation"), to.GetOperation())
		}
		for j, when := range rule.GetWhen() {
			v.condition(at(field(p, "when"), j), when)
		}
	}
}

func (v *validator) policyTarget(path string, sel *typev1beta1.WorkloadSelector, ref *typev1beta1.PolicyTargetReference, refs []*typev1beta1.PolicyTargetReference) {
	if sel != nil {
		v.selector(field(path, "selector.matchLabels"), sel.GetMatchLabels())
	}
	if sel != nil && (ref != nil || len(refs) > 0) {
		v.r.errorf(field(path, "selector"), "selector cannot be combined with targetRef or targetRefs")
	}
	if ref != nil && len(refs) > 0 {
		v.r.errorf(field(path, "targetRef"), "targetRef and targetRefs cannot both be set")
	}
	all := refs
	if ref != nil {
		all = append([]*typev1beta1.PolicyTargetReference{ref}, refs...)
	}
	for i, r := range all {
		rp := at(field(path, "targetRefs"), i)
		if ref != nil {
			rp = field(path, "targetRef")
		}
		if r.GetKind() == "" || r.GetName() == "" {
			v.r.errorf(rp, "kind and name are required")
		}
		if ns := r.GetNamespace(); ns != "" && ns != v.obj.Meta.Namespace {
			v.r.errorf(field(rp, "namespace"), "a policy can only target objects in its own namespace %q", v.obj.Meta.Namespace)
		}
	}
}

func (v *validator) source(path string, s *security.Source) {
	if s == nil {
		v.r.errorf(path, "source is required in a from entry")
		return
	}
	lists := map[string][]string{
		"principals": s.GetPrincipals(), "notPrincipals": s.GetNotPrincipals(),
		"requestPrincipals": s.GetRequestPrincipals(), "notRequestPrincipals": s.GetNotRequestPrincipals(),
		"namespaces": s.GetNamespaces(), "notNamespaces": s.GetNotNamespaces(),
		"serviceAccounts": s.GetServiceAccounts(), "notServiceAccounts": s.GetNotServiceAccounts(),
		"trustDomains": s.GetTrustDomains(), "notTrustDomains": s.GetNotTrustDomains(),
	}
	ipLists := map[string][]string{
		"ipBlocks": s.GetIpBlocks(), "notIpBlocks": s.GetNotIpBlocks(),
		"remoteIpBlocks": s.GetRemoteIpBlocks(), "notRemoteIpBlocks": s.GetNotRemoteIpBlocks(),
	}
	empty := true
	for name, vals := range lists {
		empty = empty && len(vals) == 0
		for i, val := range vals {
			v.wildcardValue(at(field(path, name), i), val)
		}
	}
	for name, vals := range ipLists {
		empty = empty && len(vals) == 0
		for i, val := range vals {
			v.addressOrCIDR(at(field(path, name), i), val)
		}
	}
	if empty {
		v.r.errorf(path, "a source must set at least one field")
	}
	if len(s.GetServiceAccounts()) > 0 && (len(s.GetPrincipals()) > 0 || len(s.GetNamespaces()) > 0) {
		v.r.errorf(field(path, "serviceAccounts"), "serviceAccounts cannot be combined with principals or namespaces")
	}
}

func (v *validator) operation(path string, o *security.Operation) {
	if o == nil {
		v.r.errorf(path, "operation is required in a to entry")
		return
	}
	lists := map[string][]string{
		"hosts": o.GetHosts(), "notHosts": o.GetNotHosts(),
		"methods": o.GetMethods(), "notMethods": o.GetNotMethods(),
	}
	empty := len(o.GetPorts()) == 0 && len(o.GetNotPorts()) == 0 && len(o.GetPaths()) == 0 && len(o.GetNotPaths()) == 0
	for name, vals := range lists {
		empty = empty && len(vals) == 0
		for i, val := range vals {
			v.wildcardValue(at(field(path, name), i), val)
		}
	}
	for name, ports := range map[string][]string{"ports": o.GetPorts(), "notPorts": o.GetNotPorts()} {
		for i, s := range ports {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 65535 {
				v.r.errorf(at(field(path, name), i), "port %q must be a number between 1 and 65535", s)
			}
		}
	}
	for name, paths := range map[string][]string{"paths": o.GetPaths(), "notPaths": o.GetNotPaths()} {
		for i, p := range paths {
			pp := at(field(path, name), i)
			switch {
			case p != "*" && !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "*"):
				v.r.errorf(pp, "path %q must start with / (or be a * wildcard)", p)
			case strings.Contains(p, "{"):
				v.pathTemplate(pp, p)
			default:
				v.wildcardValue(pp, p)
			}
		}
	}
	if empty {
		v.r.errorf(path, "an operation must set at least one field")
	}
}

// pathTemplate checks an AuthorizationPolicy path template (Istio 1.20+):
// segments are literals, {*} (one segment) or {**} (any number of
// segments).
func (v *validator) pathTemplate(path, p string) {
	for _, seg := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if seg == "{*}" || seg == "{**}" {
			continue
		}
		if strings.ContainsAny(seg, "{}*") {
			v.r.errorf(path, "path template %q: segment %q must be {*}, {**} or a literal without *, { or }", p, seg)
			return
		}
	}
}

// wildcardValue checks Istio's string matching: "*" alone, or as a prefix
// or suffix only.
func (v *validator) wildcardValue(path, s string) {
	if s == "" {
		v.r.errorf(path, "must not be empty")
		return
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(s, "*"), "*")
	if strings.Contains(inner, "*") || (strings.HasPrefix(s, "*") && strings.HasSuffix(s, "*") && s != "*") {
		v.r.errorf(path, "%q: * is only allowed alone, as a prefix or as a suffix", s)
	}
}

// conditionKeys are the keys AuthorizationPolicy "when" conditions take;
// those ending in [] take a name in brackets.
func knownConditionKey(k string) bool {
	switch k {
	case "source.ip", "remote.ip", "source.namespace", "source.principal", "source.serviceAccount", "source.trustDomain",
		"request.auth.principal", "request.auth.audiences", "request.auth.presenter",
		"destination.ip", "destination.port", "connection.sni":
		return true
	}
	for _, prefix := range []string{"request.headers[", "request.auth.claims[", "request.experimental.envoy.filters."} {
		if strings.HasPrefix(k, prefix) {
			return !strings.HasSuffix(prefix, "[") || (strings.HasSuffix(k, "]") && len(k) > len(prefix)+1)
		}
	}
	return strings.HasPrefix(k, "experimental.envoy.filters.")
}

func (v *validator) condition(path string, c *security.Condition) {
	if !knownConditionKey(c.GetKey()) {
		v.r.errorf(field(path, "key"), "unknown condition key %q (e.g. request.headers[x-user], source.ip, request.auth.claims[iss])", c.GetKey())
	}
	if len(c.GetValues()) == 0 && len(c.GetNotValues()) == 0 {
		v.r.errorf(path, "values or notValues is required")
	}
	checkIP := c.GetKey() == "source.ip" || c.GetKey() == "remote.ip" || c.GetKey() == "destination.ip"
	for name, vals := range map[string][]string{"values": c.GetValues(), "notValues": c.GetNotValues()} {
		for i, val := range vals {
			p := at(field(path, name), i)
			switch {
			case checkIP:
				v.addressOrCIDR(p, val)
			case c.GetKey() == "destination.port":
				if n, err := strconv.Atoi(val); err != nil || n < 1 || n > 65535 {
					v.r.errorf(p, "port %q must be a number between 1 and 65535", val)
				}
			default:
				v.wildcardValue(p, val)
			}
		}
	}
}
