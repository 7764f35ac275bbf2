package wasm

import (
	"bytes"
	"context"
	"testing"
	"time"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	netwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// plugin describes a Wasm ECDS resource as istiod builds it.
type plugin struct {
	name, uri, sha string
	env            map[string]string
	policy         wasmv3.FailurePolicy
	network        bool
}

func (p plugin) config() *wasmv3.PluginConfig {
	vm := &wasmv3.VmConfig{Runtime: "envoy.wasm.runtime.v8", Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{
		Remote: &corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: p.uri, Timeout: durationpb.New(5 * time.Second)}, Sha256: p.sha},
	}}}
	if p.env != nil {
		vm.EnvironmentVariables = &wasmv3.EnvironmentVariables{KeyValues: p.env}
	}
	return &wasmv3.PluginConfig{Name: p.name, Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: vm}, FailurePolicy: p.policy}
}

func (p plugin) resource(tb testing.TB) *anypb.Any {
	tb.Helper()
	var msg proto.Message = &httpwasmv3.Wasm{Config: p.config()}
	if p.network {
		msg = &netwasmv3.Wasm{Config: p.config()}
	}
	return extensionConfig(tb, p.name, msg)
}

func extensionConfig(tb testing.TB, name string, msg proto.Message) *anypb.Any {
	tb.Helper()
	tc, err := anypb.New(msg)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := anypb.New(&corev3.TypedExtensionConfig{Name: name, TypedConfig: tc})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func decodeExtension(t *testing.T, r *anypb.Any) (*corev3.TypedExtensionConfig, proto.Message) {
	t.Helper()
	ec := &corev3.TypedExtensionConfig{}
	if err := r.UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	msg, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return ec, msg
}

func TestARemoteWasmFilterIsRewrittenToTheCachedFile(t *testing.T) {
	srv := newModuleServer(t)
	module := wasmModule(t, 64)
	u := srv.serve("/m.wasm", module)
	c := newCache(t, nil)
	resources := []*anypb.Any{
		plugin{name: "shop.auth", uri: u, env: map[string]string{
			envPullPolicy: "IfNotPresent", envResourceVersion: "7", "ISTIO_META_OTHER": "x", "GREETING": "hi",
		}}.resource(t),
		plugin{name: "shop.tcp", uri: u, sha: "nil", network: true, env: map[string]string{envResourceVersion: "7"}}.resource(t),
	}
	if err := c.Convert(ctxOf(t), resources); err != nil {
		t.Fatal(err)
	}
	ec, msg := decodeExtension(t, resources[0])
	w, ok := msg.(*httpwasmv3.Wasm)
	if !ok || ec.GetName() != "shop.auth" {
		t.Fatalf("got %s %T", ec.GetName(), msg)
	}
	vm := w.GetConfig().GetVmConfig()
	file := vm.GetCode().GetLocal().GetFilename()
	if file == "" || !bytes.Equal(mustRead(t, file), module) {
		t.Fatalf("the code is %v", vm.GetCode())
	}
	if kv := vm.GetEnvironmentVariables().GetKeyValues(); len(kv) != 1 || kv["GREETING"] != "hi" {
		t.Fatalf("environment %v: the ISTIO_META_ variables are not stripped", kv)
	}
	_, msg = decodeExtension(t, resources[1])
	nw, ok := msg.(*netwasmv3.Wasm)
	if !ok || nw.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename() != file {
		t.Fatalf("network filter: %v", msg)
	}
	if nw.GetConfig().GetVmConfig().GetEnvironmentVariables() != nil {
		t.Fatal("an environment of ISTIO_META_ variables only is not dropped")
	}
	if srv.requests.Load() != 1 {
		t.Fatalf("%d requests for one module", srv.requests.Load())
	}
}

func TestAFilterInATypedStructIsRewritten(t *testing.T) {
	srv := newModuleServer(t)
	module := wasmModule(t, 8)
	u := srv.serve("/m.wasm", module)
	js, err := protojson.Marshal(&httpwasmv3.Wasm{Config: plugin{name: "p", uri: u}.config()})
	if err != nil {
		t.Fatal(err)
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(js, st); err != nil {
		t.Fatal(err)
	}
	resources := []*anypb.Any{extensionConfig(t, "p", &udpav1.TypedStruct{TypeUrl: httpWasmType, Value: st})}
	if err := newCache(t, nil).Convert(ctxOf(t), resources); err != nil {
		t.Fatal(err)
	}
	_, msg := decodeExtension(t, resources[0])
	if w, ok := msg.(*httpwasmv3.Wasm); !ok || !bytes.Equal(mustRead(t, w.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()), module) {
		t.Fatalf("got %v", msg)
	}
}

func TestAFailedFetchBecomesRBACByTheFailurePolicy(t *testing.T) {
	srv := newModuleServer(t)
	missing := srv.URL + "/missing.wasm"
	for _, tc := range []struct {
		name    string
		p       plugin
		allow   bool
		network bool
	}{
		{"fail open", plugin{policy: wasmv3.FailurePolicy_FAIL_OPEN}, true, false},
		{"fail closed", plugin{policy: wasmv3.FailurePolicy_FAIL_CLOSED}, false, false},
		{"unspecified", plugin{}, false, false},
		{"fail reload", plugin{policy: wasmv3.FailurePolicy_FAIL_RELOAD}, false, false},
		{"network fail open", plugin{policy: wasmv3.FailurePolicy_FAIL_OPEN, network: true}, true, true},
		{"network fail closed", plugin{network: true}, false, true},
		{"secret named but missing", plugin{policy: wasmv3.FailurePolicy_FAIL_OPEN, env: map[string]string{envPullSecret: ""}}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.name, tc.p.uri = "shop.plugin", missing
			resources := []*anypb.Any{tc.p.resource(t)}
			if err := newCache(t, nil).Convert(ctxOf(t), resources); err != nil {
				t.Fatal(err)
			}
			ec, msg := decodeExtension(t, resources[0])
			if ec.GetName() != "shop.plugin" {
				t.Fatalf("name %q", ec.GetName())
			}
			switch r := msg.(type) {
			case *httprbacv3.RBAC:
				if tc.network || (r.GetRules() == nil) != tc.allow {
					t.Fatalf("got %v", r)
				}
			case *netrbacv3.RBAC:
				if !tc.network || (r.GetRules() == nil) != tc.allow {
					t.Fatalf("got %v", r)
				}
			default:
				t.Fatalf("got %T", msg)
			}
		})
	}
	if n := srv.requests.Load(); n == 0 {
		t.Fatal("nothing was fetched")
	}
}

func TestAResourceThatIsNotRemoteWasmIsUntouched(t *testing.T) {
	router := extensionConfig(t, "router", &routerv3.Router{})
	local := extensionConfig(t, "local", &httpwasmv3.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
		Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: "/x.wasm"}}}},
	}}}})
	resources := []*anypb.Any{router, local}
	if err := newCache(t, nil).Convert(ctxOf(t), resources); err != nil {
		t.Fatal(err)
	}
	if resources[0] != router || resources[1] != local {
		t.Fatal("changed")
	}
}

