package kubesource

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingapi "istio.io/api/networking/v1alpha3"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/metadata"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var env *kubeenv.Env

// systemNamespace is created by TestMesh…; other tests leave it absent.
const systemNamespace = "flotilla-system"

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// state mirrors what the source published.
type state struct {
	mu       sync.Mutex
	config   map[istio.ID]*istio.Object
	registry map[string]map[string]*mcp.Resource
	// applied is the span context of the last Apply.
	applied trace.SpanContext
}

func newState() *state {
	return &state{config: map[istio.ID]*istio.Object{}, registry: map[string]map[string]*mcp.Resource{}}
}

func (s *state) Apply(ctx context.Context, up []*istio.Object, del []istio.ID) error {
	s.mu.Lock()
	s.applied = trace.SpanContextFromContext(ctx)
	s.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range up {
		s.config[o.ID()] = o
	}
	for _, id := range del {
		delete(s.config, id)
	}
	return nil
}

func (s *state) Update(typeURL string, up []*mcp.Resource, del []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.registry[typeURL] == nil {
		s.registry[typeURL] = map[string]*mcp.Resource{}
	}
	for _, r := range up {
		s.registry[typeURL][r.Name] = r
	}
	for _, n := range del {
		delete(s.registry[typeURL], n)
	}
	return len(up) + len(del), nil
}

func (s *state) vsHosts(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.config[istio.ID{Kind: "VirtualService", Name: name}]
	if o == nil {
		return nil
	}
	return o.Spec.(*networkingapi.VirtualService).GetHosts()
}

func (s *state) endpointSet(name string) *registryv1.EndpointSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.registry[registry.EndpointSetTypeURL][name]
	if r == nil {
		return nil
	}
	var es registryv1.EndpointSet
	if err := r.Body.UnmarshalTo(&es); err != nil {
		return nil
	}
	return &es
}

func (s *state) has(typeURL, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registry[typeURL][name] != nil
}

func start(t *testing.T) (*state, *Source) {
	t.Helper()
	return startWith(t, nil)
}

// startWith is start with a tracer (nil: none).
func startWith(t *testing.T, tracer trace.TracerProvider) (*state, *Source) {
	t.Helper()
	return startIn(t, tracer, systemNamespace)
}

