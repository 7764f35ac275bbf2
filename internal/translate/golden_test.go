package translate

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
)

var update = flag.Bool("update", false, "rewrite want.golden.json files")

// testProxy is the test-only document naming a proxy to translate for:
//
//	apiVersion: test.flotilla.io/v1
//	kind: Proxy
//	spec: {id: sidecar~10.1.1.1~app-1.default~default.svc.cluster.local, labels: {...}, generator: grpc}
type testProxy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		ID             string            `json:"id"`
		Labels         map[string]string `json:"labels"`
		Generator      string            `json:"generator"`
		ServiceAccount string            `json:"serviceAccount"`
	} `json:"spec"`
}

// loadCase reads a case's input: Istio objects (ServiceEntries and
// WorkloadEntries normalised as galley does), Kubernetes Services,
// EndpointSlices and Pods (normalised likewise), an optional MeshConfig
// and the proxies to translate for.
func loadCase(tb testing.TB, path string) (*model.Store, []*model.Proxy) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	store := model.NewStore()
	var proxies []*model.Proxy
	var entries, workloads []*istio.Object
	var slices []*discoveryv1.EndpointSlice
	pods := map[string]*corev1.Pod{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var node yaml.Node
		if err := dec.Decode(&node); err != nil {
			break
		}
		var head struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
		}
		if err := node.Decode(&head); err != nil {
			tb.Fatal(err)
		}
		doc, err := yaml.Marshal(&node)
		if err != nil {
			tb.Fatal(err)
		}
		switch {
		case head.APIVersion == "test.flotilla.io/v1" && head.Kind == "Proxy":
			var tp testProxy
			if err := sigyaml.UnmarshalStrict(doc, &tp); err != nil {
				tb.Fatal(err)
			}
			proxies = append(proxies, parseTestProxy(tb, tp))
		case head.Kind == "MeshConfig":
			var wrapper struct {
				Spec yaml.Node `yaml:"spec"`
			}
			if err := yaml.Unmarshal(doc, &wrapper); err != nil {
				tb.Fatal(err)
			}
			spec, err := yaml.Marshal(&wrapper.Spec)
			if err != nil {
				tb.Fatal(err)
			}
			m := &meshv1alpha1.MeshConfig{}
			if err := istio.DecodeProtoYAML(spec, m); err != nil {
				tb.Fatal(err)
			}
			store.PutMesh(m)
		case head.APIVersion == "v1" && head.Kind == "Service":
			var svc corev1.Service
			if err := sigyaml.UnmarshalStrict(doc, &svc); err != nil {
				tb.Fatal(err)
			}
			if svc.Namespace == "" {
				svc.Namespace = "default"
			}
			store.PutService(normalize.KubernetesService(&svc, model.DefaultDomainSuffix, "Kubernetes"))
		case head.APIVersion == "v1" && head.Kind == "Pod":
			var pod corev1.Pod
			if err := sigyaml.UnmarshalStrict(doc, &pod); err != nil {
				tb.Fatal(err)
			}
			if pod.Namespace == "" {
				pod.Namespace = "default"
			}
			pods[pod.Namespace+"/"+pod.Name] = &pod
		case head.Kind == "EndpointSlice":
			var s discoveryv1.EndpointSlice
			if err := sigyaml.UnmarshalStrict(doc, &s); err != nil {
				tb.Fatal(err)
			}
			if s.Namespace == "" {
				s.Namespace = "default"
			}
			slices = append(slices, &s)
		default:
			for _, d := range istio.Decode(path, doc, "default") {
				if d.Err != nil {
					tb.Fatal(d.Err)
				}
				store.PutObject(d.Object)
				switch d.Object.Kind.Kind {
				case "ServiceEntry":
					entries = append(entries, d.Object)
				case "WorkloadEntry":
					workloads = append(workloads, d.Object)
				}
			}
		}
	}
	for _, se := range entries {
		svcs, sets := normalize.ServiceEntry(se, workloads)
		for _, s := range svcs {
			store.PutService(s)
		}
		for _, s := range sets {
			store.PutEndpointSet(s)
		}
	}
	lookup := func(ns, name string) *corev1.Pod { return pods[ns+"/"+name] }
	for _, s := range slices {
		if set, _, ok := normalize.EndpointSlice(s, lookup, model.DefaultDomainSuffix); ok {
			store.PutEndpointSet(set)
		}
	}
	if len(proxies) == 0 {
		tb.Fatalf("%s: no test.flotilla.io/v1 Proxy document", path)
	}
	return store, proxies
}

