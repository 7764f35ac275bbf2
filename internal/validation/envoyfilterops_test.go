package validation

import (
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// The cases of Istio's EnvoyPatchAnalyzer tests (analyzers_test.go:
// EnvoyFilterUsesRelativeOperation, ...UsesAbsoluteOperation,
// ...UsesReplaceOperation, ...UsesAddOperation, ...UsesRemoveOperation),
// one patch each: an operation that is ignored where it is applied is an
// error of analysis (galley still admits the filter, as Istio's webhook
// does), a relative one without a priority a warning.
func TestEnvoyFilterOperationsIstioWarnsAboutAreReportedOnThePatch(t *testing.T) {
	const filterValue = `{name: envoy.lua, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua}}`
	for name, tc := range map[string]struct {
		applyTo, op, priority, proxyVersion, value string
		want                                       []Code
	}{
		"INSERT_BEFORE without a priority":            {applyTo: "HTTP_FILTER", op: "INSERT_BEFORE", value: filterValue, want: []Code{CodeEnvoyFilterRelativeOperation}},
		"INSERT_AFTER without a priority":             {applyTo: "HTTP_FILTER", op: "INSERT_AFTER", value: filterValue, want: []Code{CodeEnvoyFilterRelativeOperation}},
		"INSERT_BEFORE with a priority":               {applyTo: "HTTP_FILTER", op: "INSERT_BEFORE", priority: "10", value: filterValue},
		"INSERT_BEFORE with a negative priority":      {applyTo: "HTTP_FILTER", op: "INSERT_BEFORE", priority: "-1", value: filterValue},
		"INSERT_FIRST, absolute":                      {applyTo: "HTTP_FILTER", op: "INSERT_FIRST", value: filterValue},
		"ADD of a filter, absolute":                   {applyTo: "HTTP_FILTER", op: "ADD", value: filterValue},
		"REPLACE of an HTTP filter without priority":  {applyTo: "HTTP_FILTER", op: "REPLACE", value: filterValue, want: []Code{CodeEnvoyFilterRelativeOperation}},
		"REPLACE with a proxyVersion, no priority":    {applyTo: "HTTP_FILTER", op: "REPLACE", proxyVersion: `^1\.32.*`, value: filterValue, want: []Code{CodeEnvoyFilterRelativeOperation}},
		"REPLACE of a cluster":                        {applyTo: "CLUSTER", op: "REPLACE", value: `{name: c}`, want: []Code{CodeEnvoyFilterReplaceIgnored}},
		"REPLACE of a listener, even with a priority": {applyTo: "LISTENER", op: "REPLACE", priority: "3", value: `{name: l}`, want: []Code{CodeEnvoyFilterReplaceIgnored}},
		"ADD to a route configuration":                {applyTo: "ROUTE_CONFIGURATION", op: "ADD", value: `{name: r}`, want: []Code{CodeEnvoyFilterAddIgnored}},
		"ADD of an HTTP route":                        {applyTo: "HTTP_ROUTE", op: "ADD", value: `{name: r}`, want: []Code{CodeEnvoyFilterAddIgnored}},
		"REMOVE of a route configuration":             {applyTo: "ROUTE_CONFIGURATION", op: "REMOVE", want: []Code{CodeEnvoyFilterRemoveIgnored}},
		"REMOVE of an HTTP route":                     {applyTo: "HTTP_ROUTE", op: "REMOVE", want: []Code{CodeEnvoyFilterRemoveIgnored}},
		"REMOVE of a filter without a priority":       {applyTo: "NETWORK_FILTER", op: "REMOVE", want: []Code{CodeEnvoyFilterRelativeOperation}},
		"REMOVE of a cluster with a priority":         {applyTo: "CLUSTER", op: "REMOVE", priority: "1"},
		"MERGE, absolute":                             {applyTo: "CLUSTER", op: "MERGE", value: `{connect_timeout: 1s}`},
	} {
		doc := "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: f, namespace: bookinfo}\nspec:\n"
		if tc.priority != "" {
			doc += "  priority: " + tc.priority + "\n"
		}
		doc += "  configPatches:\n  - applyTo: " + tc.applyTo + "\n"
		if tc.proxyVersion != "" {
			doc += "    match: {proxy: {proxyVersion: '" + tc.proxyVersion + "'}}\n"
		}
		doc += "    patch:\n      operation: " + tc.op + "\n"
		if tc.value != "" {
			doc += "      value: " + tc.value + "\n"
		}
		d := istio.Decode("ef.yaml", []byte(doc), "bookinfo")[0]
		if d.Err != nil {
			t.Fatalf("%s: %v", name, d.Err)
		}
		res := Validate(d.Object, nil)
		if !res.OK() {
			t.Errorf("%s: rejected: %v", name, res.Errors)
			continue
		}
		var got []Code
		for _, w := range res.Warnings {
			if w.Code == CodeEnvoyFilter {
				continue
			}
			got = append(got, w.Code)
			if w.Path != "spec.configPatches[0].patch.operation" {
				t.Errorf("%s: %s at %q, want the patch's operation", name, w.Code, w.Path)
			}
			if w.Code == CodeEnvoyFilterRelativeOperation && (tc.proxyVersion != "") != strings.Contains(w.Message, "proxyVersion") {
				t.Errorf("%s: %q names the proxyVersion match only when there is one", name, w.Message)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", name, got, tc.want)
		}
	}
}
