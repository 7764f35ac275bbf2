package translate

import (
	"cmp"
	"encoding/json"
	"net/url"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmnetworkv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// This file places the extensions (WasmPlugin, TrafficExtension) in the
// filter chains, as Istio's PopAppendHTTPTrafficExtension and
// PopAppendNetworkTrafficExtension, and builds the ECDS resources of the
// Wasm ones (InsertedTrafficExtensionConfigurations). A Wasm filter in a
// chain names its configuration, which Envoy asks for over ECDS (the
// agent fetches the module and points the configuration at the file); a
// Lua filter carries its script inline.

// The type URLs an extension's ECDS filter accepts: its Wasm
// configuration, or the RBAC filter the agent puts in its place when the
// module cannot be fetched (Istio's WasmHTTPFilterType,
// RBACHTTPFilterType and their network kin).
const (
	wasmHTTPType    = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	rbacHTTPType    = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
	wasmNetworkType = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm"
	rbacNetworkType = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC"
)

// wasmRuntime is the Wasm VM Envoy runs modules in (Istio's
// defaultRuntime).
const wasmRuntime = "envoy.wasm.runtime.v8"

// wasmFetchTimeout bounds the module's fetch (Istio's buildDataSource).
const wasmFetchTimeout = 30 * time.Second

// phased are the extension filters of one chain, by where they go:
// before the authentication filters, before the authorization filters,
// and after them (STATS, then unspecified).
type phased[F any] struct{ authn, authz, late []F }

// extensions are the proxy's extensions, nil for a client that runs none.
func (g *gen) extensions() []*model.Extension {
	if !g.client.extensions {
		return nil
	}
	return g.pc.Extensions(g.p)
}

// extensionsKey names the proxy's extensions, for the memo keys of what
// proxies share and holds their filters (outbound listeners).
func (g *gen) extensionsKey() string {
	var b strings.Builder
	for _, e := range g.extensions() {
		b.WriteString(e.Key() + ";")
	}
	return b.String()
}

// chainExtensions are the proxy's extensions that apply to a chain of a
// mode and port, network ones or HTTP ones.
func (g *gen) chainExtensions(mode model.WorkloadMode, port uint32, network bool) []*model.Extension {
	var out []*model.Extension
	for _, e := range g.extensions() {
		if e.IsNetwork() == network && e.Matches(mode, port) {
			out = append(out, e)
		}
	}
	return out
}

// byPhase sorts extensions into their places, keeping their order.
func byPhase[F any](es []*model.Extension, filter func(*model.Extension) F) phased[F] {
	var p phased[F]
	for _, ph := range []extensions.TrafficExtension_ExecutionPhase{
		extensions.TrafficExtension_AUTHN, extensions.TrafficExtension_AUTHZ,
		extensions.TrafficExtension_STATS, extensions.TrafficExtension_UNSPECIFIED,
	} {
		for _, e := range es {
			if e.Phase() != ph {
				continue
			}
			switch ph {
			case extensions.TrafficExtension_AUTHN:
				p.authn = append(p.authn, filter(e))
			case extensions.TrafficExtension_AUTHZ:
				p.authz = append(p.authz, filter(e))
			default:
				p.late = append(p.late, filter(e))
			}
		}
	}
	return p
}

// httpExtensions are the HTTP extension filters of a connection manager
// of a mode and port.
func (g *gen) httpExtensions(mode model.WorkloadMode, port uint32) phased[*hcmv3.HttpFilter] {
	return byPhase(g.chainExtensions(mode, port, false), g.extensionHTTPFilter)
}

// networkExtensions are the network extension filters of a TCP chain of
// a mode and port.
func (g *gen) networkExtensions(mode model.WorkloadMode, port uint32) phased[*listenerv3.Filter] {
	return byPhase(g.chainExtensions(mode, port, true), func(e *model.Extension) *listenerv3.Filter {
		return &listenerv3.Filter{Name: e.ResourceName, ConfigType: &listenerv3.Filter_ConfigDiscovery{ConfigDiscovery: extensionSource(wasmNetworkType, rbacNetworkType)}}
	})
}

// extensionHTTPFilter is an extension's HTTP filter: a Lua script inline,
// a Wasm module's configuration over ECDS (Istio's
// toEnvoyHTTPTrafficExtension).
func (g *gen) extensionHTTPFilter(e *model.Extension) *hcmv3.HttpFilter {
	if lua := e.Spec.GetLua(); lua != nil {
		return &hcmv3.HttpFilter{Name: e.ResourceName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&luav3.Lua{
			DefaultSourceCode: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: lua.GetInlineCode()}},
		})}}
	}
	return &hcmv3.HttpFilter{Name: e.ResourceName, ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{ConfigDiscovery: extensionSource(wasmHTTPType, rbacHTTPType)}}
}

