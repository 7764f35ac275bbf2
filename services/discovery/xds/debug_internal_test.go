package xds

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbachttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

func TestAConfigDumpNeverShowsAPrivateKey(t *testing.T) {
	inline := func(s string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte(s)}}
	}
	for name, s := range map[string]*tlsv3.Secret{
		"certificate": {Name: "kubernetes://gw", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline("CHAIN"), PrivateKey: inline("THE-KEY"), Password: inline("THE-PASSWORD"),
		}}},
		"generic": {Name: "token", Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{Secret: inline("THE-KEY")}}},
	} {
		a, err := anypb.New(s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := protojson.Marshal(redacted(a))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "VEhFLUtFWQ") || strings.Contains(string(out), "THE-") || !strings.Contains(string(out), "[redacted]") {
			t.Errorf("%s: %s", name, out)
		}
		if name == "certificate" && !strings.Contains(string(out), "Q0hBSU4") { // the chain, base64
			t.Errorf("the certificate chain went too: %s", out)
		}
	}
}

func TestAConfigDumpRedactsTheRegistryCredentialsOfAWasmModule(t *testing.T) {
	w := &wasmhttpv3.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
		EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: map[string]string{
			proxycontract.WasmPullSecretEnv: `{"auths":{"r":{"auth":"THE-KEY"}}}`, "TRUST_DOMAIN": "cluster.local",
		}},
	}}}}
	tc, err := anypb.New(w)
	if err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(&corev3.TypedExtensionConfig{Name: "x", TypedConfig: tc})
	if err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(redactedPullSecret(a))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(js), "THE-KEY") || !strings.Contains(string(js), "[redacted]") || !strings.Contains(string(js), "cluster.local") {
		t.Errorf("dump %s: want the pull secret redacted and the rest kept", js)
	}
	rbac, err := anypb.New(&rbachttpv3.RBAC{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := anypb.New(&corev3.TypedExtensionConfig{Name: "other", TypedConfig: rbac})
	if err != nil {
		t.Fatal(err)
	}
	if got := redactedPullSecret(other); !proto.Equal(got, other) {
		t.Errorf("a configuration that is not a Wasm module's changed: %v", got)
	}
}
