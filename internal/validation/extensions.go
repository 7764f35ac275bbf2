package validation

import (
	"fmt"
	"net/url"

	extensions "istio.io/api/extensions/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// Bounds of an extension's fields, as Istio's ValidateWasmPlugin and
// ValidateTrafficExtension.
const (
	maxPullSecretLen = 253
	maxPluginNameLen = 256
	maxEnvNameLen    = 256
	maxLuaCodeBytes  = 64 << 10
)

// wasmPluginSchemes are the URL schemes a Wasm module is fetched by
// (Istio's validateWasmPluginURL; no scheme means oci).
var wasmPluginSchemes = map[string]bool{"": true, "file": true, "http": true, "https": true, "oci": true}

// wasmPlugin checks a WasmPlugin as Istio's ValidateWasmPlugin.
func (v *validator) wasmPlugin() {
	wp := v.obj.Spec.(*extensions.WasmPlugin)
	v.policyTarget("spec", wp.GetSelector(), wp.GetTargetRef(), wp.GetTargetRefs())
	v.wasmModule("spec", wp.GetUrl(), wp.GetSha256(), wp.GetImagePullSecret(), wp.GetPluginName(), wp.GetVmConfig())
	for i, m := range wp.GetMatch() {
		v.trafficSelectorPorts(at("spec.match", i), m.GetPorts())
	}
}

// trafficExtension checks a TrafficExtension as Istio's
// ValidateTrafficExtension: exactly one of wasm and lua, a Lua script of
// at most 64 KiB, the Wasm module's fields as a WasmPlugin's.
func (v *validator) trafficExtension() {
	te := v.obj.Spec.(*extensions.TrafficExtension)
	wasm, lua := te.GetWasm(), te.GetLua()
	if (wasm == nil) == (lua == nil) {
		v.r.errorf("spec", "exactly one of wasm or lua must be set")
	}
	v.policyTarget("spec", te.GetSelector(), nil, te.GetTargetRefs())
	if lua != nil {
		switch n := len(lua.GetInlineCode()); {
		case n == 0:
			v.r.errorf("spec.lua.inlineCode", "lua.inlineCode cannot be empty")
		case n > maxLuaCodeBytes:
			v.r.errorf("spec.lua.inlineCode", "lua.inlineCode exceeds maximum size of 64KB")
		}
	}
	if wasm != nil {
		v.wasmModule("spec.wasm", wasm.GetUrl(), wasm.GetSha256(), wasm.GetImagePullSecret(), wasm.GetPluginName(), wasm.GetVmConfig())
	}
	for i, m := range te.GetMatch() {
		v.trafficSelectorPorts(at("spec.match", i), m.GetPorts())
	}
}

// wasmModule checks where a Wasm module comes from and how it runs
// (Istio's validateWasmPluginURL, validateWasmPluginSHA,
// validateWasmPluginImagePullSecret, validateWasmPluginName,
// validateWasmPluginVMConfig).
func (v *validator) wasmModule(path, u, sha, pullSecret, pluginName string, vm *extensions.VmConfig) {
	if u == "" {
		v.r.errorf(field(path, "url"), "url field needs to be set")
	} else if parsed, err := strictParseURL(u); err != nil {
		v.r.errorf(field(path, "url"), "%v", err)
	} else if !wasmPluginSchemes[parsed.Scheme] {
		v.r.errorf(field(path, "url"), "url contains unsupported scheme: %s", parsed.Scheme)
	}
	if sha != "" {
		if len(sha) != 64 {
			v.r.errorf(field(path, "sha256"), "sha256 field must be 64 characters long")
		} else {
			for _, r := range sha {
				if ('a' > r || r > 'f') && ('0' > r || r > '9') {
					v.r.errorf(field(path, "sha256"), "sha256 field must match [a-f0-9]{64} pattern")
					break
				}
			}
		}
	}
	if len(pullSecret) > maxPullSecretLen {
		v.r.errorf(field(path, "imagePullSecret"), "imagePullSecret field must be less than 253 characters long")
	}
	if len(pluginName) > maxPluginNameLen {
		v.r.errorf(field(path, "pluginName"), "pluginName field must be less than 256 characters long")
	}
	seen := map[string]bool{}
	for i, e := range vm.GetEnv() {
		p := at(field(path, "vmConfig.env"), i)
		switch {
		case e == nil:
			continue
		case e.GetName() == "":
			v.r.errorf(p, "spec.vmConfig.env invalid")
		case len(e.GetName()) > maxEnvNameLen:
			v.r.errorf(field(p, "name"), "env.name field must be less than 255 characters long")
		case seen[e.GetName()]:
			v.r.errorf(field(p, "name"), "duplicate env")
		case e.GetValueFrom() != extensions.EnvValueSource_INLINE && e.GetValue() != "":
			v.r.errorf(field(p, "value"), "value may only be set when valueFrom is INLINE")
		}
		seen[e.GetName()] = true
	}
}

// trafficSelectorPorts checks a match's ports (Istio's
// validateWasmPluginMatch).
func (v *validator) trafficSelectorPorts(path string, ports []*typev1beta1.PortSelector) {
	for i, p := range ports {
		if n := p.GetNumber(); n == 0 || n > 65535 {
			v.r.errorf(at(field(path, "ports"), i), "port is out of range: %d", n)
		}
	}
}

// strictParseURL parses a module URL as Istio's strictParseURL: as a
// request URI, else as a host and path after "http://".
func strictParseURL(s string) (*url.URL, error) {
	u, err := url.ParseRequestURI(s)
	if err == nil {
		return u, nil
	}
	nu, nerr := url.ParseRequestURI("http://" + s)
	if nerr != nil {
		return nil, fmt.Errorf("failed to parse url: %w", err)
	}
	return nu, nil
}
