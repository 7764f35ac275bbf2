package kubesource

import (
	"maps"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// MeshConfigMap is the ConfigMap (in the system namespace) holding the mesh
// configuration under the key "mesh", as in Istio.
const MeshConfigMap = "istio"

// namespaceHandler publishes namespaces (name and labels) from a
// metadata-only informer.
func (s *Source) namespaceHandler() cache.ResourceEventHandler {
	upsert := func(obj any) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		ns := &registryv1.Namespace{Name: m.Name, Labels: maps.Clone(m.Labels)}
		s.publish(registry.NamespaceTypeURL, m.Name, ns)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			m, ok := unwrap(obj).(*metav1.PartialObjectMetadata)
			if !ok {
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			s.remove(registry.NamespaceTypeURL, m.Name)
		},
	}
}

// meshHandler publishes the mesh configuration. An invalid one is logged and
// the last valid one stays in force; a deleted one is withdrawn (subscribers
// then use Istio's defaults).
func (s *Source) meshHandler() cache.ResourceEventHandler {
	upsert := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Name != MeshConfigMap {
			return
		}
		mesh := &meshv1alpha1.MeshConfig{}
		if err := istio.DecodeProtoYAML([]byte(cm.Data["mesh"]), mesh); err != nil {
			s.o.Log.Error("invalid mesh configuration; keeping the last valid one", "configmap", cm.Namespace+"/"+cm.Name, "error", err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.publish(registry.MeshConfigTypeURL, registry.MeshConfigName, mesh)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if cm, ok := unwrap(obj).(*corev1.ConfigMap); !ok || cm.Name != MeshConfigMap {
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			s.remove(registry.MeshConfigTypeURL, registry.MeshConfigName)
		},
	}
}