// startIn is startWith with the given system namespace.
func startIn(t *testing.T, tracer trace.TracerProvider, systemNamespace string) (*state, *Source) {
	t.Helper()
	// The Istio informers list their CRDs: without them they never sync.
	if err := env.InstallCRDs(context.Background(), crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	st := newState()
	src := New(Options{
		Kube: env.Client, Istio: ic, Metadata: meta, SystemNamespace: systemNamespace,
		Log: slog.New(slog.DiscardHandler), DomainSuffix: "cluster.local", ClusterID: "Kubernetes", Tracer: tracer,
	}, st, st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-src.Synced():
	case <-time.After(60 * time.Second):
		t.Fatal("never synced")
	}
	return st, src
}

func TestIstioObjectsFlowThroughAndInvalidOnesKeepTheirLastValidState(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "istio")
	if err != nil {
		t.Fatal(err)
	}
	st, src := start(t)
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vss := ic.NetworkingV1().VirtualServices(ns)
	route := func(weights ...int32) []*networkingapi.HTTPRoute {
		var rds []*networkingapi.HTTPRouteDestination
		for _, w := range weights {
			rds = append(rds, &networkingapi.HTTPRouteDestination{Destination: &networkingapi.Destination{Host: "reviews"}, Weight: w})
		}
		return []*networkingapi.HTTPRoute{{Route: rds}}
	}
	vs := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: "reviews"}}
	vs.Spec.Hosts = []string{"reviews"}
	vs.Spec.Http = route(100)
	created, err := vss.Create(ctx, vs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the VirtualService", func() bool { return len(st.vsHosts(ns+"/reviews")) == 1 })
	// The apiserver's creation time goes with it: the oldest of
	// conflicting objects wins.
	st.mu.Lock()
	got := st.config[istio.ID{Kind: "VirtualService", Name: ns + "/reviews"}].Meta.CreationTime
	st.mu.Unlock()
	if got.IsZero() || !got.Equal(created.CreationTimestamp.Time) {
		t.Fatalf("creation time %v, want the apiserver's %v", got, created.CreationTimestamp.Time)
	}

	// No webhook here: an invalid update reaches the cluster but not the mesh.
	created.Spec.Hosts = []string{"reviews", "reviews.prod"}
	created.Spec.Http = route(60, 60)
	bad, err := vss.Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the rejection", func() bool { return src.Rejected()[istio.ID{Kind: "VirtualService", Name: ns + "/reviews"}] != "" })
	if got := st.vsHosts(ns + "/reviews"); len(got) != 1 {
		t.Fatalf("an invalid update was published: hosts %v", got)
	}
	bad.Spec.Http = route(50, 50)
	if _, err := vss.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the fixed update", func() bool { return len(st.vsHosts(ns+"/reviews")) == 2 })
	if len(src.Rejected()) != 0 {
		t.Fatalf("still rejected: %v", src.Rejected())
	}
	if err := vss.Delete(ctx, "reviews", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the deletion", func() bool { return st.vsHosts(ns+"/reviews") == nil })
}

func TestServicesSlicesAndPodsBecomeTheRegistry(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "registry")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := start(t)
	core := env.Client.CoreV1()
	if _, err := core.Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "reviews"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host := "reviews." + ns + ".svc.cluster.local"
	xdstest.Eventually(t, "the Service", func() bool { return st.has(registry.ServiceTypeURL, ns+"/"+host) })

	pod, err := core.Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-v1", Labels: map[string]string{"app": "reviews", "version": "v1"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{Name: "app", Image: "reviews:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No endpoint-slice controller runs here: write the slice it would.
	ready := true
	port, portName := int32(9080), "http"
	if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "reviews-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "reviews"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.1.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "reviews-v1", Namespace: ns},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setName := registry.EndpointSetName(ns, host, "reviews-abc")
	xdstest.Eventually(t, "the endpoints with the pod's labels", func() bool {
		es := st.endpointSet(setName)
		return es != nil && len(es.GetEndpoints()) == 1 && es.GetEndpoints()[0].GetLabels()["version"] == "v1" &&
			es.GetEndpoints()[0].GetServiceAccount() == "default"
	})

	// A pod relabelled (a canary promoted) changes its endpoint.
	pod.Labels["version"] = "v2"
	if _, err := core.Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the relabelled endpoint", func() bool {
		es := st.endpointSet(setName)
		return es != nil && es.GetEndpoints()[0].GetLabels()["version"] == "v2"
	})

	if err := env.Client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "reviews-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the slice's removal", func() bool { return st.endpointSet(setName) == nil })
	if err := core.Services(ns).Delete(ctx, "reviews", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the Service's removal", func() bool { return !st.has(registry.ServiceTypeURL, ns+"/"+host) })
}

func TestNamespacesAndTheMeshConfigAreServedAndABadMeshConfigIsNot(t *testing.T) {
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: systemNamespace},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	st, _ := start(t)
	ns, err := env.CreateNamespace(ctx, "labelled")
	if err != nil {
		t.Fatal(err)
	}
	nsObj, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["istio-injection"] = "enabled"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the labelled namespace", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		r := st.registry[registry.NamespaceTypeURL][ns]
		var n registryv1.Namespace
		return r != nil && r.Body.UnmarshalTo(&n) == nil && n.GetLabels()["istio-injection"] == "enabled"
	})

	cms := env.Client.CoreV1().ConfigMaps(systemNamespace)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: MeshConfigMap},
		Data:       map[string]string{"mesh": "trustDomain: example.org\ndefaultConfig: {discoveryAddress: discovery:15012}\nconnectTimeout: 5s\n"},
	}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	trustDomain := func() string {
		st.mu.Lock()
		defer st.mu.Unlock()
		r := st.registry[registry.MeshConfigTypeURL][registry.MeshConfigName]
		var m meshv1alpha1.MeshConfig
		if r == nil || r.Body.UnmarshalTo(&m) != nil {
			return ""
		}
		return m.GetTrustDomain()
	}
	xdstest.Eventually(t, "the mesh config", func() bool { return trustDomain() == "example.org" })

	// A broken mesh config keeps the last valid one; a fixed one replaces it.
	cm.Data["mesh"] = "trustDomain: [not, a, string]\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Data["mesh"] = "trustDomain: other.org\n"
	time.Sleep(200 * time.Millisecond)
	if got := trustDomain(); got != "example.org" {
		t.Fatalf("after a broken update the trust domain is %q", got)
	}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the fixed mesh config", func() bool { return trustDomain() == "other.org" })
}

