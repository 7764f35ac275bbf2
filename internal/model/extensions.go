package model

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strings"

	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// ExtensionResourcePrefix begins the name of an extension's filter and
// of its ECDS resource (Istio's TrafficExtensionResourceNamePrefix).
const ExtensionResourcePrefix = "extensions.istio.io/trafficextension/"

// translatedWasmPlugin marks the name of the TrafficExtension a WasmPlugin
// is served as (Istio's syntheticMarker: "~" is in no Kubernetes name, so
// it names no real TrafficExtension).
const translatedWasmPlugin = "~istio-translated-wasmplugin"

// maxLuaCodeBytes bounds a Lua script served (Istio's 64 KiB).
const maxLuaCodeBytes = 64 << 10

// Extension is a TrafficExtension, or a WasmPlugin as Istio 1.32 serves
// it: converted to a TrafficExtension (translateWasmPlugin). A Wasm
// extension reaches Envoy over ECDS; a Lua one inline.
type Extension struct {
	// Kind is the object's kind (WasmPlugin or TrafficExtension); Name
	// and Namespace its own.
	Kind, Name, Namespace string
	Spec                  *extensions.TrafficExtension
	// ResourceName names its filter in the chains and its ECDS resource:
	// "extensions.istio.io/trafficextension/<namespace>.<name>", and for
	// a WasmPlugin the name marked as Istio marks it.
	ResourceName string
	// Version is the object's version: a new one makes the agent pull a
	// module again under the Always policy.
	Version string
}

// Key is "Kind/namespace/name".
func (e *Extension) Key() string { return ObjectKey(e.Kind, e.Namespace, e.Name) }

// Phase is where its filter goes in a chain.
func (e *Extension) Phase() extensions.TrafficExtension_ExecutionPhase { return e.Spec.GetPhase() }

// IsNetwork reports whether it is a network (L4) filter; else it is an
// HTTP filter (Istio's filterChainTypeFromPluginType: unspecified is
// HTTP; Lua is HTTP only).
func (e *Extension) IsNetwork() bool {
	return e.Spec.GetWasm() != nil && e.Spec.GetWasm().GetType() == extensions.PluginType_NETWORK
}

// Matches reports whether it applies to a listener of a mode (ClientMode
// for outbound and gateway listeners, ServerMode for inbound) and port
// (Istio's matchTrafficExtensionSelectors: no match applies everywhere;
// else any match whose mode and ports take the listener).
func (e *Extension) Matches(mode WorkloadMode, port uint32) bool {
	ms := e.Spec.GetMatch()
	if len(ms) == 0 {
		return true
	}
	for _, m := range ms {
		switch m.GetMode() {
		case typev1beta1.WorkloadMode_UNDEFINED, typev1beta1.WorkloadMode_CLIENT_AND_SERVER:
		case typev1beta1.WorkloadMode_CLIENT:
			if mode != ClientMode {
				continue
			}
		case typev1beta1.WorkloadMode_SERVER:
			if mode != ServerMode {
				continue
			}
		}
		if len(m.GetPorts()) == 0 || slices.ContainsFunc(m.GetPorts(), func(p *typev1beta1.PortSelector) bool { return p.GetNumber() != 0 && p.GetNumber() == port }) {
			return true
		}
	}
	return false
}

// newExtension converts a WasmPlugin or a TrafficExtension as Istio's
// translateWasmPlugin and convertToTrafficExtensionWrapper: nil, with
// the reason, for one Istio leaves out (no module URL, one that does not
// parse, neither Wasm nor Lua, an empty or oversized script).
func newExtension(o *istio.Object) (*Extension, error) {
	e := &Extension{Kind: o.Kind.Kind, Name: o.Meta.Name, Namespace: o.Meta.Namespace, Version: o.Meta.ResourceVersion}
	switch spec := o.Spec.(type) {
	case *extensions.WasmPlugin:
		e.Spec = wasmPluginAsExtension(spec)
		e.ResourceName = ExtensionResourcePrefix + o.Meta.Namespace + "." + o.Meta.Name + translatedWasmPlugin
	case *extensions.TrafficExtension:
		e.Spec = spec
		e.ResourceName = ExtensionResourcePrefix + o.Meta.Namespace + "." + o.Meta.Name
	default:
		return nil, fmt.Errorf("%s is not an extension", o.Kind.Kind)
	}
	switch wasm, lua := e.Spec.GetWasm(), e.Spec.GetLua(); {
	case wasm != nil:
		if wasm.GetUrl() == "" {
			return nil, fmt.Errorf("wasm.url is required")
		}
		if _, err := url.Parse(wasm.GetUrl()); err != nil {
			return nil, fmt.Errorf("wasm.url: %w", err)
		}
	case lua != nil:
		if n := len(lua.GetInlineCode()); n == 0 || n > maxLuaCodeBytes {
			return nil, fmt.Errorf("lua.inlineCode must hold 1 to %d bytes, not %d", maxLuaCodeBytes, n)
		}
	default:
		return nil, fmt.Errorf("neither wasm nor lua is set")
	}
	return e, nil
}

