package translate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	sigyaml "sigs.k8s.io/yaml"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/filesource"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi/gatewayapitest"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/normalize/kube"
	"github.com/flotilla-mesh/flotilla/internal/publish"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// testProxy is the test-only document naming a proxy to translate for:
//
//	apiVersion: test.flotilla.io/v1
//	kind: Proxy
//	spec: {id: sidecar~10.1.1.1~app-1.default~default.svc.cluster.local, labels: {...}, generator: grpc, locality: us-east1/us-east1-b}
//
// listeners names listeners the proxy asks for besides all it gets
// (a proxyless gRPC server's, which are known only by name).
type testProxy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		ID             string            `json:"id"`
		Labels         map[string]string `json:"labels"`
		Generator      string            `json:"generator"`
		ServiceAccount string            `json:"serviceAccount"`
		Listeners      []string          `json:"listeners"`
		// Locality is the node's, "region/zone/subzone".
		Locality string `json:"locality"`
		// IstioTelemetry: the node lists Istio's stats and
		// peer-metadata extensions (Istio's build of Envoy).
		IstioTelemetry bool `json:"istioTelemetry"`
		// IstioVersion and Metadata are the node's ISTIO_VERSION and
		// string metadata (what EnvoyFilter proxy matches read).
		IstioVersion string            `json:"istioVersion"`
		Metadata     map[string]string `json:"metadata"`
		// ProxyConfig is the node's PROXY_CONFIG.
		ProxyConfig json.RawMessage `json:"proxyConfig"`
	} `json:"spec"`
}

// caseProxy is a proxy of a case, and the listeners it asks for by name.
type caseProxy struct {
	*model.Proxy
	listeners []string
}

// loadCase reads a case's input the way Flotilla reads config: the Istio
// objects through galley's file source and publisher (validated, then
// ServiceEntries and WorkloadEntries made into registry services) into the
// store as discovery receives them; Kubernetes Services, EndpointSlices and
// Pods (which only galley's cluster mode reads) normalised as galley does;
// an optional MeshConfig; and the proxies to translate for. A document
// galley would reject fails the case.
func loadCase(tb testing.TB, path string) (*model.Store, []caseProxy, model.BuildOptions) {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	store := model.NewStore()
	var proxies []caseProxy
	var istioDocs [][]byte
	var endpointSlices []*discoveryv1.EndpointSlice
	pods := map[string]*corev1.Pod{}
	keys := staticJWKS{}
	var services []*corev1.Service
	cluster := gatewayapitest.NewCluster(model.DefaultDomainSuffix)
	gatewayIn := gatewayapitest.Input(cluster)
	gatewayDocs := 0
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
			proxies = append(proxies, caseProxy{parseTestProxy(tb, tp), tp.Spec.Listeners})
		case head.APIVersion == "test.flotilla.io/v1" && head.Kind == "JWKS":
			var tk testJWKS
			if err := sigyaml.UnmarshalStrict(doc, &tk); err != nil {
				tb.Fatal(err)
			}
			k := model.JWKS{Keys: tk.Spec.Keys}
			if tk.Spec.Error != "" {
				k.Err = errors.New(tk.Spec.Error)
			}
			keys[tk.Spec.Location] = k
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
			services = append(services, &svc)
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
			endpointSlices = append(endpointSlices, &s)
		case strings.HasPrefix(head.APIVersion, gatewayapi.Group+"/"):
			if _, err := gatewayIn.AddYAML(doc); err != nil {
				tb.Fatal(err)
			}
			gatewayDocs++
		case head.APIVersion == "v1" && head.Kind == "ConfigMap":
			var cm corev1.ConfigMap
			if err := sigyaml.UnmarshalStrict(doc, &cm); err != nil {
				tb.Fatal(err)
			}
			cluster.ConfigMaps[cm.Namespace+"/"+cm.Name] = cm.Data
		case head.APIVersion == "v1" && head.Kind == "Secret":
			// A Secret a Gateway API listener names: in the conversion's
			// cluster, and published as galley publishes a Secret
			// configuration names.
			var sec corev1.Secret
			if err := sigyaml.UnmarshalStrict(doc, &sec); err != nil {
				tb.Fatal(err)
			}
			cluster.Secrets[sec.Namespace+"/"+sec.Name] = sec.Data
			body, err := anypb.New(&registryv1.Credential{
				Namespace: sec.Namespace, Name: sec.Name, CertificateChain: sec.Data["tls.crt"], PrivateKey: sec.Data["tls.key"],
			})
			if err != nil {
				tb.Fatal(err)
			}
			if err := store.Put(registry.CredentialTypeURL, registry.CredentialName(sec.Namespace, sec.Name), model.Meta{}, body); err != nil {
				tb.Fatal(err)
			}
		case head.APIVersion == "v1" && head.Kind == "Namespace":
			var n corev1.Namespace
			if err := sigyaml.UnmarshalStrict(doc, &n); err != nil {
				tb.Fatal(err)
			}
			cluster.NamespaceSet[n.Name] = n.Labels
		default:
			istioDocs = append(istioDocs, doc)
		}
	}
	readIstio(tb, store, bytes.Join(istioDocs, []byte("---\n")))
	if gatewayDocs > 0 {
		// The Gateway API, converted as galley converts it.
		addServices(cluster, services, endpointSlices)
		out := gatewayapi.Convert(gatewayIn)
		putGenerated(tb, store, out.Objects)
		// The ConfigMap CAs it names, as galley publishes them.
		for key, ca := range out.ConfigMapCAs {
			ns, name, _ := strings.Cut(key, "/")
			body, err := anypb.New(&registryv1.Credential{Namespace: ns, Name: name, CaCertificates: ca, ConfigMap: true})
			if err != nil {
				tb.Fatal(err)
			}
			if err := store.Put(registry.CredentialTypeURL, registry.ConfigMapCredentialName(ns, name), model.Meta{}, body); err != nil {
				tb.Fatal(err)
			}
		}
	}
	lookup := func(ns, name string) *corev1.Pod { return pods[ns+"/"+name] }
	for _, s := range endpointSlices {
		if set, _, ok := kube.EndpointSlice(s, lookup, model.DefaultDomainSuffix); ok {
			store.PutEndpointSet(set)
		}
	}
	if len(proxies) == 0 {
		tb.Fatalf("%s: no test.flotilla.io/v1 Proxy document", path)
	}
	return store, proxies, model.BuildOptions{JWKS: keys}
}