func TestAServiceSelectsWorkloadEntriesAsWellAsPods(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "vms")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := start(t)
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "details"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "details"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "vm-1"}}
	we.Spec.Address = "10.128.0.42"
	we.Spec.Labels = map[string]string{"app": "details", "version": "v1"}
	we.Spec.ServiceAccount = "details"
	if _, err := ic.NetworkingV1().WorkloadEntries(ns).Create(ctx, we, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	name := registry.EndpointSetName(ns, "details."+ns+".svc.cluster.local", "workloadentries")
	xdstest.Eventually(t, "the VM endpoint", func() bool {
		es := st.endpointSet(name)
		if es == nil || len(es.GetEndpoints()) != 1 {
			return false
		}
		ep := es.GetEndpoints()[0]
		return ep.GetAddress() == "10.128.0.42" && ep.GetWorkloadName() == "vm-1" && ep.GetPorts()[0].GetNumber() == 8080
	})
	if err := ic.NetworkingV1().WorkloadEntries(ns).Delete(ctx, "vm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the VM endpoint to go", func() bool { return st.endpointSet(name) == nil })
}

// TestInjectionConfigMapsAreServedPerRevisionAndABadOneIsNot: galley
// publishes each revision's injection ConfigMap (so injectors watch
// nothing), keeps the last valid one when it is broken, ignores other
// ConfigMaps and withdraws a deleted one.
func TestInjectionConfigMapsAreServedPerRevisionAndABadOneIsNot(t *testing.T) {
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: systemNamespace},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	st, _ := start(t)
	get := func(rev string) *registryv1.InjectionConfig {
		st.mu.Lock()
		defer st.mu.Unlock()
		r := st.registry[registry.InjectionConfigTypeURL][rev]
		var ic registryv1.InjectionConfig
		if r == nil || r.Body.UnmarshalTo(&ic) != nil {
			return nil
		}
		return &ic
	}
	cms := env.Client.CoreV1().ConfigMaps(systemNamespace)
	def := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: inject.ConfigMapName},
		Data:       map[string]string{inject.ConfigMapValuesKey: "proxyImage: registry.example/agent:1.2\n"},
	}
	canary := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: inject.ConfigMapName + "-canary"},
		Data:       map[string]string{inject.ConfigMapValuesKey: "proxyImage: registry.example/agent:1.3\n"},
	}
	unrelated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "something-else"}, Data: map[string]string{"values": "x"}}
	for _, cm := range []*corev1.ConfigMap{unrelated, def, canary} {
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	xdstest.Eventually(t, "both revisions", func() bool {
		d, c := get(controlplane.DefaultRevision), get("canary")
		return d != nil && c != nil && d.GetValues() == def.Data["values"] && c.GetValues() == canary.Data["values"] &&
			d.GetRevision() == controlplane.DefaultRevision && c.GetRevision() == "canary"
	})
	st.mu.Lock()
	n := len(st.registry[registry.InjectionConfigTypeURL])
	st.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d injection configurations published, want 2", n)
	}

	// Broken: a template that does not parse, values naming no field.
	// Each keeps the last valid configuration. The canary's later valid
	// update (same informer, so in order) shows the broken ones were seen.
	def.Data[inject.ConfigMapTemplateKey] = "containers: [{{ .Values.Nope"
	if _, err := cms.Update(ctx, def, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	canary.Data[inject.ConfigMapValuesKey] = "noSuchValue: 1\n"
	if _, err := cms.Update(ctx, canary, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	canary.Data[inject.ConfigMapValuesKey] = "proxyImage: registry.example/agent:1.4\n"
	if _, err := cms.Update(ctx, canary, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the canary's fixed values", func() bool {
		c := get("canary")
		return c != nil && c.GetValues() == canary.Data["values"]
	})
	if d := get(controlplane.DefaultRevision); d == nil || d.GetTemplate() != "" || d.GetValues() != "proxyImage: registry.example/agent:1.2\n" {
		t.Fatalf("after a broken update the default revision's configuration is %v", d)
	}

	if err := cms.Delete(ctx, canary.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the canary withdrawn", func() bool { return get("canary") == nil })
}

func (s *state) credential(name string) *registryv1.Credential {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.registry[registry.CredentialTypeURL][name]
	if r == nil {
		return nil
	}
	var c registryv1.Credential
	if err := r.Body.UnmarshalTo(&c); err != nil {
		return nil
	}
	return &c
}

// TestOnlySecretsAGatewayNamesArePublishedAndRotationsFollow: a
// Gateway's credentialName publishes the Secrets of that name (its own
// namespace's, and another namespace's, where a gateway deployment may
// run, as in Istio; discovery serves each to its namespace only) and
// "-cacert" for MUTUAL; a Secret nothing names never is, nor any other
// key; a rotated Secret is published again; removing the Gateway
// withdraws them.
func TestOnlySecretsAGatewayNamesArePublishedAndRotationsFollow(t *testing.T) {
	ctx := context.Background()
	edge, err := env.CreateNamespace(ctx, "edge")
	if err != nil {
		t.Fatal(err)
	}
	other, err := env.CreateNamespace(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	tlsSecret := func(ns, name, cert string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{\"data\": \"secret\"}"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": []byte(cert), "tls.key": []byte("key-" + cert), "extra": []byte("never published")},
		}
	}
	for _, s := range []*corev1.Secret{
		tlsSecret(edge, "shop-cert", "v1"), tlsSecret(edge, "unnamed", "u"), tlsSecret(other, "shop-cert", "theirs"),
		{ObjectMeta: metav1.ObjectMeta{Name: "partner-cacert", Namespace: edge}, Data: map[string][]byte{"cacert": []byte("partner-ca")}},
	} {
		if _, err := env.Client.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := start(t)
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gw := &networkingv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "public"}}
	gw.Spec.Selector = map[string]string{"istio": "ingressgateway"}
	gw.Spec.Servers = []*networkingapi.Server{
		{
			Port: &networkingapi.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"shop.example.com"},
			Tls: &networkingapi.ServerTLSSettings{Mode: networkingapi.ServerTLSSettings_SIMPLE, CredentialName: "shop-cert"},
		},
		{
			Port: &networkingapi.Port{Number: 443, Name: "https-partner", Protocol: "HTTPS"}, Hosts: []string{"partner.example.com"},
			Tls: &networkingapi.ServerTLSSettings{Mode: networkingapi.ServerTLSSettings_MUTUAL, CredentialName: "kubernetes://partner"},
		},
	}
	if _, err := ic.NetworkingV1().Gateways(edge).Create(ctx, gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the named Secret published", func() bool {
		c := st.credential(edge + "/shop-cert")
		return c != nil && string(c.GetCertificateChain()) == "v1" && string(c.GetPrivateKey()) == "key-v1"
	})
	xdstest.Eventually(t, "the MUTUAL server's CA Secret", func() bool {
		c := st.credential(edge + "/partner-cacert")
		return c != nil && string(c.GetCaCertificates()) == "partner-ca"
	})
	xdstest.Eventually(t, "the same name in another namespace", func() bool {
		c := st.credential(other + "/shop-cert")
		return c != nil && string(c.GetCertificateChain()) == "theirs"
	})
	for _, name := range []string{edge + "/unnamed", edge + "/partner"} {
		if st.has(registry.CredentialTypeURL, name) {
			t.Errorf("%s was published", name)
		}
	}

	// A rotation is published; the Secret's other keys never are.
	sec, err := env.Client.CoreV1().Secrets(edge).Get(ctx, "shop-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["tls.crt"], sec.Data["tls.key"] = []byte("v2"), []byte("key-v2")
	if _, err := env.Client.CoreV1().Secrets(edge).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the rotated Secret", func() bool {
		c := st.credential(edge + "/shop-cert")
		return c != nil && string(c.GetCertificateChain()) == "v2"
	})

	// No Gateway names it any more: withdrawn.
	if err := ic.NetworkingV1().Gateways(edge).Delete(ctx, "public", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the credentials withdrawn", func() bool {
		return !st.has(registry.CredentialTypeURL, edge+"/shop-cert") && !st.has(registry.CredentialTypeURL, edge+"/partner-cacert") &&
			!st.has(registry.CredentialTypeURL, other+"/shop-cert")
	})
}

