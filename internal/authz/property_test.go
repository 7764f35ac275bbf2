package authz

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// This file decides requests the way Istio's AuthorizationPolicy
// reference describes it, from the policies themselves: DENY before
// ALLOW, an ALLOW policy present means only what some ALLOW rule matches
// is allowed, AUDIT and dry-run policies enforce nothing; a rule matches
// when any of its sources (or none listed), any of its operations (or
// none listed) and all its conditions match; a field matches when one of
// its values does and none of its notValues.
//
// On a TCP connection Istio cannot read request attributes: an ALLOW rule
// that names one matches nothing there, and a DENY rule is read without
// them, so the decision is the strictest one the written policy allows.

// istioAllows decides a request by Istio's semantics.
func istioAllows(policies []*model.AuthorizationPolicy, r request) bool {
	hasAllow, allowed := false, false
	for _, ap := range policies {
		if ap.DryRun {
			continue
		}
		switch ap.Spec.GetAction() {
		case security.AuthorizationPolicy_DENY:
			for _, rule := range ap.Spec.GetRules() {
				if ruleMatches(ap.Namespace, rule, r, false) {
					return false
				}
			}
		case security.AuthorizationPolicy_ALLOW:
			hasAllow = true
			for _, rule := range ap.Spec.GetRules() {
				if ruleMatches(ap.Namespace, rule, r, true) {
					allowed = true
				}
			}
		default:
		}
	}
	return !hasAllow || allowed
}

// ruleMatches: allow says how a request attribute on a TCP connection
// reads (no match in ALLOW rules, ignored in DENY rules).
func ruleMatches(ns string, rule *security.Rule, r request, allow bool) bool {
	f := fieldReader{ns: ns, r: r, allow: allow}
	fromOK := len(rule.GetFrom()) == 0
	for _, from := range rule.GetFrom() {
		s := from.GetSource()
		if f.field(s.GetPrincipals(), s.GetNotPrincipals(), f.principal) &&
			f.field(s.GetRequestPrincipals(), s.GetNotRequestPrincipals(), f.requestPrincipal) &&
			f.field(s.GetNamespaces(), s.GetNotNamespaces(), f.namespace) &&
			f.field(s.GetServiceAccounts(), s.GetNotServiceAccounts(), f.serviceAccount) &&
			f.field(s.GetTrustDomains(), s.GetNotTrustDomains(), f.trustDomain) &&
			f.field(s.GetIpBlocks(), s.GetNotIpBlocks(), f.ip(r.directIP)) &&
			f.field(s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), f.ip(r.remoteIP)) {
			fromOK = true
		}
	}
	toOK := len(rule.GetTo()) == 0
	for _, to := range rule.GetTo() {
		o := to.GetOperation()
		if f.field(o.GetHosts(), o.GetNotHosts(), f.host) &&
			f.field(o.GetMethods(), o.GetNotMethods(), f.method) &&
			f.field(o.GetPaths(), o.GetNotPaths(), f.path) &&
			f.field(o.GetPorts(), o.GetNotPorts(), f.port) {
			toOK = true
		}
	}
	whenOK := true
	for _, c := range rule.GetWhen() {
		if !f.field(c.GetValues(), c.GetNotValues(), f.condition(c.GetKey())) {
			whenOK = false
		}
	}
	return fromOK && toOK && whenOK
}

type fieldReader struct {
	ns    string
	r     request
	allow bool
}

// unknown is what an attribute the connection cannot tell reads as.
var errUnknown = fmt.Errorf("unknown on this connection")

// field: one of values matches (when there are any) and none of
// notValues. An attribute the connection cannot tell makes the field
// false in an ALLOW rule and true (ignored) in a DENY rule.
func (f fieldReader) field(values, notValues []string, match func(string) (bool, error)) bool {
	if len(values) > 0 {
		any := false
		for _, v := range values {
			m, err := match(v)
			if err != nil {
				return !f.allow
			}
			any = any || m
		}
		if !any {
			return false
		}
	}
	for _, v := range notValues {
		m, err := match(v)
		if err != nil {
			return !f.allow
		}
		if m {
			return false
		}
	}
	return true
}