// testJWKS is the test-only document giving what discovery fetched from
// a JWKS location (keys, or the fetch's error):
//
//	apiVersion: test.flotilla.io/v1
//	kind: JWKS
//	spec: {location: https://issuer.example.com/jwks.json, keys: '{"keys": [...]}'}
type testJWKS struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Location string `json:"location"`
		Keys     string `json:"keys"`
		Error    string `json:"error"`
	} `json:"spec"`
}

// staticJWKS is a case's JWKS documents; a location without one is one
// whose first fetch has not ended.
type staticJWKS map[string]model.JWKS

func (s staticJWKS) Lookup(locations []string) map[string]model.JWKS {
	out := map[string]model.JWKS{}
	for _, l := range locations {
		k, ok := s[l]
		if !ok {
			k = model.JWKS{Err: errors.New("keys not fetched yet")}
		}
		out[l] = k
	}
	return out
}

// putGenerated puts the objects galley generates from the Gateway API into
// store as galley publishes them: beside the validated ones, unvalidated
// (their names are not ones a user may give).
func putGenerated(tb testing.TB, store *model.Store, objs []*istio.Object) {
	tb.Helper()
	local := mcp.NewLocal(mcp.HandlerFunc(func(typeURL string, updated []*mcp.Resource, removed []string) error {
		for _, r := range updated {
			if err := store.Put(typeURL, r.Name, model.Meta{Labels: r.Labels, Annotations: r.Annotations, Created: r.Created, Version: r.ObjectVersion()}, r.Body); err != nil {
				return err
			}
		}
		return nil
	}), model.TypeURLs())
	if err := publish.New(local).Apply(context.Background(), objs, nil); err != nil {
		tb.Fatal(err)
	}
}