// TestTheConfigMapCAsTheGatewayAPIReadsArePublishedApartFromSecrets: the
// CA certificates of the ConfigMaps the Gateway API's listeners validate
// clients with, as the conversion hands them over, are published as
// ConfigMap credentials ("configmap/<namespace>/<name>"), apart from a
// Secret of the same name; a changed bundle is published again, and one
// no listener reads any more is withdrawn.
func TestTheConfigMapCAsTheGatewayAPIReadsArePublishedApartFromSecrets(t *testing.T) {
	st, src := start(t)
	ca := func(name string) *registryv1.Credential {
		c := st.credential(registry.ConfigMapCredentialName("edge", name))
		if c == nil || !c.GetConfigMap() || c.GetNamespace() != "edge" || c.GetName() != name {
			return nil
		}
		return c
	}
	src.ConfigMapCAsChanged(map[string][]byte{"edge/client-ca": []byte("v1"), "edge/partner-ca": []byte("partner")})
	xdstest.Eventually(t, "both bundles published", func() bool {
		return string(ca("client-ca").GetCaCertificates()) == "v1" && string(ca("partner-ca").GetCaCertificates()) == "partner"
	})
	if st.has(registry.CredentialTypeURL, registry.CredentialName("edge", "client-ca")) {
		t.Error("a ConfigMap's CA was published under a Secret's name")
	}
	src.ConfigMapCAsChanged(map[string][]byte{"edge/client-ca": []byte("v2")})
	xdstest.Eventually(t, "the changed bundle published, the other withdrawn", func() bool {
		return string(ca("client-ca").GetCaCertificates()) == "v2" && !st.has(registry.CredentialTypeURL, registry.ConfigMapCredentialName("edge", "partner-ca"))
	})
	src.ConfigMapCAsChanged(nil)
	xdstest.Eventually(t, "every bundle withdrawn", func() bool {
		return !st.has(registry.CredentialTypeURL, registry.ConfigMapCredentialName("edge", "client-ca"))
	})
}

