package istio

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
)

const multi = `# routes for reviews
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: 90
    - destination: {host: reviews, subset: v2}
      weight: 10
---
apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata: {name: reviews, namespace: prod, labels: {team: a}}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}]
---
# empty document
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken}
spec:
  hosts: [x]
  htp: []
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
`

func TestDecodeKeepsEveryDocumentApartWithItsLine(t *testing.T) {
	docs := Decode("mesh.yaml", []byte(multi), "default")
	if len(docs) != 4 {
		t.Fatalf("got %d documents, want 4 (the empty one skipped)", len(docs))
	}
	vs := docs[0]
	if vs.Err != nil || vs.Line != 2 || vs.Object.String() != "VirtualService default/reviews" {
		t.Fatalf("first document: line %d, %v, %v", vs.Line, vs.Object, vs.Err)
	}
	want := &networking.VirtualService{
		Hosts: []string{"reviews"},
		Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{
			{Destination: &networking.Destination{Host: "reviews", Subset: "v1"}, Weight: 90},
			{Destination: &networking.Destination{Host: "reviews", Subset: "v2"}, Weight: 10},
		}}},
	}
	if d := cmp.Diff(want, vs.Object.Spec, protocmp.Transform()); d != "" {
		t.Fatalf("spec (-want +got):\n%s", d)
	}
	dr := docs[1]
	if dr.Err != nil || dr.Line != 15 || dr.Object.Key() != "prod/reviews" || dr.Object.Kind.Version() != "v1" || dr.Object.Meta.Labels["team"] != "a" {
		t.Fatalf("second document (v1beta1 accepted as the v1 kind): line %d %+v %v", dr.Line, dr.Object, dr.Err)
	}
	if got := docs[2].Err.Error(); got != `mesh.yaml:29: VirtualService default/broken: spec: unknown field "htp"` {
		t.Fatalf("bad field: %q", got)
	}
	if got := docs[3].Err.Error(); got != "mesh.yaml:31: unsupported kind apps/v1 Deployment" {
		t.Fatalf("foreign kind: %q", got)
	}
}

