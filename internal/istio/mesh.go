package istio

import (
	"fmt"

	"go.yaml.in/yaml/v3"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/platform/boundedfile"
)

// Names of the extension providers every mesh has (Istio's
// DefaultMeshConfig), unless the mesh configuration redefines them.
const (
	// PrometheusProvider is Istio's standard metrics.
	PrometheusProvider = "prometheus"
	// StackdriverProvider is Google Cloud's operations suite.
	StackdriverProvider = "stackdriver"
	// EnvoyProvider is Envoy's file access log to /dev/stdout, formatted
	// as accessLogFormat and accessLogEncoding say.
	EnvoyProvider = "envoy"
	// DevStdout is where the envoy provider writes.
	DevStdout = "/dev/stdout"
)

// DefaultMeshConfig is the mesh configuration when none is given: what
// Istio's DefaultMeshConfig sets that Flotilla reads only from the field
// itself (a plain bool, or a list merged by name). Every other default
// Istio's has is applied where the field is read (an unset
// enableAutoMtls, connectTimeout or rootNamespace means Istio's value).
func DefaultMeshConfig() *meshv1alpha1.MeshConfig {
	return &meshv1alpha1.MeshConfig{
		EnableTracing:      true,
		AccessLogEncoding:  meshv1alpha1.MeshConfig_TEXT,
		ExtensionProviders: defaultExtensionProviders(),
	}
}

func defaultExtensionProviders() []*meshv1alpha1.MeshConfig_ExtensionProvider {
	return []*meshv1alpha1.MeshConfig_ExtensionProvider{
		{Name: PrometheusProvider, Provider: &meshv1alpha1.MeshConfig_ExtensionProvider_Prometheus{
			Prometheus: &meshv1alpha1.MeshConfig_ExtensionProvider_PrometheusMetricsProvider{},
		}},
		{Name: StackdriverProvider, Provider: &meshv1alpha1.MeshConfig_ExtensionProvider_Stackdriver{
			Stackdriver: &meshv1alpha1.MeshConfig_ExtensionProvider_StackdriverProvider{},
		}},
		{Name: EnvoyProvider, Provider: &meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLog{
			EnvoyFileAccessLog: &meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLogProvider{Path: DevStdout},
		}},
	}
}

// ParseMeshConfig decodes Istio's MeshConfig from YAML or JSON, strictly
// (an unknown field is an error), as galley reads the "mesh" key of the
// istio ConfigMap and a --mesh-config-file, onto DefaultMeshConfig as
// Istio's ApplyMeshConfig does: enableTracing is true unless given, and
// the extension providers given replace the default ones of the same
// name, the others kept (in order: the defaults, then the new ones).
func ParseMeshConfig(data []byte) (*meshv1alpha1.MeshConfig, error) {
	mesh := &meshv1alpha1.MeshConfig{}
	if err := DecodeProtoYAML(data, mesh); err != nil {
		return nil, err
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		// DecodeProtoYAML read it; a document that is not a mapping
		// (empty) sets nothing.
		keys = nil
	}
	if !hasKey(keys, "enableTracing", "enable_tracing") {
		mesh.EnableTracing = true
	}
	providers := defaultExtensionProviders()
	for _, p := range mesh.GetExtensionProviders() {
		found := false
		for _, d := range providers {
			if d.GetName() == p.GetName() {
				d.Provider, found = p.GetProvider(), true
				break
			}
		}
		if !found {
			providers = append(providers, p)
		}
	}
	mesh.ExtensionProviders = providers
	return mesh, nil
}

func hasKey(m map[string]any, names ...string) bool {
	for _, n := range names {
		if _, ok := m[n]; ok {
			return true
		}
	}
	return false
}

// ReadMeshConfig reads a MeshConfig file of at most MaxFileBytes.
func ReadMeshConfig(path string) (*meshv1alpha1.MeshConfig, error) {
	data, err := boundedfile.Read(path, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	mesh, err := ParseMeshConfig(data)
	if err != nil {
		return nil, fmt.Errorf("mesh config %s: %w", path, err)
	}
	return mesh, nil
}

// ParseProxyConfig decodes Istio's ProxyConfig from YAML or JSON, strictly
// (an unknown field is an error): the proxy.istio.io/config annotation the
// injector reads, and the PROXY_CONFIG environment variable it hands the
// agent.
func ParseProxyConfig(data []byte) (*meshv1alpha1.ProxyConfig, error) {
	pc := &meshv1alpha1.ProxyConfig{}
	if err := DecodeProtoYAML(data, pc); err != nil {
		return nil, err
	}
	return pc, nil
}
