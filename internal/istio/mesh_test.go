package istio_test

import (
	"slices"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

func providerNames(m *meshv1alpha1.MeshConfig) []string {
	var out []string
	for _, p := range m.GetExtensionProviders() {
		out = append(out, p.GetName())
	}
	return out
}

// Istio's ApplyMeshConfig: the given config lands on DefaultMeshConfig.
func TestMeshConfigStartsFromIstiosTelemetryDefaults(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		tracing    bool
		providers  []string
	}{
		{"empty", "", true, []string{"prometheus", "stackdriver", "envoy"}},
		{"unrelated fields", "rootNamespace: x\n", true, []string{"prometheus", "stackdriver", "envoy"}},
		{"tracing turned off", "enableTracing: false\n", false, []string{"prometheus", "stackdriver", "envoy"}},
		{
			"a new provider is added after the defaults", "extensionProviders:\n- name: otel\n  opentelemetry: {service: c.ns.svc.cluster.local, port: 4317}\n",
			true,
			[]string{"prometheus", "stackdriver", "envoy", "otel"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := istio.ParseMeshConfig([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if m.GetEnableTracing() != tt.tracing {
				t.Errorf("enableTracing = %v, want %v", m.GetEnableTracing(), tt.tracing)
			}
			if got := providerNames(m); !slices.Equal(got, tt.providers) {
				t.Errorf("providers = %v, want %v", got, tt.providers)
			}
		})
	}
}

func TestAProviderNamedAsADefaultReplacesIt(t *testing.T) {
	m, err := istio.ParseMeshConfig([]byte("extensionProviders:\n- name: envoy\n  envoyFileAccessLog: {path: /tmp/log}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := providerNames(m); !slices.Equal(got, []string{"prometheus", "stackdriver", "envoy"}) {
		t.Fatalf("providers = %v", got)
	}
	if p := m.GetExtensionProviders()[2].GetEnvoyFileAccessLog().GetPath(); p != "/tmp/log" {
		t.Errorf("envoy provider path = %q, want /tmp/log", p)
	}
	if d := istio.DefaultMeshConfig(); d.GetExtensionProviders()[2].GetEnvoyFileAccessLog().GetPath() != istio.DevStdout {
		t.Errorf("the defaults changed: %v", d)
	}
}