func TestDecodeErrorsNameTheFileLineObjectAndReason(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want string
	}{
		"syntax error": {"a: b\n---\nkind: [unclosed\n", "f.yaml:3: invalid YAML: yaml: line 3: did not find expected ',' or ']'"},
		// The location is where the parser stopped, as its message says,
		// not the document's first line.
		"syntax error deep in a document": {"a: b\n---\napiVersion: v1\nkind: X\nmetadata:\n  name: x\n  labels: a: b\n", "f.yaml:7: invalid YAML: yaml: line 7: mapping values are not allowed"},
		"not a mapping":                   {"- a\n- b\n", "f.yaml:1: a document must be a mapping"},
		"no kind":                         {"apiVersion: v1\nmetadata: {name: x}\n", "f.yaml:1: apiVersion and kind are required"},
		"wrong version":                   {"apiVersion: networking.istio.io/v2\nkind: Gateway\nmetadata: {name: g}\n", "Gateway is not served as networking.istio.io/v2"},
		"no name":                         {"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {}\n", "f.yaml:1: PeerAuthentication: metadata.name is required"},
		"typo at top level":               {"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nsepc: {}\n", `unknown field "sepc"`},
		"wrong type":                      {"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: v}\nspec: {hosts: 3}\n", "VirtualService default/v: spec:"},
		"bad enum":                        {"apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nspec: {mtls: {mode: STRICTEST}}\n", `invalid value for enum field mode: "STRICTEST"`},
		"bad duration":                    {"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: v}\nspec: {http: [{timeout: soon}]}\n", "spec:"},
		"non-scalar keys":                 {"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: v}\nspec: {? [a] : 2}\n", "invalid YAML"},
		"labels not map":                  {"apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, labels: [a]}\n", "metadata.labels: cannot be array"},
		"bad creation time":               {"apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, creationTimestamp: yesterday}\n", `Sidecar default/s: metadata.creationTimestamp: "yesterday" is not an RFC 3339 time`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			docs := Decode("f.yaml", []byte(tc.yaml), "default")
			if len(docs) == 0 {
				t.Fatal("no documents")
			}
			err := docs[len(docs)-1].Err
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want a *DecodeError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestIntegerMapKeysAndGoDurationsAreAccepted(t *testing.T) {
	doc := `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: p}
spec:
  selector: {matchLabels: {app: a}}
  portLevelMtls:
    8080: {mode: DISABLE}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: v}
spec:
  hosts: [a]
  http:
  - route: [{destination: {host: a}}]
    timeout: 1m30s
    retries: {attempts: 2, perTryTimeout: 250ms}
    corsPolicy: {maxAge: 24h}
    fault: {delay: {fixedDelay: 1.5s}}
`
	docs := Decode("f.yaml", []byte(doc), "default")
	for _, d := range docs {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
	}
	pa := docs[0].Object.Spec.(*security.PeerAuthentication)
	if pa.GetPortLevelMtls()[8080].GetMode() != security.PeerAuthentication_MutualTLS_DISABLE {
		t.Fatalf("portLevelMtls = %v", pa.GetPortLevelMtls())
	}
	route := docs[1].Object.Spec.(*networking.VirtualService).GetHttp()[0]
	for name, got := range map[string]time.Duration{
		"timeout":       route.GetTimeout().AsDuration(),
		"perTryTimeout": route.GetRetries().GetPerTryTimeout().AsDuration(),
		"maxAge":        route.GetCorsPolicy().GetMaxAge().AsDuration(),
		"fixedDelay":    route.GetFault().GetDelay().GetFixedDelay().AsDuration(),
	} {
		want := map[string]time.Duration{"timeout": 90 * time.Second, "perTryTimeout": 250 * time.Millisecond, "maxAge": 24 * time.Hour, "fixedDelay": 1500 * time.Millisecond}[name]
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}

func TestOversizedFileIsOneError(t *testing.T) {
	docs := Decode("big.yaml", make([]byte, MaxFileBytes+1), "default")
	if len(docs) != 1 || docs[0].Err == nil || !strings.Contains(docs[0].Err.Error(), "larger than") {
		t.Fatalf("%+v", docs)
	}
}

func TestAliasBombIsRejectedNotExpanded(t *testing.T) {
	bomb := "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" +
		"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" +
		"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\ni: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
	docs := Decode("bomb.yaml", []byte(bomb), "default")
	if len(docs) != 1 || docs[0].Err == nil {
		t.Fatalf("alias bomb decoded: %+v", docs)
	}
}

func TestLineOfPointsAtTheField(t *testing.T) {
	docs := Decode("mesh.yaml", []byte(multi), "default")
	vs := docs[0]
	tests := map[string]int{
		"spec.http[0].route[1].weight": 13,
		"spec.http[0].route[1]":        12,
		"spec.hosts[0]":                7,
		"spec.http[5].route":           8, // no such route: the deepest that exists
		"metadata.name":                5,
		"":                             2,
	}
	for path, want := range tests {
		if got := vs.LineOf(path); got != want {
			t.Errorf("LineOf(%q) = %d, want %d", path, got, want)
		}
	}
	if got := docs[1].LineOf("metadata.labels[team]"); got != 17 {
		t.Errorf("map key in brackets: line %d, want 17", got)
	}
}

func TestPathSegmentsKeepDotsInsideBrackets(t *testing.T) {
	got := pathSegments("spec.selector.matchLabels[app.kubernetes.io/name].x[3]")
	want := []string{"spec", "selector", "matchLabels", "app.kubernetes.io/name", "x", "3"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatal(d)
	}
}

func TestKindsAreConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Kinds() {
		if seen[k.TypeURL()] {
			t.Errorf("duplicate %s", k.TypeURL())
		}
		seen[k.TypeURL()] = true
		if got, ok := ByTypeURL(k.TypeURL()); !ok || got.Kind != k.Kind {
			t.Errorf("ByTypeURL(%s) = %v, %v", k.TypeURL(), got, ok)
		}
		for _, v := range k.Versions {
			// Istio stores every kind as v1 but EnvoyFilter, ProxyConfig
			// and the extension kinds, which it serves as v1alpha3,
			// v1beta1 and v1alpha1 alone.
			want := map[string]string{EnvoyFilter: "v1alpha3", ProxyConfig: "v1beta1", WasmPlugin: "v1alpha1", TrafficExtension: "v1alpha1"}[k.Kind]
			if want == "" {
				want = "v1"
			}
			if got, err := ByAPIVersion(k.Group+"/"+v, k.Kind); err != nil || got.Version() != want {
				t.Errorf("ByAPIVersion(%s/%s, %s) = %v, %v", k.Group, v, k.Kind, got, err)
			}
		}
		if k.NewSpec() == nil {
			t.Errorf("%s has no spec type", k)
		}
	}
	if len(seen) != 15 {
		t.Errorf("%d kinds, want 15", len(seen))
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(multi))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: s}\nspec: {hosts: [a.b], resolution: DNS}\nstatus: {addresses: [{host: a.b, value: 240.240.0.1}]}\n"))
	f.Add([]byte("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: v}\nspec: {http: [{route: [{weight: -1}]}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range Decode("fuzz.yaml", data, "default") {
			if (d.Object == nil) == (d.Err == nil) {
				t.Fatalf("document has both or neither of object and error: %+v", d)
			}
			_ = d.LineOf("spec.http[0].route[0].weight")
		}
	})
}

