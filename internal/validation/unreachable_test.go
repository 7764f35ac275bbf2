package validation

import (
	"slices"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// Istio's cases (pkg/config/validation's TestValidateVirtualService
// warnings and analyzeUnreachableHTTPRules), with the messages
// ValidateVirtualService gives.
func TestRulesNoRequestReachesAreWarnedAboutAsIstioWarns(t *testing.T) {
	for name, tc := range map[string]struct {
		http, tcp string
		want      []string
	}{
		"a rule after one without matches": {
			http: `[{route: [{destination: {host: a}}]}, {route: [{destination: {host: b}}]}]`,
			want: []string{"FLT0107 spec.http[1]: virtualService rule #1 not used (only the last rule can have no matches)"},
		},
		"a match after a rule without matches": {
			http: `[{name: all, route: [{destination: {host: a}}]}, {name: late, match: [{uri: {exact: /x}}], route: [{destination: {host: b}}]}]`,
			want: []string{`FLT0107 spec.http[1]: virtualService rule "late" not used (route without matches defined before)`},
		},
		"every match an earlier rule's": {
			http: `[{name: first, match: [{uri: {exact: /x}}, {uri: {exact: /y}}], route: [{destination: {host: a}}]}, {match: [{name: again, uri: {exact: /y}}], route: [{destination: {host: b}}]}]`,
			want: []string{
				"FLT0107 spec.http[1]: virtualService rule #1 not used (all matches used by prior rules)",
				`FLT0108 spec.http[1].match[0]: virtualService rule #1 match "again" is not used (duplicate/overlapping match in rule "first")`,
			},
		},
		"one match of two an earlier rule's": {
			http: `[{match: [{uri: {exact: /x}}], route: [{destination: {host: a}}]}, {match: [{uri: {exact: /x}}, {uri: {exact: /z}}], route: [{destination: {host: b}}]}]`,
			want: []string{"FLT0108 spec.http[1].match[0]: virtualService rule #1 match #0 is not used (duplicate/overlapping match in rule #0)"},
		},
		"a prefix an earlier prefix covers": {
			http: `[{name: debug, match: [{uri: {prefix: /debug}}], route: [{destination: {host: a}}]}, {name: debugs, match: [{uri: {prefix: /debugs}}], route: [{destination: {host: b}}]}]`,
			want: []string{`FLT0108 spec.http[1].match[0]: virtualService rule "debugs" match #0 of prefix /debugs is not used (duplicate/overlapping match in rule #0 of prefix /debug on "debug")`},
		},
		"a longer prefix first, then a shorter: both reached": {
			http: `[{match: [{uri: {prefix: /debugs}}], route: [{destination: {host: a}}]}, {match: [{uri: {prefix: /debug}}], route: [{destination: {host: b}}]}]`,
		},
		"a prefix with another header than the earlier prefix's: reached": {
			http: `[{match: [{uri: {prefix: /debug}, headers: {x: {exact: "1"}}}], route: [{destination: {host: a}}]}, {match: [{uri: {prefix: /debugs}, headers: {x: {exact: "2"}}}], route: [{destination: {host: b}}]}]`,
		},
		"a prefix on another port than the earlier prefix's: reached": {
			http: `[{match: [{uri: {prefix: /debug}, port: 80}], route: [{destination: {host: a}}]}, {match: [{uri: {prefix: /debugs}, port: 8080}], route: [{destination: {host: b}}]}]`,
		},
		"tcp: a rule after one without matches, a repeated port": {
			tcp: `[{match: [{port: 9000}], route: [{destination: {host: a}}]}, {match: [{port: 9000}], route: [{destination: {host: b}}]}, {route: [{destination: {host: c}}]}, {route: [{destination: {host: d}}]}]`,
			want: []string{
				"FLT0107 spec.tcp[1]: virtualService rule #1 not used (all matches used by prior rules)",
				"FLT0108 spec.tcp[1].match[0]: virtualService rule #1 match #0 is not used (duplicate/overlapping match in rule #0)",
				"FLT0107 spec.tcp[3]: virtualService rule #3 not used (only the last rule can have no matches)",
			},
		},
	} {
		doc := "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\nspec:\n  hosts: [reviews]\n"
		if tc.http != "" {
			doc += "  http: " + tc.http + "\n"
		}
		if tc.tcp != "" {
			doc += "  tcp: " + tc.tcp + "\n"
		}
		res := Validate(istio.Decode("vs.yaml", []byte(doc), "default")[0].Object, nil)
		if !res.OK() {
			t.Errorf("%s: errors %v", name, res.Errors)
			continue
		}
		var got []string
		for _, w := range res.Warnings {
			got = append(got, string(w.Code)+" "+w.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n got %q\nwant %q", name, got, tc.want)
		}
	}
}
