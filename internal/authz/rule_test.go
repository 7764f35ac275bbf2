package authz

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

func TestPathTemplatesCompileToTheRegexEnvoyMatches(t *testing.T) {
	for _, tc := range []struct {
		tmpl  string
		match []string
		miss  []string
	}{
		{"/items/{*}/detail", []string{"/items/42/detail", "/items/a.b~c/detail"}, []string{"/items//detail", "/items/4/2/detail", "/items/42/detail/x"}},
		{"/files/{**}", []string{"/files/", "/files/a", "/files/a/b/c"}, []string{"/files", "/file/a"}},
		{"/{*}/v1/{**}", []string{"/a/v1/", "/a/v1/x/y"}, []string{"/v1/x", "/a/b/v1/x"}},
		{"/a.b/{*}", []string{"/a.b/c"}, []string{"/aXb/c"}},
		{"/x{y}/{*}", []string{"/x{y}/z"}, []string{"/xy/z"}},
	} {
		re := regexp.MustCompile("^(?:" + TemplateRegex(tc.tmpl) + ")$")
		envoy := templateReplacer.Replace(tc.tmpl)
		for _, p := range tc.match {
			if !re.MatchString(p) {
				t.Errorf("%s as %q does not match %q", tc.tmpl, re, p)
			}
			if !strings.Contains(tc.tmpl, "{y}") && !templateMatches(envoy, p) {
				t.Errorf("%s as uri_template %q does not match %q", tc.tmpl, envoy, p)
			}
		}
		for _, p := range tc.miss {
			if re.MatchString(p) || templateMatches(envoy, p) {
				t.Errorf("%s matches %q", tc.tmpl, p)
			}
		}
	}
}

func TestPrincipalsNamingTheLocalTrustDomainMatchEveryAlias(t *testing.T) {
	tr := translator{o: Options{TrustDomains: []string{"example.org", "old.example.org"}}}
	for _, tc := range []struct{ in, want []string }{
		{[]string{"example.org/ns/a/sa/x"}, []string{"example.org/ns/a/sa/x", "old.example.org/ns/a/sa/x"}},
		{[]string{"cluster.local/ns/a/sa/x"}, []string{"example.org/ns/a/sa/x", "old.example.org/ns/a/sa/x"}},
		{[]string{"old.example.org/ns/a/sa/x"}, []string{"example.org/ns/a/sa/x", "old.example.org/ns/a/sa/x"}},
		// Another trust domain, a wildcard trust domain, or not a full
		// identity: as written.
		{[]string{"partner.org/ns/a/sa/x", "*/ns/a/sa/x", "*/sa/x", "example.org/ns/a"}, []string{"partner.org/ns/a/sa/x", "*/ns/a/sa/x", "*/sa/x", "example.org/ns/a"}},
	} {
		if got := tr.withAliases(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%v: got %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := tr.expandTrustDomains([]string{"old.example.org", "partner.org"}); !slices.Equal(got, []string{"example.org", "old.example.org", "partner.org"}) {
		t.Errorf("trust domains: %v", got)
	}
}

func TestClaimKeysReadNestedBracketsAsIstioDoes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{"[groups]", []string{"groups"}, false},
		{"[org][team]", []string{"org", "team"}, false},
		{"[a.b]", []string{"a.b"}, false},
		{"[a[b]", []string{"a[b"}, false},
		{"groups", nil, true},
		{"[]", []string{""}, false},
		{"", nil, true},
	} {
		got, err := nestedNames(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %q, %v", tc.in, got, err)
		}
	}
}

func TestHTTPOnlyFieldsOnTCPDropAnAllowRuleAndNarrowADenyRule(t *testing.T) {
	rule := &security.Rule{
		From: []*security.Rule_From{{Source: &security.Source{Namespaces: []string{"a"}}}},
		To:   []*security.Rule_To{{Operation: &security.Operation{Methods: []string{"DELETE"}, Ports: []string{"80"}}}},
	}
	if _, err := Rule("a", rule, rbacv3.RBAC_ALLOW, Options{Target: TCP}); err == nil {
		t.Fatal("an ALLOW rule with methods was kept on TCP")
	}
	p, err := Rule("a", rule, rbacv3.RBAC_DENY, Options{Target: TCP})
	if err != nil {
		t.Fatal(err)
	}
	// The DENY keeps namespaces and ports, and loses the methods.
	perm := p.GetPermissions()[0].GetAndRules().GetRules()
	if len(perm) != 1 || perm[0].GetOrRules().GetRules()[0].GetDestinationPort() != 80 {
		t.Fatalf("DENY permissions on TCP: %v", p.GetPermissions())
	}
	set := Build([]*model.AuthorizationPolicy{{Name: "p", Namespace: "a", Spec: &security.AuthorizationPolicy{Rules: []*security.Rule{rule}}}}, Options{Target: TCP})
	if len(set.Problems) != 0 || len(set.Allow.Enforce.GetPolicies()) != 0 {
		t.Fatalf("an ALLOW rule dropped on TCP is expected, not a problem: %v %v", set.Problems, set.Allow.Enforce)
	}
}