// addServices puts a case's Services in the Gateway API's cluster, ready
// where an EndpointSlice has an endpoint.
func addServices(c *gatewayapitest.Cluster, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) {
	for _, s := range svcs {
		gs := &gatewayapi.Service{Labels: s.Labels, ClusterIPs: []string{s.Spec.ClusterIP}, ReadyPorts: map[int32]bool{}, TargetPorts: map[int32][]int32{}, PortNames: map[string]int32{}}
		for _, p := range s.Spec.Ports {
			gs.Ports = append(gs.Ports, p.Port)
			gs.PortNames[p.Name] = p.Port
			for _, sl := range slices {
				if sl.Namespace != s.Namespace || sl.Labels[discoveryv1.LabelServiceName] != s.Name || len(sl.Endpoints) == 0 {
					continue
				}
				for _, ep := range sl.Ports {
					if ep.Name != nil && *ep.Name == p.Name && ep.Port != nil {
						gs.ReadyPorts[p.Port] = true
						gs.TargetPorts[p.Port] = append(gs.TargetPorts[p.Port], *ep.Port)
					}
				}
			}
		}
		c.Services[s.Namespace+"/"+s.Name] = gs
	}
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
			if err := store.Put(typeURL, r.Name, model.Meta{Labels: r.Labels, Annotations: r.Annotations, Created: r.Created, Version: r.ObjectVersion()}, r.Body); err != nil {
				return err
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
	loc := append(strings.SplitN(tp.Spec.Locality, "/", 3), "", "")
	var pc *meshv1alpha1.ProxyConfig
	if len(tp.Spec.ProxyConfig) > 0 {
		pc = &meshv1alpha1.ProxyConfig{}
		if err := protojson.Unmarshal(tp.Spec.ProxyConfig, pc); err != nil {
			tb.Fatalf("proxy %s: proxyConfig: %v", tp.Spec.ID, err)
		}
	}
	return &model.Proxy{
		Type: model.ProxyType(parts[0]), IPs: []netip.Addr{netip.MustParseAddr(parts[1])}, ID: parts[2],
		DNSDomain: parts[3], Namespace: ns, Labels: tp.Spec.Labels, Generator: tp.Spec.Generator,
		ServiceAccount: tp.Spec.ServiceAccount, IstioTelemetry: tp.Spec.IstioTelemetry,
		IstioVersion: tp.Spec.IstioVersion, Metadata: tp.Spec.Metadata,
		Locality:    model.Locality{Region: loc[0], Zone: loc[1], Subzone: loc[2]},
		ProxyConfig: pc,
	}
}

// proxyKey names a proxy in the golden files.
func proxyKey(p *model.Proxy) string {
	return string(p.Type) + "~" + p.IPs[0].String() + "~" + p.ID + "~" + p.DNSDomain
}

// goldenFiles are the golden documents of a case, one per xDS type, each
// proxy's resources keyed by name; problems.golden.json lists what was
// dropped or degraded, and exists only when something was.
type goldenFiles struct {
	clusters, endpoints, listeners, routes golden.Named
	// extensionConfigs are the ECDS resources
	// (extensionconfigs.golden.json, only when there are some).
	extensionConfigs golden.Named
	// nameTables are the name tables of the proxies that capture DNS,
	// the ones whose agents ask for it (nametables.golden.json, only
	// when there are some).
	nameTables golden.Named
	problems   map[string][]string
	// patchedBy is each proxy's Output.PatchedBy (envoyfilters.golden.json,
	// only when an EnvoyFilter changed something).
	patchedBy map[string]map[string][]string
}

func (f *goldenFiles) add(tb testing.TB, p *model.Proxy, out *Output, nameTable *ndsv1.NameTable) {
	tb.Helper()
	key := proxyKey(p)
	golden.Add(tb, f.clusters, key, out.Clusters, func(m *clusterv3.Cluster) string { return ResourceName(m) })
	golden.Add(tb, f.endpoints, key, out.Endpoints, func(m *endpointv3.ClusterLoadAssignment) string { return ResourceName(m) })
	golden.Add(tb, f.listeners, key, out.Listeners, func(m *listenerv3.Listener) string { return ResourceName(m) })
	golden.Add(tb, f.routes, key, out.Routes, func(m *routev3.RouteConfiguration) string { return ResourceName(m) })
	if len(out.ExtensionConfigs) > 0 {
		golden.Add(tb, f.extensionConfigs, key, out.ExtensionConfigs, func(m *corev3.TypedExtensionConfig) string { return ResourceName(m) })
	}
	if p.CapturesDNS() {
		golden.Add(tb, f.nameTables, key, []*ndsv1.NameTable{nameTable}, func(*ndsv1.NameTable) string { return "NameTable" })
	}
	if len(out.Problems) > 0 {
		f.problems[key] = out.Problems
	}
	if len(out.PatchedBy) > 0 {
		f.patchedBy[key] = out.PatchedBy
	}
}

// TestGolden translates testdata/<case>/input.yaml for each proxy in it
// and compares with the case's clusters, endpoints, listeners and routes
// golden files, and its problems (-update rewrites them). Translating
// twice gives the same bytes.
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
			store, proxies, opts := loadCase(t, in)
			pc, _ := store.Build(opts, nil, 1)
			files := goldenFiles{
				clusters: golden.Named{}, endpoints: golden.Named{}, listeners: golden.Named{}, routes: golden.Named{}, extensionConfigs: golden.Named{}, nameTables: golden.Named{},
				problems: map[string][]string{}, patchedBy: map[string]map[string][]string{},
			}
			for _, cp := range proxies {
				p := cp.Proxy
				out := generateCase(pc, cp)
				checkDNSCaches(t, out)
				files.add(t, p, out, NewGenerator(pc, p).NameTable())
				if !deterministic(t, out, generateCase(pc, cp)) {
					t.Fatalf("%s: two translations of the same input differ", proxyKey(p))
				}
			}
			golden.CheckNamed(t, filepath.Join(dir, "clusters.golden.json"), files.clusters, *update)
			golden.CheckNamed(t, filepath.Join(dir, "endpoints.golden.json"), files.endpoints, *update)
			golden.CheckNamed(t, filepath.Join(dir, "listeners.golden.json"), files.listeners, *update)
			golden.CheckNamed(t, filepath.Join(dir, "routes.golden.json"), files.routes, *update)
			if len(files.extensionConfigs) > 0 {
				golden.CheckNamed(t, filepath.Join(dir, "extensionconfigs.golden.json"), files.extensionConfigs, *update)
			} else {
				checkOptional(t, filepath.Join(dir, "extensionconfigs.golden.json"), nil, false)
			}
			if len(files.nameTables) > 0 {
				golden.CheckNamed(t, filepath.Join(dir, "nametables.golden.json"), files.nameTables, *update)
			} else {
				checkOptional(t, filepath.Join(dir, "nametables.golden.json"), nil, false)
			}
			checkOptional(t, filepath.Join(dir, "problems.golden.json"), files.problems, len(files.problems) > 0)
			checkOptional(t, filepath.Join(dir, "envoyfilters.golden.json"), files.patchedBy, len(files.patchedBy) > 0)
		})
	}
}

