package gatewayapi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	gw "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
)

// FuzzConvertNeverPanicsAndStaysWithinItsInput converts routes and
// Gateways decoded from arbitrary YAML next to the golden cases' cluster:
// whatever the objects say, Convert returns, every object it produces is
// a Gateway or VirtualService of a namespace it was given, and every
// status it produces is for an object it was given.
func FuzzConvertNeverPanicsAndStaysWithinItsInput(f *testing.F) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	base, err := os.ReadFile("testdata/http.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		in := decodeInput(t, base)
		var route gw.HTTPRoute
		if yaml.Unmarshal(doc, &route) == nil {
			in.HTTPRoutes = append(in.HTTPRoutes, &route)
		}
		var g gw.Gateway
		if yaml.Unmarshal(doc, &g) == nil {
			in.Gateways = append(in.Gateways, &g)
		}
		var tls gw.TLSRoute
		if yaml.Unmarshal(doc, &tls) == nil {
			in.TLSRoutes = append(in.TLSRoutes, &tls)
		}
		namespaces := map[string]bool{}
		for _, o := range in.Gateways {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.HTTPRoutes {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.TLSRoutes {
			namespaces[o.Namespace] = true
		}
		out := gatewayapi.Convert(in)
		for _, o := range out.Objects {
			if o.Kind.Kind != "Gateway" && o.Kind.Kind != "VirtualService" {
				t.Fatalf("produced a %s", o.Kind.Kind)
			}
			if !namespaces[o.Meta.Namespace] {
				t.Fatalf("produced %s in namespace %q, which no input has", o, o.Meta.Namespace)
			}
			// A "~", which no Kubernetes object's name can hold.
			if !strings.Contains(o.Meta.Name, "~") {
				t.Fatalf("produced %s, whose name a user's object could have", o)
			}
		}
		for ref := range out.Routes {
			if !namespaces[ref.Namespace] {
				t.Fatalf("status for %s, which was not given", ref)
			}
		}
	})
}