func TestDecodeProtoYAMLIsStrictAndTakesGoDurations(t *testing.T) {
	var vs networking.VirtualService
	if err := DecodeProtoYAML([]byte("hosts: [a]\nhttp: [{timeout: 2m}]\n"), &vs); err != nil {
		t.Fatal(err)
	}
	if vs.GetHttp()[0].GetTimeout().AsDuration() != 2*time.Minute {
		t.Fatalf("timeout %v", vs.GetHttp()[0].GetTimeout())
	}
	if err := DecodeProtoYAML([]byte("hostz: [a]\n"), &vs); err == nil || !strings.Contains(err.Error(), `unknown field "hostz"`) {
		t.Fatalf("err = %v", err)
	}
	if err := DecodeProtoYAML([]byte("hosts: [a"), &vs); err == nil || !strings.Contains(err.Error(), "invalid YAML") {
		t.Fatalf("err = %v", err)
	}
}

// A creationTimestamp as kubectl writes it (unquoted, a YAML timestamp;
// quoted; or null) is kept: Istio lets the oldest object win conflicts.
func TestCreationTimestampIsKept(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"2024-03-01T10:00:00Z", "2024-03-01T10:00:00Z"},
		{`"2024-03-01T10:00:00+02:00"`, "2024-03-01T08:00:00Z"},
		{"null", "0001-01-01T00:00:00Z"},
	} {
		docs := Decode("f.yaml", []byte("apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, creationTimestamp: "+tc.value+"}\n"), "default")
		if len(docs) != 1 || docs[0].Err != nil {
			t.Fatalf("%s: %+v", tc.value, docs)
		}
		if got := docs[0].Object.Meta.CreationTime.UTC().Format(time.RFC3339); got != tc.want {
			t.Errorf("creationTimestamp %s: %s, want %s", tc.value, got, tc.want)
		}
	}
}

// A ServiceEntry's status.addresses are read (Object.Status), whatever
// else its status holds; a status of any other shape, or any other kind's,
// is not an error and is not read: status is not configuration.
func TestAServiceEntrysStatusAddressesAreReadAndOtherStatusIgnored(t *testing.T) {
	doc := func(kind, status string) string {
		spec := "{hosts: [db.example.com], ports: [{number: 5432, name: tcp, protocol: TCP}], resolution: DNS}"
		if kind == "VirtualService" {
			spec = "{hosts: [db.example.com], tcp: [{route: [{destination: {host: db.example.com}}]}]}"
		}
		return "apiVersion: networking.istio.io/v1\nkind: " + kind + "\nmetadata: {name: db, namespace: data}\nspec: " + spec + "\nstatus: " + status + "\n"
	}
	for name, c := range map[string]struct {
		kind, status string
		want         []string
	}{
		"addresses beside conditions": {"ServiceEntry", `{conditions: [{type: Reconciled}], addresses: [{host: db.example.com, value: 240.240.0.1}, {host: db.example.com, value: "2001:2::1"}]}`, []string{"db.example.com=240.240.0.1", "db.example.com=2001:2::1"}},
		"addresses as a string":       {"ServiceEntry", `{addresses: "240.240.0.1"}`, nil},
		"status as a list":            {"ServiceEntry", `[1, 2]`, nil},
		"no addresses":                {"ServiceEntry", `{conditions: []}`, nil},
		"another kind's status":       {"VirtualService", `{addresses: [{host: db.example.com, value: 240.240.0.1}]}`, nil},
	} {
		t.Run(name, func(t *testing.T) {
			docs := Decode("f.yaml", []byte(doc(c.kind, c.status)), "default")
			if len(docs) != 1 || docs[0].Err != nil {
				t.Fatalf("decode: %+v", docs)
			}
			var got []string
			if st, ok := docs[0].Object.Status.(*networking.ServiceEntryStatus); ok {
				for _, a := range st.GetAddresses() {
					got = append(got, a.GetHost()+"="+a.GetValue())
				}
			} else if docs[0].Object.Status != nil {
				t.Fatalf("status read as %T", docs[0].Object.Status)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("status addresses %q, want %q", got, c.want)
			}
		})
	}
}
