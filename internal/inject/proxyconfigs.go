package inject

import (
	"slices"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1beta1 "istio.io/api/networking/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// ProxyConfigs are the networking.istio.io ProxyConfig resources the
// injector applies to the pods it injects, by namespace, oldest first.
type ProxyConfigs struct {
	root        string
	mesh        *meshv1alpha1.ProxyConfig
	byNamespace map[string][]*networkingv1beta1.ProxyConfig
}

// NewProxyConfigs indexes ProxyConfig objects; root is the mesh's root
// namespace, whose namespace-wide ProxyConfig applies to every pod, and
// mesh the mesh's defaultConfig (nil: none), under them all.
func NewProxyConfigs(root string, mesh *meshv1alpha1.ProxyConfig, objs []*istio.Object) *ProxyConfigs {
	objs = slices.Clone(objs)
	slices.SortFunc(objs, istio.CreationOrder)
	p := &ProxyConfigs{root: root, mesh: mesh, byNamespace: map[string][]*networkingv1beta1.ProxyConfig{}}
	for _, o := range objs {
		if pc, ok := o.Spec.(*networkingv1beta1.ProxyConfig); ok {
			p.byNamespace[o.Meta.Namespace] = append(p.byNamespace[o.Meta.Namespace], pc)
		}
	}
	return p
}

// Effective is the proxy configuration of a pod of namespace with labels,
// as Istio's ProxyConfigs.EffectiveProxyConfig: over the mesh's
// defaultConfig, the root namespace's oldest ProxyConfig without a
// selector, the pod namespace's, then the
// pod's proxy.istio.io/config annotation (own, nil for none), then the
// oldest ProxyConfig of its namespace whose selector matches its labels —
// each later one winning for what it sets (concurrency, the environment
// variables as proxyMetadata, the image). nil when nothing is set.
func (p *ProxyConfigs) Effective(namespace string, labels map[string]string, own *meshv1alpha1.ProxyConfig) *meshv1alpha1.ProxyConfig {
	var layers []*meshv1alpha1.ProxyConfig
	if p != nil {
		layers = append(layers, p.mesh)
		if p.root != "" {
			layers = append(layers, p.namespaceWide(p.root))
		}
		if namespace != p.root {
			layers = append(layers, p.namespaceWide(namespace))
		}
	}
	layers = append(layers, own)
	if p != nil {
		layers = append(layers, p.workload(namespace, labels))
	}
	var out *meshv1alpha1.ProxyConfig
	for _, l := range layers {
		if l == nil {
			continue
		}
		if out == nil {
			out = &meshv1alpha1.ProxyConfig{}
		}
		proto.Merge(out, l)
	}
	if out != nil && proto.Size(out) == 0 {
		return nil // nothing set: the pod gets no PROXY_CONFIG
	}
	return out
}

func (p *ProxyConfigs) namespaceWide(namespace string) *meshv1alpha1.ProxyConfig {
	for _, pc := range p.byNamespace[namespace] {
		if pc.GetSelector() == nil {
			return asProxyConfig(pc)
		}
	}
	return nil
}

func (p *ProxyConfigs) workload(namespace string, labels map[string]string) *meshv1alpha1.ProxyConfig {
	for _, pc := range p.byNamespace[namespace] {
		sel := pc.GetSelector().GetMatchLabels()
		if len(sel) == 0 {
			continue
		}
		match := true
		for k, v := range sel {
			if got, ok := labels[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			return asProxyConfig(pc)
		}
	}
	return nil
}

// asProxyConfig is Istio's toMeshConfigProxyConfig: what a ProxyConfig
// resource sets of the mesh's proxy configuration.
func asProxyConfig(pc *networkingv1beta1.ProxyConfig) *meshv1alpha1.ProxyConfig {
	out := &meshv1alpha1.ProxyConfig{}
	if pc.GetConcurrency() != nil {
		out.Concurrency = pc.GetConcurrency()
	}
	if pc.GetEnvironmentVariables() != nil {
		out.ProxyMetadata = pc.GetEnvironmentVariables()
	}
	if pc.GetImage() != nil {
		out.Image = pc.GetImage()
	}
	return out
}
