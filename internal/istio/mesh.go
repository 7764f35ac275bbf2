package istio

import (
	"fmt"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/platform/boundedfile"
)

// ParseMeshConfig decodes Istio's MeshConfig from YAML or JSON, strictly
// (an unknown field is an error), as galley reads the "mesh" key of the
// istio ConfigMap and a --mesh-config-file.
func ParseMeshConfig(data []byte) (*meshv1alpha1.MeshConfig, error) {
	mesh := &meshv1alpha1.MeshConfig{}
	if err := DecodeProtoYAML(data, mesh); err != nil {
		return nil, err
	}
	return mesh, nil
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
