package translate

import (
	"bytes"
	"encoding/json"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/filesource"
	"github.com/flotilla-mesh/flotilla/internal/golden"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/normalize/kube"
	"github.com/flotilla-mesh/flotilla/internal/publish"
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

// loadCase reads a case's input the way Flotilla reads config: the Istio
// objects through galley's file source and publisher (validated, then
// ServiceEntries and WorkloadEntries made into registry services) into the
// store as discovery receives them; Kubernetes Services, EndpointSlices and
// Pods (which only galley's cluster mode reads) normalised as galley does;
// an optional MeshConfig; and the proxies to translate for. A document
// galley would reject fails the case.
func loadCase(tb testing.TB, path string) (*model.Store, []*model.Proxy) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	store := model.NewStore()
	var proxies []*model.Proxy
	var istioDocs [][]byte
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
			m, err := istio.ParseMeshConfig(spec)
			if err != nil {
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
			store.PutService(kube.Service(&svc, model.DefaultDomainSuffix, "Kubernetes"))
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
			istioDocs = append(istioDocs, doc)
		}
	}
	readIstio(tb, store, bytes.Join(istioDocs, []byte("---\n")))
	lookup := func(ns, name string) *corev1.Pod { return pods[ns+"/"+name] }
	for _, s := range slices {
		if set, _, ok := kube.EndpointSlice(s, lookup, model.DefaultDomainSuffix); ok {
			store.PutEndpointSet(set)
		}
	}
	if len(proxies) == 0 {
		tb.Fatalf("%s: no test.flotilla.io/v1 Proxy document", path)
	}
	return store, proxies
}

// readIstio puts Istio YAML into store the way discovery's --config-dir
// does: galley's file source and publisher, handed on through mcp.Local.
func readIstio(tb testing.TB, store *model.Store, docs []byte) {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "input.yaml"), docs, 0o600); err != nil {
		tb.Fatal(err)
	}
	local := mcp.NewLocal(mcp.HandlerFunc(func(typeURL string, updated []*mcp.Resource, removed []string) error {
		for _, r := range updated {
			if err := store.Put(typeURL, r.Name, r.Labels, r.Annotations, r.Body); err != nil {
				return err //nolint:wrapcheck // test
			}
		}
		for _, n := range removed {
			store.Delete(typeURL, n)
		}
		return nil
	}), model.TypeURLs())
	src := filesource.New(filesource.Options{Dir: dir, DefaultNamespace: "default", Log: slog.New(slog.DiscardHandler)}, publish.New(local))
	if err := src.Scan(); err != nil {
		tb.Fatal(err)
	}
	if problems := src.Problems(); len(problems) > 0 {
		tb.Fatalf("galley rejects the case's input: %v", problems)
	}
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
	doc := struct {
		Proxy     string            `json:"proxy"`
		Clusters  []json.RawMessage `json:"clusters"`
		Endpoints []json.RawMessage `json:"endpoints"`
		Listeners []json.RawMessage `json:"listeners"`
		Routes    []json.RawMessage `json:"routes"`
		Problems  []string          `json:"problems,omitempty"`
	}{
		Proxy:     string(p.Type) + "~" + p.IPs[0].String() + "~" + p.ID + "~" + p.DNSDomain,
		Clusters:  golden.Raw(tb, out.Clusters),
		Endpoints: golden.Raw(tb, out.Endpoints),
		Listeners: golden.Raw(tb, out.Listeners),
		Routes:    golden.Raw(tb, out.Routes),
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
			golden.Check(t, filepath.Join(dir, "want.golden.json"), got.Bytes(), *update)
		})
	}
}