// TestAWasmPluginsPullSecretIsPublishedWithItsRegistryCredentialsOnly: a
// WasmPlugin's imagePullSecret publishes that dockerconfigjson Secret of
// its namespace with the registry credentials alone (for discovery to
// hand the agent), and withdraws it with the WasmPlugin; Secrets it does
// not name are not published.
func TestAWasmPluginsPullSecretIsPublishedWithItsRegistryCredentialsOnly(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "wasm")
	if err != nil {
		t.Fatal(err)
	}
	const docker = `{"auths":{"registry.example":{"auth":"dTpw"}}}`
	for _, s := range []*corev1.Secret{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "registry-pull", Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(docker)},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "unnamed-pull", Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(docker)},
		},
	} {
		if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := start(t)
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	wp := &extensionsv1alpha1.WasmPlugin{ObjectMeta: metav1.ObjectMeta{Name: "auth"}}
	wp.Spec.Url = "oci://registry.example/auth:1"
	wp.Spec.ImagePullSecret = "registry-pull"
	if _, err := ic.ExtensionsV1alpha1().WasmPlugins(ns).Create(ctx, wp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the pull secret published", func() bool {
		c := st.credential(ns + "/registry-pull")
		return c != nil && string(c.GetDockerConfig()) == docker && len(c.GetCertificateChain()) == 0
	})
	if st.has(registry.CredentialTypeURL, ns+"/unnamed-pull") {
		t.Error("a pull secret nothing names was published")
	}
	if err := ic.ExtensionsV1alpha1().WasmPlugins(ns).Delete(ctx, "auth", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the pull secret withdrawn", func() bool { return !st.has(registry.CredentialTypeURL, ns+"/registry-pull") })
}