// extensionSource asks for a filter's configuration over ADS, and holds
// the listener until it arrives (Istio's defaultConfigSource: an
// extension may be what authenticates or authorizes requests).
func extensionSource(typeURLs ...string) *corev3.ExtensionConfigSource {
	src := adsSource()
	src.InitialFetchTimeout = durationpb.New(0)
	return &corev3.ExtensionConfigSource{ConfigSource: src, TypeUrls: typeURLs}
}

// policyHTTPFilters are what an HTTP connection manager of a mode and
// port runs before its fault, CORS, stats and router filters: the
// workload's authorization w (nil for outbound) with the extensions
// placed around it, as Istio's buildHTTPConnectionManager: CUSTOM
// authorization, AUTHN extensions, the JWT filter, AUTHZ extensions,
// RBAC, STATS and unspecified extensions.
func (g *gen) policyHTTPFilters(w *workloadAuthz, mode model.WorkloadMode, port uint32) []*hcmv3.HttpFilter {
	ext := g.httpExtensions(mode, port)
	if w == nil {
		w = &workloadAuthz{}
	}
	custom, jwt, rbac := w.httpParts()
	return concat(custom, ext.authn, jwt, ext.authz, rbac, ext.late)
}

// policyNetworkFilters are the network filters of a TCP chain of a mode
// and port before its stats and tcp_proxy filters: the workload's
// authorization w (nil for outbound) with the extensions placed around
// it, as Istio's buildCompleteNetworkFilters: CUSTOM authorization,
// AUTHN and AUTHZ extensions, RBAC, STATS and unspecified extensions.
func (g *gen) policyNetworkFilters(w *workloadAuthz, mode model.WorkloadMode, port uint32) []*listenerv3.Filter {
	ext := g.networkExtensions(mode, port)
	if w == nil {
		w = &workloadAuthz{}
	}
	custom, rbac := w.tcpParts()
	return concat(custom, ext.authn, ext.authz, rbac, ext.late)
}