func TestHeadersGRPCRefusesAreNeverSentToProxylessServers(t *testing.T) {
	rule := &security.Rule{When: []*security.Condition{{Key: "request.headers[grpc-timeout]", Values: []string{"1S"}}}}
	set := Build([]*model.AuthorizationPolicy{
		{Name: "allow", Namespace: "a", Spec: &security.AuthorizationPolicy{Rules: []*security.Rule{rule}}},
		{Name: "deny", Namespace: "a", Spec: &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_DENY, Rules: []*security.Rule{rule}}},
	}, Options{Target: GRPC})
	if len(set.Allow.Enforce.GetPolicies()) != 0 || len(set.Problems) != 1 {
		t.Fatalf("ALLOW: %v, problems %v", set.Allow.Enforce, set.Problems)
	}
	// The DENY rule loses the condition it cannot check: it denies all.
	d := set.Deny.Enforce.GetPolicies()["ns[a]-policy[deny]-rule[0]"]
	if d == nil || !proto.Equal(d.GetPrincipals()[0], &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}}}}}) {
		t.Fatalf("DENY: %v", d)
	}
}

// FuzzRuleNeverPanicsAndBuildsValidRBAC translates a rule made of
// arbitrary values in every field, for every action and target: no
// panic; what comes out passes Envoy's generated validation, its
// regular expressions compile, and a grpc-go policy holds no matcher
// grpc-go refuses.
func FuzzRuleNeverPanicsAndBuildsValidRBAC(f *testing.F) {
	f.Add("a", "request.headers[x-user]", "*", "/items/{*}/detail", "10.0.0.0/8", uint8(0))
	f.Add("", "request.auth.claims[a][b]", "x*", "*", "::1", uint8(1))
	f.Add("ns", "experimental.envoy.filters.a.b[c]", "[v]", "/{**}", "bad", uint8(2))
	f.Add("ns", "source.trustDomain", "a*b", "*.php", "1.2.3.4/33", uint8(7))
	f.Fuzz(func(t *testing.T, ns, key, value, path, ip string, sel uint8) {
		rule := &security.Rule{
			From: []*security.Rule_From{{Source: &security.Source{
				Principals: []string{value}, NotPrincipals: []string{value}, RequestPrincipals: []string{value},
				Namespaces: []string{value}, ServiceAccounts: []string{value}, TrustDomains: []string{value},
				IpBlocks: []string{ip}, RemoteIpBlocks: []string{ip},
			}}},
			To: []*security.Rule_To{{Operation: &security.Operation{
				Hosts: []string{value}, Methods: []string{value}, Paths: []string{path}, NotPaths: []string{path}, Ports: []string{value},
			}}},
			When: []*security.Condition{{Key: key, Values: []string{value}, NotValues: []string{value}}},
		}
		action := []rbacv3.RBAC_Action{rbacv3.RBAC_ALLOW, rbacv3.RBAC_DENY, rbacv3.RBAC_LOG}[int(sel)%3]
		target := []Target{HTTP, TCP, GRPC}[int(sel/3)%3]
		p, err := Rule(ns, rule, action, Options{Target: target, TrustDomains: []string{"cluster.local", "alias"}})
		if err != nil {
			if action != rbacv3.RBAC_ALLOW && !strings.Contains(err.Error(), "unknown attribute") {
				t.Fatalf("a %v rule failed: %v", action, err)
			}
			return
		}
		cfg := &rbachttpv3.RBAC{Rules: &rbacv3.RBAC{Action: action, Policies: map[string]*rbacv3.Policy{"p": p}}}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("invalid RBAC: %v\n%v", err, cfg)
		}
		walk(p.ProtoReflect(), func(m proto.Message) {
			switch x := m.(type) {
			case *matcherv3.RegexMatcher:
				if _, err := regexp.Compile(x.GetRegex()); err != nil {
					t.Fatalf("regex %q: %v", x.GetRegex(), err)
				}
			case *rbacv3.Permission:
				if target == GRPC && x.GetUriTemplate() != nil {
					t.Fatal("a uri_template for grpc-go")
				}
			}
		})
	})
}

// FuzzDecisionsMatchIstio runs the property of
// TestGeneratedRBACDecidesAsIstioDoes from fuzzed seeds.
func FuzzDecisionsMatchIstio(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint8(0))
	f.Fuzz(func(t *testing.T, s1, s2 uint64, tsel uint8) {
		g := gen{r: rand.New(rand.NewPCG(s1, s2))}
		policies := g.policies()
		target := []Target{HTTP, TCP, GRPC}[int(tsel)%3]
		req := g.request(target != TCP)
		if target == GRPC {
			req.jwt = nil
		}
		s := Build(policies, Options{Target: target, TrustDomains: []string{"cluster.local"}})
		want, got := istioAllows(policies, req), envoyAllows(s, req)
		if (target == TCP && got && !want) || (target != TCP && got != want) {
			t.Fatalf("%v: RBAC allows=%v, Istio allows=%v\npolicies: %v\nrequest: %+v", target, got, want, dump(policies), req)
		}
	})
}

func walk(m protoreflect.Message, visit func(proto.Message)) {
	visit(m.Interface())
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				walk(v.List().Get(i).Message(), visit)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				walk(mv.Message(), visit)
				return true
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			walk(v.Message(), visit)
		}
		return true
	})
}