// TestEachChangeOfAnIstioObjectIsTracedAndItsPublishingCarriesTheSpan:
// a change makes a span "kube.change" (validate, publish under it) whose
// publishing context the sink gets, so the change's trace goes on to the
// subscribers; an invalid change's span is an error and publishes nothing.
func TestEachChangeOfAnIstioObjectIsTracedAndItsPublishingCarriesTheSpan(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "traced")
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	st, _ := startWith(t, sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vs := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: "reviews"}}
	vs.Spec.Hosts = []string{"reviews"}
	vs.Spec.Http = []*networkingapi.HTTPRoute{{Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "reviews"}}}}}
	created, err := ic.NetworkingV1().VirtualServices(ns).Create(ctx, vs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	object := ns + "/reviews"
	changes := func() []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range spans.GetSpans() {
			for _, a := range s.Attributes {
				if s.Name == "kube.change" && a.Key == "object" && a.Value.AsString() == object {
					out = append(out, s)
				}
			}
		}
		return out
	}
	xdstest.Eventually(t, "the change's span", func() bool { return len(changes()) == 1 })
	change := changes()[0]
	children := map[string]trace.SpanContext{}
	for _, s := range spans.GetSpans() {
		if s.Parent.SpanID() == change.SpanContext.SpanID() {
			children[s.Name] = s.SpanContext
		}
	}
	st.mu.Lock()
	applied := st.applied
	st.mu.Unlock()
	if _, ok := children["validate"]; !ok || !applied.IsValid() || !children["publish"].Equal(applied) {
		t.Fatalf("under the change: %v; the sink got %v: want validate, and publish's span handed to the sink", children, applied)
	}

	created.Spec.Http[0].Route[0].Weight = 101 // invalid: weights are 0 to 100
	if _, err := ic.NetworkingV1().VirtualServices(ns).Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the refused change's span", func() bool { return len(changes()) == 2 })
	refused := changes()[1]
	if refused.Status.Code != codes.Error || !strings.Contains(refused.Status.Description, "weight 101") {
		t.Fatalf("the refused change's status: %+v", refused.Status)
	}
	for _, s := range spans.GetSpans() {
		if s.Parent.SpanID() == refused.SpanContext.SpanID() && s.Name == "publish" {
			t.Fatal("a refused change was published")
		}
	}
}

// TestAServiceEntrySelectsReadyPodsAsWellAsWorkloadEntries: a
// ServiceEntry's workloadSelector takes in the ready pods of its
// namespace that match, on the container port of each port's name (else
// its targetPort), as Istio's ServiceEntry controller takes them from the
// Kubernetes registry; a pod that stops being ready leaves, and deleting
// the ServiceEntry withdraws the set.
func TestAServiceEntrySelectsReadyPodsAsWellAsWorkloadEntries(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "sepods")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := start(t)
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}
	se.Spec.Hosts = []string{"legacy.internal"}
	se.Spec.Location = networkingapi.ServiceEntry_MESH_INTERNAL
	se.Spec.Resolution = networkingapi.ServiceEntry_STATIC
	se.Spec.Ports = []*networkingapi.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP", TargetPort: 8080}, {Number: 9000, Name: "admin", Protocol: "TCP"}}
	se.Spec.WorkloadSelector = &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "legacy"}}
	if _, err := ic.NetworkingV1().ServiceEntries(ns).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, ip string, ready bool) {
		t.Helper()
		p, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "legacy", "security.istio.io/tlsMode": "istio"}},
			Spec: corev1.PodSpec{ServiceAccountName: "legacy", Containers: []corev1.Container{{
				Name: "app", Image: "legacy", Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 9901}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}
		if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod("legacy-a", "10.1.7.1", true)
	pod("legacy-b", "10.1.7.2", false) // not ready: not an endpoint
	name := registry.EndpointSetName(ns, "legacy.internal", "pods-legacy")
	xdstest.Eventually(t, "the ready pod as the ServiceEntry's endpoint", func() bool {
		es := st.endpointSet(name)
		if es == nil || len(es.GetEndpoints()) != 1 {
			return false
		}
		ep := es.GetEndpoints()[0]
		ports := map[string]uint32{}
		for _, p := range ep.GetPorts() {
			ports[p.GetServicePortName()] = p.GetNumber()
		}
		return ep.GetAddress() == "10.1.7.1" && ep.GetWorkloadName() == "legacy-a" && ep.GetServiceAccount() == "legacy" &&
			ep.GetTlsMode() == registryv1.TLSMode_TLS_MODE_ISTIO && ports["http"] == 8080 && ports["admin"] == 9901
	})
	p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "legacy-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the pod that is no longer ready to leave", func() bool {
		es := st.endpointSet(name)
		return es != nil && len(es.GetEndpoints()) == 0
	})
	if err := ic.NetworkingV1().ServiceEntries(ns).Delete(ctx, "legacy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the set to be withdrawn", func() bool { return st.endpointSet(name) == nil })
}