// generateCase is Generate, with the listeners the proxy asks for by
// name.
func generateCase(pc *model.PushContext, cp caseProxy) *Output {
	out := Generate(pc, cp.Proxy)
	if len(cp.listeners) > 0 {
		g := NewGenerator(pc, cp.Proxy)
		out.Listeners = append(out.Listeners, g.Listeners(cp.listeners)...)
		sortByName(out.Listeners)
		for _, p := range g.Problems() {
			if !slices.Contains(out.Problems, p) {
				out.Problems = append(out.Problems, p)
			}
		}
	}
	return out
}

// deterministic reports whether two outputs are the same resources in the
// same order, byte for byte.
func deterministic(tb testing.TB, a, b *Output) bool {
	tb.Helper()
	render := func(o *Output) []byte {
		return golden.Indent(tb, [][]json.RawMessage{
			golden.Raw(tb, o.Clusters), golden.Raw(tb, o.Endpoints), golden.Raw(tb, o.Listeners), golden.Raw(tb, o.Routes), golden.Raw(tb, o.ExtensionConfigs),
		})
	}
	return bytes.Equal(render(a), render(b)) && slices.Equal(a.Problems, b.Problems)
}

// checkOptional compares v with path, which exists only when there is
// something (problems, EnvoyFilters' patches).
func checkOptional(tb testing.TB, path string, v any, some bool) {
	tb.Helper()
	if some {
		golden.Check(tb, path, golden.Indent(tb, v), *update)
		return
	}
	if *update {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			tb.Fatal(err)
		}
	}
	if data, err := os.ReadFile(path); err == nil {
		tb.Errorf("%s expects something, and translation gave nothing (run go test -update if that is intended):\n%s", path, data)
	}
}