func parseTestProxy(tb testing.TB, tp testProxy) *model.Proxy {
	tb.Helper()
	parts := strings.Split(tp.Spec.ID, "~")
	if len(parts) != 4 {
		tb.Fatalf("proxy id %q is not type~ip~id~domain", tp.Spec.ID)
	}
	_, ns, _ := strings.Cut(parts[2], ".")
	return &model.Proxy{
		Type: model.ProxyType(parts[0]), IPs: []netip.Addr{netip.MustParseAddr(parts[1])}, ID: parts[2],
		DNSDomain: parts[3], Namespace: ns, Labels: tp.Spec.Labels, Generator: tp.Spec.Generator,
		ServiceAccount: tp.Spec.ServiceAccount,
	}
}

// render is the golden form of one proxy's output: indented JSON, stable
// across runs.
func render(tb testing.TB, p *model.Proxy, out *Output) []byte {
	tb.Helper()
	list := func(ms []proto.Message) []json.RawMessage {
		parts := make([]json.RawMessage, 0, len(ms))
		for _, m := range ms {
			b, err := protojson.Marshal(m)
			if err != nil {
				tb.Fatal(err)
			}
			parts = append(parts, b)
		}
		return parts
	}
	doc := struct {
		Proxy     string            `json:"proxy"`
		Clusters  []json.RawMessage `json:"clusters"`
		Endpoints []json.RawMessage `json:"endpoints"`
		Listeners []json.RawMessage `json:"listeners"`
		Routes    []json.RawMessage `json:"routes"`
		Problems  []string          `json:"problems,omitempty"`
	}{
		Proxy:     string(p.Type) + "~" + p.IPs[0].String() + "~" + p.ID + "~" + p.DNSDomain,
		Clusters:  list(messages(out.Clusters)),
		Endpoints: list(messages(out.Endpoints)),
		Listeners: list(messages(out.Listeners)),
		Routes:    list(messages(out.Routes)),
		Problems:  out.Problems,
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func messages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

// TestGolden translates testdata/<case>/input.yaml for each proxy in it
// and compares with testdata/<case>/want.golden.json (-update rewrites).
// Every case's output must also pass the checks with no resource dropped
// unless the case expects problems.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no golden cases")
	}
	for _, in := range inputs {
		dir := filepath.Dir(in)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			store, proxies := loadCase(t, in)
			pc, _ := store.Build(model.BuildOptions{}, nil, 1)
			var got bytes.Buffer
			got.WriteString("[\n")
			for i, p := range proxies {
				out := Generate(pc, p)
				if i > 0 {
					got.WriteString(",\n")
				}
				got.Write(render(t, p, out))
				// Deterministic: a second run gives the same bytes.
				if again := render(t, p, Generate(pc, p)); !bytes.Equal(again, render(t, p, out)) {
					t.Fatal("two translations of the same input differ")
				}
			}
			got.WriteString("\n]\n")
			path := filepath.Join(dir, "want.golden.json")
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("%s differs; run go test -update if the change is intended:\n%s", path, diffHint(want, got.Bytes()))
			}
		})
	}
}

// diffHint shows the first differing line.
func diffHint(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := range max(len(wl), len(gl)) {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, w, g)
		}
	}
	return "(same lines)"
}