// wasmPluginAsExtension is Istio's translateWasmPlugin: the same
// selection, phase, priority and match, the module as its Wasm config
// (targetRef, deprecated, folded into targetRefs).
func wasmPluginAsExtension(wp *extensions.WasmPlugin) *extensions.TrafficExtension {
	refs := wp.GetTargetRefs()
	if wp.GetTargetRef() != nil && len(refs) == 0 {
		refs = []*typev1beta1.PolicyTargetReference{wp.GetTargetRef()}
	}
	var match []*extensions.TrafficSelector
	for _, m := range wp.GetMatch() {
		if m != nil {
			match = append(match, &extensions.TrafficSelector{Mode: m.GetMode(), Ports: m.GetPorts()})
		}
	}
	return &extensions.TrafficExtension{
		Selector: wp.GetSelector(), TargetRefs: refs,
		// The phase enums share their numbers (AUTHN 1, AUTHZ 2, STATS 3).
		Phase:    extensions.TrafficExtension_ExecutionPhase(wp.GetPhase()),
		Priority: wp.GetPriority(),
		Match:    match,
		FilterConfig: &extensions.TrafficExtension_Wasm{Wasm: &extensions.WasmConfig{
			Url: wp.GetUrl(), Sha256: wp.GetSha256(),
			ImagePullPolicy: wp.GetImagePullPolicy(), ImagePullSecret: wp.GetImagePullSecret(),
			PluginConfig: wp.GetPluginConfig(), PluginName: wp.GetPluginName(),
			FailStrategy: wp.GetFailStrategy(), VmConfig: wp.GetVmConfig(), Type: wp.GetType(),
		}},
	}
}

// Extensions returns the extensions that apply to a proxy (Istio's
// TrafficExtensionsByListenerInfo before the listener's own match): the
// proxy namespace's, then the root namespace's, each in creation order,
// whose selector takes the proxy's labels (none: every proxy of the
// namespace), then sorted by priority, highest first (stable). Extensions
// with targetRefs attach to the Gateway API gateways they name in their
// namespace, never by selector (attaches). Proxyless clients get none
// (Istio's gRPC generator applies none). Proxies with the same
// extensions share one slice.
func (pc *PushContext) Extensions(p *Proxy) []*Extension {
	if p.ProxylessGRPC() || len(pc.cfg.extensions) == 0 {
		return nil
	}
	var out []*Extension
	pick := func(ns string) {
		for _, e := range pc.cfg.extensions[ns] {
			if !attaches(e.Spec.GetSelector().GetMatchLabels(), e.Spec.GetTargetRefs(), ns, p.Namespace, p.Labels) {
				continue
			}
			out = append(out, e)
		}
	}
	pick(p.Namespace)
	if pc.RootNamespace != "" && pc.RootNamespace != p.Namespace {
		pick(pc.RootNamespace)
	}
	if len(out) == 0 {
		return nil
	}
	slices.SortStableFunc(out, func(a, b *Extension) int { return cmp.Compare(priority(b), priority(a)) })
	var key strings.Builder
	for _, e := range out {
		key.WriteString(e.Key() + ";")
	}
	return pc.Memo("model|extensions|"+key.String(), func() any { return out }).([]*Extension)
}

// priority is an extension's priority; none is the lowest (Istio's
// sortByPriority).
func priority(e *Extension) int64 {
	if p := e.Spec.GetPriority(); p != nil {
		return int64(p.GetValue())
	}
	return int64(-1) << 32
}

// extensionSelection is what a WasmPlugin or TrafficExtension selects:
// its selector's labels and its targetRefs.
func extensionSelection(spec any) (labels map[string]string, refs []*typev1beta1.PolicyTargetReference) {
	switch s := spec.(type) {
	case *extensions.WasmPlugin:
		return s.GetSelector().GetMatchLabels(), targetRefs(s.GetTargetRef(), s.GetTargetRefs())
	case *extensions.TrafficExtension:
		return s.GetSelector().GetMatchLabels(), s.GetTargetRefs()
	}
	return nil, nil
}
