package translate

import (
	"testing"

	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	"google.golang.org/protobuf/types/known/anypb"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// TestAModulesPullSecretGoesOnlyToAProxyWhoseIdentityWasVerified: the
// registry credentials an imagePullSecret names reach a proxy discovery
// verified (Istio's GeneratePullSecrets), and no other: an unverified
// one gets the key empty, and its agent does not fetch.
func TestAModulesPullSecretGoesOnlyToAProxyWhoseIdentityWasVerified(t *testing.T) {
	store, proxies, opts := loadCase(t, "testdata/extensions/input.yaml")
	const docker = `{"auths":{"registry.example":{"auth":"dTpw"}}}`
	body, err := anypb.New(&registryv1.Credential{Namespace: "bookinfo", Name: "registry-pull", DockerConfig: []byte(docker)})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(registry.CredentialTypeURL, registry.CredentialName("bookinfo", "registry-pull"), model.Meta{}, body); err != nil {
		t.Fatal(err)
	}
	pc, _ := store.Build(opts, nil, 1)
	const name = "extensions.istio.io/trafficextension/bookinfo.basic-auth~istio-translated-wasmplugin"
	secretOf := func(verified string) (string, bool) {
		src := proxies[0].Proxy // reviews-a
		p := &model.Proxy{
			Type: src.Type, IPs: src.IPs, ID: src.ID, DNSDomain: src.DNSDomain, Namespace: src.Namespace, Labels: src.Labels,
			VerifiedNamespace: verified,
		}
		ecs := NewGenerator(pc, p).ExtensionConfigs([]string{name})
		if len(ecs) != 1 {
			t.Fatalf("%d extension configurations for %s, want 1", len(ecs), name)
		}
		w := &wasmhttpv3.Wasm{}
		if err := ecs[0].GetTypedConfig().UnmarshalTo(w); err != nil {
			t.Fatal(err)
		}
		v, ok := w.GetConfig().GetVmConfig().GetEnvironmentVariables().GetKeyValues()[proxycontract.WasmPullSecretEnv]
		return v, ok
	}
	if v, ok := secretOf("bookinfo"); !ok || v != docker {
		t.Errorf("verified proxy: pull secret %q, want the Secret's registry credentials", v)
	}
	if v, ok := secretOf(""); !ok || v != "" {
		t.Errorf("unverified proxy: pull secret %q (present %v), want the key, empty", v, ok)
	}
}