// wild is Istio's string matching: "*" any non-empty value, "*x" a
// suffix, "x*" a prefix, else exact.
func wild(pattern, v string) bool {
	switch {
	case pattern == "*":
		return v != ""
	case strings.HasPrefix(pattern, "*"):
		return strings.HasSuffix(v, pattern[1:])
	case strings.HasSuffix(pattern, "*"):
		return strings.HasPrefix(v, strings.TrimSuffix(pattern, "*"))
	}
	return v == pattern
}

// identity splits the peer's "spiffe://<td>/ns/<ns>/sa/<sa>".
func (f fieldReader) identity() (td, ns, sa string, ok bool) {
	rest, found := strings.CutPrefix(f.r.peer, "spiffe://")
	parts := strings.Split(rest, "/")
	if !found || len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" {
		return "", "", "", false
	}
	return parts[0], parts[2], parts[4], true
}

func (f fieldReader) principal(v string) (bool, error) {
	p := strings.TrimPrefix(f.r.peer, "spiffe://")
	return f.r.peer != "" && wild(v, p), nil
}

func (f fieldReader) namespace(v string) (bool, error) {
	_, ns, _, ok := f.identity()
	if !ok {
		return false, nil
	}
	// Istio: "*" inside a namespace matches any characters.
	re := strings.ReplaceAll(v, "*", "\x00")
	return globMatch(re, ns), nil
}

func (f fieldReader) serviceAccount(v string) (bool, error) {
	_, ns, sa, ok := f.identity()
	want, name, qualified := strings.Cut(v, "/")
	if !qualified {
		want, name = f.ns, v
	}
	return ok && ns == want && sa == name, nil
}

func (f fieldReader) trustDomain(v string) (bool, error) {
	td, _, _, ok := f.identity()
	if !ok {
		return false, nil
	}
	if v == "*" {
		return true, nil
	}
	return globMatch(strings.Replace(v, "*", "\x00", 1), td), nil
}

func (f fieldReader) ip(a netip.Addr) func(string) (bool, error) {
	return func(v string) (bool, error) {
		if p, err := netip.ParsePrefix(v); err == nil {
			return p.Contains(a), nil
		}
		return netip.MustParseAddr(v) == a, nil
	}
}

func (f fieldReader) httpOnly() error {
	if !f.r.http {
		return errUnknown
	}
	return nil
}

func (f fieldReader) host(v string) (bool, error) {
	if err := f.httpOnly(); err != nil {
		return false, err
	}
	return wild(strings.ToLower(v), strings.ToLower(f.r.host)), nil
}

func (f fieldReader) method(v string) (bool, error) {
	if err := f.httpOnly(); err != nil {
		return false, err
	}
	return wild(v, f.r.method), nil
}

func (f fieldReader) path(v string) (bool, error) {
	if err := f.httpOnly(); err != nil {
		return false, err
	}
	p := strings.SplitN(f.r.path, "?", 2)[0]
	if IsPathTemplate(v) {
		return templateMatches(templateReplacer.Replace(v), p), nil
	}
	return wild(v, p), nil
}

func (f fieldReader) port(v string) (bool, error) {
	return fmt.Sprint(f.r.destPort) == v, nil
}

func (f fieldReader) requestPrincipal(v string) (bool, error) {
	if err := f.httpOnly(); err != nil {
		return false, err
	}
	iss, _ := f.r.jwt["iss"].(string)
	sub, _ := f.r.jwt["sub"].(string)
	if f.r.jwt == nil || iss == "" || sub == "" {
		return false, nil
	}
	return wild(v, iss+"/"+sub), nil
}