func TestAnUndecodableResourceIsAnError(t *testing.T) {
	noConfig, err := anypb.New(&corev3.TypedExtensionConfig{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	badWasm, err := anypb.New(&corev3.TypedExtensionConfig{Name: "x", TypedConfig: &anypb.Any{TypeUrl: httpWasmType, Value: []byte{0xff}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*anypb.Any{
		"garbage":           {TypeUrl: typePrefix + "envoy.config.core.v3.TypedExtensionConfig", Value: []byte{0xff, 0xff}},
		"wrong type":        {TypeUrl: typePrefix + "envoy.config.listener.v3.Listener"},
		"no typed config":   noConfig,
		"wasm without code": extensionConfig(t, "x", &httpwasmv3.Wasm{}),
		"undecodable wasm":  badWasm,
	} {
		t.Run(name, func(t *testing.T) {
			ok := extensionConfig(t, "router", &routerv3.Router{})
			resources := []*anypb.Any{r, ok}
			if err := newCache(t, nil).Convert(ctxOf(t), resources); err == nil {
				t.Fatal("no error")
			}
			if resources[1] != ok {
				t.Fatal("the other resource changed")
			}
		})
	}
}

// istioMetric is the value of an Istio metric with the given attribute.
func istioMetric(t *testing.T, reader *sdkmetric.ManualReader, metric string, attr attribute.KeyValue) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != metric {
				continue
			}
			if s, ok := m.Data.(metricdata.Sum[float64]); ok {
				for _, dp := range s.DataPoints {
					if v, ok := dp.Attributes.Value(attr.Key); ok && v == attr.Value {
						return dp.Value
					}
				}
			}
		}
	}
	return 0
}

func TestConversionsAndFetchesAreCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	srv := newModuleServer(t)
	u := srv.serve("/m.wasm", wasmModule(t, 8))
	c := newCache(t, func(o *Options) { o.IstioMeter = mp.Meter("istio") })
	resources := []*anypb.Any{plugin{name: "a", uri: u}.resource(t), plugin{name: "b", uri: srv.URL + "/missing"}.resource(t)}
	if err := c.Convert(ctxOf(t), resources); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		metric string
		attr   attribute.KeyValue
	}{
		{"istio_agent_wasm_config_conversion_count", attribute.String("result", resultSuccess)},
		{"istio_agent_wasm_config_conversion_count", attribute.String("result", resultFetchFailure)},
		{"istio_agent_wasm_remote_fetch_count", attribute.String("result", resultSuccess)},
		{"istio_agent_wasm_remote_fetch_count", attribute.String("result", resultDownloadFailure)},
	} {
		if v := istioMetric(t, reader, want.metric, want.attr); v != 1 {
			t.Errorf("%s{%s}: %v, want 1", want.metric, want.attr.Value.String(), v)
		}
	}
}