// concat joins lists into a new one (nil when all are empty).
func concat[F any](lists ...[]F) []F {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	if n == 0 {
		return nil
	}
	out := make([]F, 0, n)
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// extensionConfig is a Wasm extension's ECDS resource: Envoy's Wasm
// filter, HTTP or network, with the module to fetch (Istio's
// buildWasmConfig and buildVMConfig); nil, reported, when it does not
// validate.
func (g *gen) extensionConfig(e *model.Extension) *corev3.TypedExtensionConfig {
	wasm := e.Spec.GetWasm()
	// No pluginConfig: no configuration (Istio sends an empty Any, which
	// Envoy reads as the same empty configuration).
	var cfg *anypb.Any
	if pc := wasm.GetPluginConfig(); len(pc.GetFields()) > 0 {
		// encoding/json: stable bytes (protojson's vary on purpose).
		js, err := json.Marshal(pc.AsMap())
		if err != nil {
			g.problem("%s: pluginConfig: %v; left out", e.Key(), err)
			return nil
		}
		cfg = g.pack(wrapperspb.String(string(js)))
	}
	plugin := &wasmv3.PluginConfig{
		Name:          e.Namespace + "." + strings.TrimPrefix(e.ResourceName, model.ExtensionResourcePrefix+e.Namespace+"."),
		RootId:        wasm.GetPluginName(),
		Configuration: cfg,
		Vm:            &wasmv3.PluginConfig_VmConfig{VmConfig: g.wasmVM(e)},
	}
	switch wasm.GetFailStrategy() {
	case extensions.FailStrategy_FAIL_OPEN:
		plugin.FailurePolicy = wasmv3.FailurePolicy_FAIL_OPEN
	case extensions.FailStrategy_FAIL_CLOSE:
		plugin.FailurePolicy = wasmv3.FailurePolicy_FAIL_CLOSED
	case extensions.FailStrategy_FAIL_RELOAD:
		plugin.FailurePolicy = wasmv3.FailurePolicy_FAIL_RELOAD
	}
	var filter proto.Message = &wasmhttpv3.Wasm{Config: plugin}
	if e.IsNetwork() {
		filter = &wasmnetworkv3.Wasm{Config: plugin}
	}
	if err := Validate(filter); err != nil {
		g.problem("%s: its Wasm configuration does not validate: %v; left out", e.Key(), err)
		return nil
	}
	return &corev3.TypedExtensionConfig{Name: e.ResourceName, TypedConfig: g.pack(filter)}
}

// wasmVM is the VM an extension's module runs in: where the module comes
// from (a local file, or a remote one the agent fetches: oci:// when the
// URL names no scheme) and its environment, with the keys that tell the
// agent how to fetch it.
func (g *gen) wasmVM(e *model.Extension) *wasmv3.VmConfig {
	wasm := e.Spec.GetWasm()
	vm := &wasmv3.VmConfig{Runtime: wasmRuntime, EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: map[string]string{}}}
	u, _ := url.Parse(wasm.GetUrl()) // parsed when the extension was read
	if u.Scheme == "" {
		u.Scheme = "oci"
	}
	if u.Scheme == "file" {
		vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
			Specifier: &corev3.DataSource_Filename{Filename: strings.TrimPrefix(wasm.GetUrl(), "file://")},
		}}}
	} else {
		vm.Code = &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{
			HttpUri: &corev3.HttpUri{
				Uri: u.String(), Timeout: durationpb.New(wasmFetchTimeout),
				// The agent fetches it: no cluster does.
				HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: "_"},
			},
			Sha256: cmp.Or(wasm.GetSha256(), proxycontract.WasmNoDigest),
		}}}
	}
	kv := vm.EnvironmentVariables.KeyValues
	if s := wasm.GetImagePullSecret(); s != "" {
		kv[proxycontract.WasmPullSecretEnv] = g.pullSecret(e.Namespace, s)
	}
	if p := wasm.GetImagePullPolicy(); p != extensions.PullPolicy_UNSPECIFIED_POLICY {
		kv[proxycontract.WasmPullPolicyEnv] = p.String()
	}
	kv[proxycontract.WasmResourceVersionEnv] = e.Version
	for _, env := range wasm.GetVmConfig().GetEnv() {
		switch env.GetValueFrom() {
		case extensions.EnvValueSource_INLINE:
			kv[env.GetName()] = env.GetValue()
		case extensions.EnvValueSource_HOST:
			vm.EnvironmentVariables.HostEnvKeys = append(vm.EnvironmentVariables.HostEnvKeys, env.GetName())
		}
	}
	return vm
}

// pullSecret is the registry credentials an extension's imagePullSecret
// names, for the agent: the dockerconfigjson Secret of that name in the
// extension's namespace (where Istio reads it), sent only to a proxy
// whose identity discovery verified (Istio's GeneratePullSecrets). ""
// when there is none: the agent then does not fetch the module, and the
// extension's failStrategy applies.
func (g *gen) pullSecret(namespace, name string) string {
	if g.p.VerifiedNamespace == "" {
		return ""
	}
	return string(g.pc.Credential(namespace, strings.TrimPrefix(name, registry.CredentialPrefix)).GetDockerConfig())
}