// claim: a string claim matches the value, a list claim by one of its
// elements.
func (f fieldReader) claim(path []string, v string) (bool, error) {
	if err := f.httpOnly(); err != nil {
		return false, err
	}
	var x any = f.r.jwt
	for _, k := range path {
		m, ok := x.(map[string]any)
		if !ok {
			return false, nil
		}
		x = m[k]
	}
	switch c := x.(type) {
	case string:
		return wild(v, c), nil
	case []any:
		for _, e := range c {
			if s, ok := e.(string); ok && wild(v, s) {
				return true, nil
			}
		}
	}
	return false, nil
}

func (f fieldReader) condition(key string) func(string) (bool, error) {
	switch {
	case key == "source.ip":
		return f.ip(f.r.directIP)
	case key == "remote.ip":
		return f.ip(f.r.remoteIP)
	case key == "source.namespace":
		return f.namespace
	case key == "source.principal":
		return f.principal
	case key == "source.serviceAccount":
		return f.serviceAccount
	case key == "source.trustDomain":
		return f.trustDomain
	case key == "request.auth.principal":
		return f.requestPrincipal
	case key == "request.auth.audiences":
		return func(v string) (bool, error) { return f.claim([]string{"aud"}, v) }
	case key == "destination.ip":
		return f.ip(f.r.destIP)
	case key == "destination.port":
		return f.port
	case key == "connection.sni":
		return func(v string) (bool, error) { return wild(v, f.r.sni), nil }
	case strings.HasPrefix(key, "request.headers["):
		name := strings.TrimSuffix(strings.TrimPrefix(key, "request.headers["), "]")
		return func(v string) (bool, error) {
			if err := f.httpOnly(); err != nil {
				return false, err
			}
			h, ok := f.r.headers[name]
			if v == "*" {
				return ok, nil
			}
			return ok && wild(v, h), nil
		}
	case strings.HasPrefix(key, "request.auth.claims["):
		path := strings.Split(strings.TrimSuffix(strings.TrimPrefix(key, "request.auth.claims["), "]"), "][")
		return func(v string) (bool, error) { return f.claim(path, v) }
	}
	panic("no such key " + key)
}

