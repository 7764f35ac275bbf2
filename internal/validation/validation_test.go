package validation

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

const wantAnnotation = "validation.flotilla.io/want"

func load(t *testing.T, file string) []istio.Document {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	docs := istio.Decode(file, data, "default")
	for _, d := range docs {
		if d.Err != nil {
			t.Fatalf("test data does not decode: %v", d.Err)
		}
	}
	return docs
}

func TestEveryInvalidExampleIsRejectedWithItsPathAndReason(t *testing.T) {
	docs := load(t, "testdata/invalid.yaml")
	if len(docs) < 30 {
		t.Fatalf("only %d invalid examples", len(docs))
	}
	kinds := map[string]bool{}
	for _, d := range docs {
		obj := d.Object
		kinds[obj.Kind.Kind] = true
		t.Run(obj.Kind.Kind+"/"+obj.Meta.Name, func(t *testing.T) {
			want := obj.Meta.Annotations[wantAnnotation]
			if want == "" {
				t.Fatalf("%s:%d has no %s annotation", d.File, d.Line, wantAnnotation)
			}
			res := Validate(obj, nil)
			if res.OK() {
				t.Fatalf("accepted; want error %q", want)
			}
			msg := res.Err().Error()
			if !strings.Contains(msg, want) {
				t.Fatalf("errors %q do not contain %q", msg, want)
			}
		})
	}
	if len(kinds) != len(istio.Kinds()) {
		t.Errorf("invalid examples cover %d kinds, want all %d", len(kinds), len(istio.Kinds()))
	}
}

func TestEveryValidExampleIsAcceptedWithoutWarnings(t *testing.T) {
	for _, d := range load(t, "testdata/valid.yaml") {
		t.Run(d.Object.Kind.Kind+"/"+d.Object.Meta.Name, func(t *testing.T) {
			res := Validate(d.Object, nil)
			// Istio warns of every EnvoyFilter (IST0133); that warning
			// alone is allowed.
			ws := slices.DeleteFunc(slices.Clone(res.Warnings), func(w Issue) bool {
				return d.Object.Kind.Kind == istio.EnvoyFilter && w.Code == CodeEnvoyFilter
			})
			if !res.OK() || len(ws) > 0 {
				t.Fatalf("errors %v, warnings %v", res.Errors, res.Warnings)
			}
		})
	}
}

// subsets is a Context backed by a fixed table: host → subset names.
type subsets map[string][]string

func (s subsets) Subsets(_, host string) ([]string, bool) {
	names, ok := s[host]
	return names, ok
}

func TestMissingSubsetIsAWarningNotAnError(t *testing.T) {
	doc := `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: r}
spec:
  hosts: [reviews]
  http:
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 50}
    - {destination: {host: reviews, subset: v9}, weight: 25}
    - {destination: {host: ratings, subset: v1}, weight: 25}
`
	obj := istio.Decode("vs.yaml", []byte(doc), "default")[0].Object
	res := Validate(obj, subsets{"reviews": {"v1", "v2"}})
	if !res.OK() {
		t.Fatalf("errors: %v", res.Errors)
	}
	want := []string{
		`spec.http[0].route[1].destination.subset: subset "v9" is not defined by the DestinationRule for host "reviews" (it defines [v1, v2])`,
		`spec.http[0].route[2].destination.subset: subset "v1": no DestinationRule for host "ratings" defines subsets; traffic to it will fail`,
	}
	if len(res.Warnings) != len(want) {
		t.Fatalf("warnings %v, want %v", res.Warnings, want)
	}
	for i, w := range want {
		if res.Warnings[i].String() != w {
			t.Errorf("warning %d = %q, want %q", i, res.Warnings[i], w)
		}
	}
}

func TestAllErrorsOfAnObjectAreReportedAtOnceInPathOrder(t *testing.T) {
	doc := `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: many}
spec:
  hosts: [reviews, reviews]
  http:
  - route:
    - {destination: {host: "bad host"}, weight: 60}
    - {destination: {host: reviews}, weight: 60}
    timeout: -1s
`
	obj := istio.Decode("vs.yaml", []byte(doc), "default")[0].Object
	res := Validate(obj, nil)
	var paths []string
	for _, e := range res.Errors {
		paths = append(paths, e.Path)
	}
	want := "spec.hosts[1] spec.http[0].route spec.http[0].route[0].destination.host spec.http[0].timeout"
	if got := strings.Join(paths, " "); got != want {
		t.Fatalf("error paths %q, want %q (errors: %v)", got, want, res.Errors)
	}
}

func TestObjectNamesAreChecked(t *testing.T) {
	obj := load(t, "testdata/valid.yaml")[0].Object.DeepCopy()
	obj.Meta.Name = "Reviews_Route"
	res := Validate(obj, nil)
	if res.OK() || res.Errors[0].Path != "metadata.name" {
		t.Fatalf("errors %v", res.Errors)
	}
}

func FuzzValidate(f *testing.F) {
	for _, file := range []string{"testdata/valid.yaml", "testdata/invalid.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for _, chunk := range strings.Split(string(data), "\n---\n") {
			f.Add(chunk)
		}
	}
	f.Fuzz(func(t *testing.T, doc string) {
		for _, d := range istio.Decode("fuzz.yaml", []byte(doc), "default") {
			if d.Object != nil {
				res := Validate(d.Object, subsets{"reviews": {"v1"}})
				_ = res.Err() // must not panic
			}
		}
	})
}