// TestOnlyTheNamespacesTheMeshsDiscoverySelectorsSelectAreRead: with the
// mesh's discoverySelectors, galley publishes the Services and Istio
// objects of the namespaces whose labels a selector matches (Istio's
// discoveryNamespacesFilter); labelling another namespace publishes its
// objects, unlabelling withdraws them, and selectors removed from the
// mesh configuration read every namespace again.
func TestOnlyTheNamespacesTheMeshsDiscoverySelectorsSelectAreRead(t *testing.T) {
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	sys, err := env.CreateNamespace(ctx, "dssys")
	if err != nil {
		t.Fatal(err)
	}
	cms := env.Client.CoreV1().ConfigMaps(sys)
	mesh := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: MeshConfigMap}, Data: map[string]string{
		"mesh": "discoverySelectors:\n- matchLabels: {mesh: on}\n- matchExpressions: [{key: team, operator: In, values: [payments]}]\n",
	}}
	if _, err := cms.Create(ctx, mesh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := map[string]string{}
	for _, n := range []string{"in", "team", "out"} {
		name, err := env.CreateNamespace(ctx, "ds"+n)
		if err != nil {
			t.Fatal(err)
		}
		ns[n] = name
	}
	label := func(n string, labels map[string]string) {
		t.Helper()
		o, err := env.Client.CoreV1().Namespaces().Get(ctx, ns[n], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.Labels = labels
		if _, err := env.Client.CoreV1().Namespaces().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label("in", map[string]string{"mesh": "on"})
	label("team", map[string]string{"team": "payments"})
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"in", "team", "out"} {
		if _, err := env.Client.CoreV1().Services(ns[n]).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		vs := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
		vs.Spec.Hosts = []string{"web"}
		vs.Spec.Http = []*networkingapi.HTTPRoute{{Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "web"}}}}}
		if _, err := ic.NetworkingV1().VirtualServices(ns[n]).Create(ctx, vs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := startIn(t, nil, sys)
	read := func(n string) (svc, vs bool) {
		svc = st.has(registry.ServiceTypeURL, registry.ServiceName(ns[n], "web."+ns[n]+".svc.cluster.local"))
		vs = st.vsHosts(ns[n]+"/web") != nil
		return svc, vs
	}
	want := func(what string, in map[string]bool) {
		t.Helper()
		xdstest.Eventually(t, what, func() bool {
			for n, w := range in {
				if svc, vs := read(n); svc != w || vs != w {
					return false
				}
			}
			return true
		})
	}
	want("only the selected namespaces", map[string]bool{"in": true, "team": true, "out": false})
	label("out", map[string]string{"mesh": "on"})
	want("a namespace labelled to be selected", map[string]bool{"in": true, "team": true, "out": true})
	label("in", nil)
	want("a namespace no longer selected withdrawn", map[string]bool{"in": false, "team": true, "out": true})
	mesh.Data["mesh"] = "trustDomain: cluster.local\n"
	if _, err := cms.Update(ctx, mesh, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("every namespace without selectors", map[string]bool{"in": true, "team": true, "out": true})
}