// globMatch matches s against p, where NUL stands for any run of
// characters.
func globMatch(p, s string) bool {
	parts := strings.Split(p, "\x00")
	if len(parts) == 1 {
		return p == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// gen draws policies and requests from small vocabularies, so that
// values often match.
type gen struct{ r *rand.Rand }

func (g gen) pick(vs ...string) string { return vs[g.r.IntN(len(vs))] }

func (g gen) some(vs ...string) []string {
	if g.r.IntN(3) == 0 {
		return nil
	}
	var out []string
	for range 1 + g.r.IntN(2) {
		out = append(out, g.pick(vs...))
	}
	return out
}

var (
	principals   = []string{"cluster.local/ns/a/sa/x", "cluster.local/ns/b/sa/y", "*", "*/sa/x", "cluster.local/ns/a/*", "other.td/ns/a/sa/x"}
	namespaces   = []string{"a", "b", "*", "a*", "*b"}
	accounts     = []string{"x", "a/x", "b/y", "b/x"}
	trustDomains = []string{"cluster.local", "other.td", "*", "*.td"}
	ipBlocks     = []string{"10.0.0.0/8", "10.1.2.3", "192.168.0.0/16", "10.1.0.0/16"}
	hosts        = []string{"cart.a.svc", "*.example.com", "*", "CART.A.SVC", "api.*"}
	methods      = []string{"GET", "POST", "DELETE", "*", "P*"}
	paths        = []string{"/api/*", "*.php", "/items/{*}/detail", "/x", "*", "/files/{**}", "/"}
	ports        = []string{"80", "8080", "5432"}
	reqPrincs    = []string{"https://a.example.com/alice", "https://a.example.com/*", "*", "*/bob", "https://b.example.com/bob"}
	whenKeys     = []string{
		"request.headers[x-user]", "source.ip", "remote.ip", "source.namespace", "source.principal",
		"source.serviceAccount", "request.auth.principal", "request.auth.audiences", "request.auth.claims[groups]",
		"request.auth.claims[org][team]", "destination.ip", "destination.port", "connection.sni",
	}
)

func (g gen) whenValues(key string) []string {
	switch key {
	case "request.headers[x-user]":
		return g.some("alice", "bob*", "*", "*ce")
	case "source.ip", "remote.ip", "destination.ip":
		return g.some(ipBlocks...)
	case "source.namespace":
		return g.some(namespaces...)
	case "source.principal":
		return g.some(principals...)
	case "source.serviceAccount":
		return g.some(accounts...)
	case "request.auth.principal":
		return g.some(reqPrincs...)
	case "request.auth.audiences":
		return g.some("web", "api", "*")
	case "request.auth.claims[groups]":
		return g.some("admins", "dev*", "*")
	case "request.auth.claims[org][team]":
		return g.some("blue", "red")
	case "destination.port":
		return g.some(ports...)
	case "connection.sni":
		return g.some("cart.a.svc", "*.example.com")
	}
	panic(key)
}

func (g gen) rule() *security.Rule {
	r := &security.Rule{}
	for range g.r.IntN(3) {
		s := &security.Source{}
		switch g.r.IntN(8) {
		case 0:
			s.Principals, s.NotPrincipals = g.some(principals...), g.some(principals...)
		case 1:
			s.Namespaces, s.NotNamespaces = g.some(namespaces...), g.some(namespaces...)
		case 2:
			s.ServiceAccounts, s.NotServiceAccounts = g.some(accounts...), g.some(accounts...)
		case 3:
			s.TrustDomains, s.NotTrustDomains = g.some(trustDomains...), g.some(trustDomains...)
		case 4:
			s.IpBlocks, s.NotIpBlocks = g.some(ipBlocks...), g.some(ipBlocks...)
		case 5:
			s.RemoteIpBlocks, s.NotRemoteIpBlocks = g.some(ipBlocks...), g.some(ipBlocks...)
		case 6:
			s.RequestPrincipals, s.NotRequestPrincipals = g.some(reqPrincs...), g.some(reqPrincs...)
		default:
			s.Principals, s.Namespaces, s.NotIpBlocks = g.some(principals...), g.some(namespaces...), g.some(ipBlocks...)
		}
		r.From = append(r.From, &security.Rule_From{Source: s})
	}
	for range g.r.IntN(3) {
		o := &security.Operation{}
		o.Hosts, o.NotHosts = g.some(hosts...), g.some(hosts...)
		o.Methods, o.NotMethods = g.some(methods...), g.some(methods...)
		o.Paths, o.NotPaths = g.some(paths...), g.some(paths...)
		o.Ports, o.NotPorts = g.some(ports...), g.some(ports...)
		r.To = append(r.To, &security.Rule_To{Operation: o})
	}
	for range g.r.IntN(3) {
		k := g.pick(whenKeys...)
		c := &security.Condition{Key: k, Values: g.whenValues(k), NotValues: g.whenValues(k)}
		if len(c.Values)+len(c.NotValues) > 0 {
			r.When = append(r.When, c)
		}
	}
	return r
}

func (g gen) policies() []*model.AuthorizationPolicy {
	var out []*model.AuthorizationPolicy
	for i := range 1 + g.r.IntN(4) {
		ap := &model.AuthorizationPolicy{Name: fmt.Sprintf("p%d", i), Namespace: g.pick("a", "b"), Spec: &security.AuthorizationPolicy{}}
		ap.Spec.Action = []security.AuthorizationPolicy_Action{
			security.AuthorizationPolicy_ALLOW, security.AuthorizationPolicy_DENY, security.AuthorizationPolicy_AUDIT,
		}[g.r.IntN(3)]
		ap.DryRun = g.r.IntN(8) == 0
		for range g.r.IntN(3) {
			ap.Spec.Rules = append(ap.Spec.Rules, g.rule())
		}
		out = append(out, ap)
	}
	return out
}

func (g gen) request(http bool) request {
	r := request{
		peer:     g.pick("spiffe://cluster.local/ns/a/sa/x", "spiffe://cluster.local/ns/b/sa/y", "spiffe://other.td/ns/a/sa/x", "spiffe://cluster.local/ns/ab/sa/x", ""),
		directIP: netip.MustParseAddr(g.pick("10.1.2.3", "10.9.9.9", "192.168.1.1", "172.16.0.1")),
		remoteIP: netip.MustParseAddr(g.pick("10.1.2.3", "192.168.1.1", "8.8.8.8")),
		destIP:   netip.MustParseAddr(g.pick("10.1.2.3", "10.2.0.1")),
		destPort: uint32([]int{80, 8080, 5432}[g.r.IntN(3)]),
		sni:      g.pick("", "cart.a.svc", "x.example.com"),
		http:     http,
	}
	if !http {
		return r
	}
	r.method = g.pick("GET", "POST", "DELETE", "PUT")
	r.host = g.pick("cart.a.svc", "Cart.A.svc", "www.example.com", "api.internal")
	r.path = g.pick("/api/v1", "/index.php", "/items/42/detail", "/items//detail", "/x", "/x?y=1", "/files/", "/files/a/b", "/files", "/")
	r.headers = map[string]string{}
	if u := g.pick("", "alice", "bobby", "grace"); u != "" {
		r.headers["x-user"] = u
	}
	if g.r.IntN(3) > 0 {
		r.jwt = map[string]any{
			"iss":    g.pick("https://a.example.com", "https://b.example.com"),
			"sub":    g.pick("alice", "bob"),
			"aud":    []any{g.pick("web", "api", "other")},
			"groups": []any{g.pick("admins", "devops", "users")},
			"org":    map[string]any{"team": g.pick("blue", "red")},
		}
		if g.r.IntN(2) == 0 {
			r.jwt["aud"] = g.pick("web", "api")
		}
	}
	return r
}

// TestGeneratedRBACDecidesAsIstioDoes draws random policies and requests
// and decides each request twice: by Istio's semantics from the policies,
// and by Envoy's RBAC semantics from the translation. On HTTP (Envoy's
// filter, and grpc-go's on requests without a token, which it cannot
// verify) the decisions are equal; on TCP the translation never allows
// what Istio's semantics denies.
func TestGeneratedRBACDecidesAsIstioDoes(t *testing.T) {
	g := gen{r: rand.New(rand.NewPCG(1, 2))}
	counts := map[string]int{}
	for i := range 20000 {
		policies := g.policies()
		target := []Target{HTTP, TCP, GRPC}[i%3]
		req := g.request(target != TCP)
		if target == GRPC {
			req.jwt = nil
		}
		s := Build(policies, Options{Target: target, TrustDomains: []string{"cluster.local"}})
		want, got := istioAllows(policies, req), envoyAllows(s, req)
		counts[fmt.Sprintf("%v allow=%v", target, want)]++
		switch {
		case target == TCP && got && !want:
			t.Fatalf("case %d: on TCP the RBAC allows what Istio denies\npolicies: %v\nrequest: %+v\nproblems: %v", i, dump(policies), req, s.Problems)
		case target != TCP && got != want:
			t.Fatalf("case %d (%v): RBAC allows=%v, Istio allows=%v\npolicies: %v\nrequest: %+v\nproblems: %v", i, target, got, want, dump(policies), req, s.Problems)
		}
	}
	// Both decisions are common, so the property is not vacuous.
	for _, target := range []Target{HTTP, TCP, GRPC} {
		for _, allow := range []bool{true, false} {
			if n := counts[fmt.Sprintf("%v allow=%v", target, allow)]; n < 500 {
				t.Errorf("only %d cases of target %v allow=%v", n, target, allow)
			}
		}
	}
}

func dump(ps []*model.AuthorizationPolicy) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "\n  %s/%s dryRun=%v %v", p.Namespace, p.Name, p.DryRun, p.Spec)
	}
	return b.String()
}