func TestEveryServedKindHasItsCheck(t *testing.T) {
	for _, k := range istio.Kinds() {
		if checkFor(k.Kind) == nil {
			t.Errorf("%s is served but has no check", k.Kind)
		}
	}
	if checkFor("Ingress") != nil {
		t.Error("a kind Flotilla does not serve has a check")
	}
}

// TestAnObjectsRegexWorkIsBounded: 2,800 regexes of 1,000 characters (the
// webhook was seen spending seconds on four such objects) are refused
// with one error once the object's regex budget is spent.
func TestAnObjectsRegexWorkIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: heavy}\nspec:\n  hosts: [reviews]\n  http:\n")
	re := strings.Repeat("(a|b)", 200) // 1,000 characters, a valid RE2
	for i := range 2800 {
		fmt.Fprintf(&b, "  - match: [{uri: {regex: %q}}]\n    route: [{destination: {host: reviews}}]\n    name: r%d\n", re, i)
	}
	obj := istio.Decode("vs.yaml", []byte(b.String()), "default")[0].Object
	res := Validate(obj, nil)
	budget := 0
	for _, e := range res.Errors {
		if strings.Contains(e.Message, "in all") {
			budget++
		}
	}
	if budget != 1 {
		t.Fatalf("%d budget errors (of %d errors), want 1", budget, len(res.Errors))
	}
	// An ordinary number of regexes is well within it.
	var ok strings.Builder
	ok.WriteString("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: fine}\nspec:\n  hosts: [reviews]\n  http:\n")
	for i := range 500 {
		fmt.Fprintf(&ok, "  - match: [{uri: {regex: \"/api/v%d/[a-z]+\"}}]\n    route: [{destination: {host: reviews}}]\n", i)
	}
	if res := Validate(istio.Decode("vs.yaml", []byte(ok.String()), "default")[0].Object, nil); !res.OK() {
		t.Fatalf("500 ordinary regexes: %v", res.Errors[:min(3, len(res.Errors))])
	}
}

// TestEmptySelectorsAreAcceptedWithAWarning: Istio accepts an empty
// PeerAuthentication selector or ServiceEntry workloadSelector (they
// select every workload in the namespace) and warns.
func TestEmptySelectorsAreAcceptedWithAWarning(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: all}\nspec:\n  selector: {}\n  mtls: {mode: STRICT}\n",
		"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: all}\nspec:\n  hosts: [all.example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: STATIC\n  workloadSelector: {}\n",
	} {
		res := Validate(istio.Decode("x.yaml", []byte(doc), "default")[0].Object, nil)
		if !res.OK() || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "selects every workload") {
			t.Errorf("errors %v, warnings %v; want accepted with one warning:\n%s", res.Errors, res.Warnings, doc)
		}
	}
}

func TestABootstrapPatchIsAcceptedWithAWarningThatItIsNotApplied(t *testing.T) {
	doc := "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: flush}\nspec:\n  configPatches:\n  - applyTo: BOOTSTRAP\n    patch: {operation: MERGE, value: {stats_flush_interval: 10s}}\n"
	res := Validate(istio.Decode("ef.yaml", []byte(doc), "default")[0].Object, nil)
	if !res.OK() {
		t.Fatalf("errors %v", res.Errors)
	}
	i := slices.IndexFunc(res.Warnings, func(w Issue) bool { return w.Code == CodeNotImplemented })
	if i < 0 || !strings.Contains(res.Warnings[i].String(), "spec.configPatches[0].applyTo: BOOTSTRAP patches are not applied") {
		t.Errorf("warnings %v; want the BOOTSTRAP patch named as not applied", res.Warnings)
	}
}

// A DestinationRule's configmap:// credentialName is checked as Istio's
// ValidateTLS checks it (both parts, the rule's own namespace), and one
// that is well formed is accepted with a warning that Flotilla serves
// the ConfigMap's CA only while a Gateway API object names it.
func TestAConfigMapCredentialNameIsOfTheRulesNamespaceAndWarnedAbout(t *testing.T) {
	for _, tc := range []struct {
		cred, wantErr, wantWarn string
	}{
		{cred: "configmap://shop/backend-ca", wantWarn: "spec.trafficPolicy.tls.credentialName: the CA certificate of ConfigMap shop/backend-ca is served only while a Gateway API object"},
		{cred: "configmap://other/backend-ca", wantErr: `spec.trafficPolicy.tls.credentialName: invalid configmap:// credentialName: namespace must match the configuration namespace "shop"`},
		{cred: "configmap://shop", wantErr: `spec.trafficPolicy.tls.credentialName: invalid configmap:// credentialName "configmap://shop": expected configmap://<namespace>/<name>`},
	} {
		doc := "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\n" +
			"spec: {host: api.example.com, trafficPolicy: {tls: {mode: SIMPLE, credentialName: \"" + tc.cred + "\"}}}\n"
		obj := istio.Decode("dr.yaml", []byte(doc), "default")[0].Object
		res := Validate(obj, nil)
		var errs, warns []string
		for _, e := range res.Errors {
			errs = append(errs, e.String())
		}
		for _, w := range res.Warnings {
			warns = append(warns, w.String())
		}
		switch {
		case tc.wantErr != "" && (len(errs) != 1 || errs[0] != tc.wantErr):
			t.Errorf("%s: errors %q, want %q", tc.cred, errs, tc.wantErr)
		case tc.wantErr == "" && (len(errs) != 0 || len(warns) != 1 || !strings.HasPrefix(warns[0], tc.wantWarn)):
			t.Errorf("%s: errors %q, warnings %q, want the warning %q", tc.cred, errs, warns, tc.wantWarn)
		}
	}
}
