package xds_test

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// wasmPlugin is a WasmPlugin in default selecting app=a.
func wasmPlugin(url string) *istio.Object {
	k, _ := istio.ByName(istio.WasmPlugin)
	return &istio.Object{Kind: k, Meta: istio.Meta{Name: "auth", Namespace: "default"}, Spec: &extensions.WasmPlugin{
		Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}},
		Url:      url, Phase: extensions.PluginPhase_AUTHN, ImagePullSecret: "registry-pull",
	}}
}

const authECDS = "extensions.istio.io/trafficextension/default.auth~istio-translated-wasmplugin"

// ecdsWatch opens a stream for a sidecar of labels app=app that asks for
// its listeners, then for the ECDS resource name, and returns the stream
// and the first ECDS response.
func (h *harness) ecdsWatch(t *testing.T, id, app string) (*sotw, *discoveryv3.DiscoveryResponse) {
	t.Helper()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(id, map[string]any{"LABELS": map[string]any{"app": app}}), TypeUrl: resourcev3.ListenerType})
	s.send(t, ack(s.next(t)))
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ExtensionConfigType, ResourceNames: []string{authECDS}})
	r := s.next(t)
	if r.GetTypeUrl() != resourcev3.ExtensionConfigType {
		t.Fatalf("got %s, want the extension configuration", r.GetTypeUrl())
	}
	s.send(t, ack(r, authECDS))
	return s, r
}

// wasmOf decodes the one Wasm filter configuration of an ECDS response
// (nil when it holds none).
func wasmOf(t *testing.T, r *discoveryv3.DiscoveryResponse) *wasmhttpv3.Wasm {
	t.Helper()
	if len(r.GetResources()) == 0 {
		return nil
	}
	ec := &corev3.TypedExtensionConfig{}
	if err := r.GetResources()[0].UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	w := &wasmhttpv3.Wasm{}
	if err := ec.GetTypedConfig().UnmarshalTo(w); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestAWasmPluginReachesOverECDSTheProxiesItSelectsAndItsChangesOnlyThem(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	h.store.PutObject(wasmPlugin("oci://registry.example/auth:1"))
	h.push()

	sa, ra := h.ecdsWatch(t, "sidecar~10.1.0.9~a-1.default~default.svc.cluster.local", "a")
	w := wasmOf(t, ra)
	if w == nil {
		t.Fatal("the selected proxy got no Wasm configuration")
	}
	if got := w.GetConfig().GetVmConfig().GetCode().GetRemote().GetHttpUri().GetUri(); got != "oci://registry.example/auth:1" {
		t.Errorf("module %q, want the WasmPlugin's", got)
	}
	// Discovery verified no identity here (plaintext): the pull secret's
	// key is there for the agent, but empty, as Istio's for an
	// unverified proxy.
	if v, ok := w.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues()[proxycontract.WasmPullSecretEnv]; !ok || v != "" {
		t.Errorf("pull secret %q (present %v), want the key with no credentials for an unverified proxy", v, ok)
	}
	sb, rb := h.ecdsWatch(t, "sidecar~10.1.0.10~b-1.default~default.svc.cluster.local", "b")
	if w := wasmOf(t, rb); w != nil {
		t.Fatalf("a proxy the WasmPlugin does not select got its configuration: %v", w)
	}

	h.store.PutObject(wasmPlugin("oci://registry.example/auth:2"))
	h.push()
	for {
		r := sa.next(t)
		if r.GetTypeUrl() != resourcev3.ExtensionConfigType {
			sa.send(t, ack(r))
			continue
		}
		if got := wasmOf(t, r).GetConfig().GetVmConfig().GetCode().GetRemote().GetHttpUri().GetUri(); got != "oci://registry.example/auth:2" {
			t.Fatalf("after the change: module %q, want the new one", got)
		}
		break
	}
	sb.nothing(t, 300*time.Millisecond)
}
