package validation

import (
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// unreachableRules reports a VirtualService's rules no request reaches
// and matches an earlier one always takes first, as Istio's
// ValidateVirtualService warns (analyzeUnreachableHTTPRules, ...TCP,
// ...TLS; IST0130 VirtualServiceUnreachableRule, IST0131
// VirtualServiceIneffectiveMatch): a rule after one without matches; a
// rule all of whose matches an earlier rule has; a match an earlier rule
// has (compared without its name); and for HTTP, a URI prefix match that
// an earlier prefix match covers with the same other conditions (Istio's
// genMatchHTTPRoutes and coveredValidation: port, method, authority,
// headers, query parameters and withoutHeaders compared as exact or
// prefix values, a missing method as GET).
func (v *validator) unreachableRules(vs *networking.VirtualService) {
	var prefixes []prefixMatch
	v.unreachable("http", len(vs.GetHttp()), func(i int) (string, []proto.Message, []string) {
		r := vs.GetHttp()[i]
		name := ruleName(r.GetName(), i)
		ms, names := make([]proto.Message, len(r.GetMatch())), make([]string, len(r.GetMatch()))
		for j, m := range r.GetMatch() {
			ms[j], names[j] = m, ruleName(m.GetName(), j)
		}
		return name, ms, names
	}, func(p string, i, j int) {
		m := vs.GetHttp()[i].GetMatch()[j]
		if m.GetUri().GetPrefix() == "" {
			return
		}
		method := exactOrPrefix(m.GetMethod())
		if method == "" {
			method = "exact:GET"
		}
		prefixes = append(prefixes, prefixMatch{
			path: at(field(p, "match"), j), rule: ruleName(vs.GetHttp()[i].GetName(), i), match: ruleName(m.GetName(), j),
			prefix: m.GetUri().GetPrefix(), port: m.GetPort(), method: method, authority: exactOrPrefix(m.GetAuthority()),
			headers: stringMatches(m.GetHeaders()), queryParams: stringMatches(m.GetQueryParams()), withoutHeaders: stringMatches(m.GetWithoutHeaders()),
		})
	})
	v.unreachable("tcp", len(vs.GetTcp()), func(i int) (string, []proto.Message, []string) {
		r := vs.GetTcp()[i]
		ms, names := make([]proto.Message, len(r.GetMatch())), make([]string, len(r.GetMatch()))
		for j, m := range r.GetMatch() {
			ms[j], names[j] = m, ruleName("", j)
		}
		return ruleName("", i), ms, names
	}, nil)
	v.unreachable("tls", len(vs.GetTls()), func(i int) (string, []proto.Message, []string) {
		r := vs.GetTls()[i]
		ms, names := make([]proto.Message, len(r.GetMatch())), make([]string, len(r.GetMatch()))
		for j, m := range r.GetMatch() {
			ms[j], names[j] = m, ruleName("", j)
		}
		return ruleName("", i), ms, names
	}, nil)
	// A later prefix match an earlier one covers (the same prefix is a
	// duplicate, reported above or differing in another condition).
	if len(prefixes) < 2 {
		return
	}
	for i, a := range prefixes {
		for _, b := range prefixes[i+1:] {
			if b.prefix != a.prefix && covers(a, b) {
				v.r.warnc(CodeIneffectiveMatch, b.path, "virtualService rule %s match %s is not used (duplicate/overlapping match in rule %s)",
					b.rule, b.match+" of prefix "+b.prefix, a.match+" of prefix "+a.prefix+" on "+a.rule)
			}
		}
	}
}

// ruleName names a rule or match as Istio's routeName and requestName:
// its name quoted, else #index.
func ruleName(name string, i int) string {
	if name != "" {
		return strconv.Quote(name)
	}
	return "#" + strconv.Itoa(i)
}

// unreachable checks n rules of kind ("http", "tcp", "tls"); rule gives
// the i-th's name, matches and their names; first, when set, is told of
// each match no earlier rule has (at the rule's path).
func (v *validator) unreachable(kind string, n int, rule func(i int) (string, []proto.Message, []string), first func(p string, i, j int)) {
	seen := map[string]int{}
	noMatch := -1
	names := make([]string, n)
	for i := range n {
		p := at("spec."+kind, i)
		name, matches, matchNames := rule(i)
		names[i] = name
		if len(matches) == 0 {
			if noMatch >= 0 {
				v.r.warnc(CodeUnreachableRule, p, "virtualService rule %s not used (only the last rule can have no matches)", name)
			}
			noMatch = i
			continue
		}
		dups := 0
		for j, m := range matches {
			if noMatch >= 0 {
				v.r.warnc(CodeUnreachableRule, p, "virtualService rule %s not used (route without matches defined before)", name)
				continue
			}
			key := matchKey(m)
			if earlier, ok := seen[key]; ok {
				v.r.warnc(CodeIneffectiveMatch, at(field(p, "match"), j), "virtualService rule %s match %s is not used (duplicate/overlapping match in rule %s)", name, matchNames[j], names[earlier])
				dups++
				continue
			}
			seen[key] = i
			if first != nil {
				first(p, i, j)
			}
		}
		if dups == len(matches) {
			v.r.warnc(CodeUnreachableRule, p, "virtualService rule %s not used (all matches used by prior rules)", name)
		}
	}
}

// matchKey compares matches as Istio's asJSON does: an HTTP match without
// its name.
func matchKey(m proto.Message) string {
	if hm, ok := m.(*networking.HTTPMatchRequest); ok && hm.GetName() != "" {
		c := proto.Clone(hm).(*networking.HTTPMatchRequest) //nolint:forcetypeassert // a clone is of its type
		c.Name = ""
		m = c
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// prefixMatch is an HTTP match with a URI prefix, its other conditions as
// Istio's OverlappingMatchValidationForHTTPRoute holds them.
type prefixMatch struct {
	path, rule, match, prefix            string
	port                                 uint32
	method, authority                    string
	headers, queryParams, withoutHeaders map[string]string
}

func exactOrPrefix(s *networking.StringMatch) string {
	switch {
	case s.GetExact() != "":
		return "exact:" + s.GetExact()
	case s.GetPrefix() != "":
		return "prefix:" + s.GetPrefix()
	}
	return ""
}

func stringMatches(m map[string]*networking.StringMatch) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = exactOrPrefix(v)
	}
	return out
}

// covers reports whether a's conditions take every request b's would
// (Istio's coveredValidation, as it compares).
func covers(a, b prefixMatch) bool {
	if !strings.HasPrefix(b.prefix, a.prefix) || a.port != b.port {
		return false
	}
	if a.method != b.method && !strings.HasPrefix(a.method, b.method) {
		return false
	}
	if a.authority != b.authority && !strings.HasPrefix(a.authority, b.authority) {
		return false
	}
	for _, pair := range [][2]map[string]string{{a.headers, b.headers}, {a.queryParams, b.queryParams}, {a.withoutHeaders, b.withoutHeaders}} {
		if len(pair[0]) != len(pair[1]) {
			return false
		}
		for k, av := range pair[0] {
			bv, ok := pair[1][k]
			if !ok || (av != bv && !strings.HasPrefix(av, bv)) {
				return false
			}
		}
	}
	return true
}
