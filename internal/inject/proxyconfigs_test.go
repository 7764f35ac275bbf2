package inject

import (
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1beta1 "istio.io/api/networking/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

func proxyConfigObject(ns, name string, created int, spec *networkingv1beta1.ProxyConfig) *istio.Object {
	k, _ := istio.ByName(istio.ProxyConfig)
	return &istio.Object{Kind: k, Meta: istio.Meta{Namespace: ns, Name: name, CreationTime: time.Unix(int64(created), 0)}, Spec: spec}
}

// TestTheProxyConfigOfAPodIsIstiosEffectiveProxyConfig: the root
// namespace's ProxyConfig, then the pod namespace's, then the pod's
// annotation, then the first ProxyConfig selecting the pod (Istio's
// EffectiveProxyConfig), each winning for what it sets; what it comes to
// reaches the sidecar: PROXY_CONFIG, the environment, the held start.
func TestTheProxyConfigOfAPodIsIstiosEffectiveProxyConfig(t *testing.T) {
	pcs := NewProxyConfigs("istio-system", nil, []*istio.Object{
		proxyConfigObject("shop", "reviews-newer", 3, &networkingv1beta1.ProxyConfig{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "reviews"}}, Concurrency: wrapperspb.Int32(8),
		}),
		proxyConfigObject("shop", "reviews", 2, &networkingv1beta1.ProxyConfig{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "reviews"}}, Concurrency: wrapperspb.Int32(4),
		}),
		proxyConfigObject("shop", "shop-wide", 1, &networkingv1beta1.ProxyConfig{EnvironmentVariables: map[string]string{"B": "ns", "C": "ns"}}),
		proxyConfigObject("istio-system", "mesh", 1, &networkingv1beta1.ProxyConfig{
			Concurrency: wrapperspb.Int32(1), EnvironmentVariables: map[string]string{"A": "root", "B": "root"},
		}),
		proxyConfigObject("other", "elsewhere", 1, &networkingv1beta1.ProxyConfig{Concurrency: wrapperspb.Int32(16)}),
	})
	values := DefaultValues()
	values.ProxyConfigs = pcs
	p := pod(func(p *corev1.Pod) {
		p.Namespace = "shop"
		p.Labels = map[string]string{"app": "reviews"}
		p.Annotations = map[string]string{AnnotationProxyConfig: "concurrency: 3\nholdApplicationUntilProxyStarts: true\nproxyMetadata: {C: annotation, D: annotation}\n"}
	})
	out, err := defaultTemplate(t).Inject(p, values)
	if err != nil {
		t.Fatal(err)
	}
	proxy := container(out, ProxyContainer)
	env := envOf(proxy)
	var pc struct {
		Concurrency   int               `json:"concurrency"`
		ProxyMetadata map[string]string `json:"proxyMetadata"`
	}
	if err := json.Unmarshal([]byte(env["PROXY_CONFIG"]), &pc); err != nil {
		t.Fatalf("PROXY_CONFIG %q: %v", env["PROXY_CONFIG"], err)
	}
	if pc.Concurrency != 4 {
		t.Errorf("concurrency %d, want the oldest selecting ProxyConfig's 4 (over the annotation's 3 and the root's 1)", pc.Concurrency)
	}
	// The init container gets the same variables, as Istio's istio-init
	// (ISTIO_META_DNS_CAPTURE captures the pod's DNS).
	initEnv := envOf(container(out, InitContainer))
	for k, want := range map[string]string{"A": "root", "B": "ns", "C": "annotation", "D": "annotation"} {
		if pc.ProxyMetadata[k] != want || env[k] != want || initEnv[k] != want {
			t.Errorf("%s: proxyMetadata %q, environment %q, init container's %q, want %q", k, pc.ProxyMetadata[k], env[k], initEnv[k], want)
		}
	}
	if proxy.Lifecycle == nil {
		t.Error("the annotation's holdApplicationUntilProxyStarts is not applied")
	}
	// A pod of another namespace gets the root namespace's alone.
	other := pod(func(p *corev1.Pod) { p.Namespace = "web" })
	out, err = defaultTemplate(t).Inject(other, values)
	if err != nil {
		t.Fatal(err)
	}
	if env := envOf(container(out, ProxyContainer)); env["A"] != "root" || env["C"] != "" || env["PROXY_CONFIG"] != `{"concurrency":1,"proxyMetadata":{"A":"root","B":"root"}}` {
		t.Errorf("a pod of namespace web: %v", env)
	}
}

func TestTheImageTypeTagsIstiosImageAndNeverFlotillasOrAPodsOwn(t *testing.T) {
	pv2 := proxyV2(t, "default", "proxyImage: docker.io/istio/proxyv2:1.32.0\n")
	pv2.Values.ProxyConfigs = NewProxyConfigs("istio-system", nil, []*istio.Object{
		proxyConfigObject("istio-system", "mesh", 1, &networkingv1beta1.ProxyConfig{Image: &networkingv1beta1.ProxyImage{ImageType: "distroless"}}),
	})
	for _, tc := range []struct {
		annotations map[string]string
		want        string
	}{
		{nil, "docker.io/istio/proxyv2:1.32.0-distroless"},
		{map[string]string{AnnotationProxyImageType: "debug"}, "docker.io/istio/proxyv2:1.32.0-debug"},
		{map[string]string{AnnotationProxyImageType: "default"}, "docker.io/istio/proxyv2:1.32.0"},
		{map[string]string{AnnotationProxyImage: "registry.local/proxy:mine"}, "registry.local/proxy:mine"},
	} {
		out, err := pv2.Template.Inject(pod(func(p *corev1.Pod) { p.Annotations = tc.annotations }), pv2.Values)
		if err != nil {
			t.Fatal(err)
		}
		if got := container(out, ProxyContainer).Image; got != tc.want {
			t.Errorf("%v: image %q, want %q", tc.annotations, got, tc.want)
		}
	}
	if _, err := pv2.Template.Inject(pod(func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationProxyImageType: "tiny"} }), pv2.Values); err == nil {
		t.Error("an unknown image type accepted")
	}
	flotilla := DefaultValues()
	flotilla.ProxyConfigs = pv2.Values.ProxyConfigs
	out, err := defaultTemplate(t).Inject(pod(nil), flotilla)
	if err != nil {
		t.Fatal(err)
	}
	if got := container(out, ProxyContainer).Image; got != DefaultValues().ProxyImage {
		t.Errorf("Flotilla's image %q changed by the image type", got)
	}
}
