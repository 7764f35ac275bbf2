package kubesource

import (
	"fmt"
	"maps"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// MeshConfigMap is the ConfigMap (in the system namespace) holding the mesh
// configuration under the key "mesh", as in Istio.
const MeshConfigMap = "istio"

// namespaceHandler publishes namespaces (name and labels) from a
// metadata-only informer.
func (s *Source) namespaceHandler() cache.ResourceEventHandler {
	upsert := func(m *metav1.PartialObjectMetadata) {
		s.mu.Lock()
		defer s.mu.Unlock()
		ns := &registryv1.Namespace{Name: m.Name, Labels: maps.Clone(m.Labels)}
		s.publish(registry.NamespaceTypeURL, m.Name, ns)
		s.clusterChanged()
	}
	return handler(upsert, func(m *metav1.PartialObjectMetadata) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.remove(registry.NamespaceTypeURL, m.Name)
		s.clusterChanged()
	})
}

// configMapHandler publishes the ConfigMaps of the system namespace that
// configure the mesh: the mesh configuration ("istio", key "mesh") and the
// sidecar injection configuration of each revision
// ("flotilla-sidecar-injector[-<revision>]", keys "template" and "values").
// An invalid one is logged and the last valid one stays in force; a
// deleted one is withdrawn (subscribers then use their defaults).
func (s *Source) configMapHandler() cache.ResourceEventHandler {
	upsert := func(cm *corev1.ConfigMap) {
		typeURL, name, msg, err := configMapResource(cm)
		if typeURL == "" {
			return
		}
		if err != nil {
			s.o.Log.Error("invalid configuration; keeping the last valid one", "configmap", cm.Namespace+"/"+cm.Name, "error", err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.publish(typeURL, name, msg)
		if ic, ok := msg.(*registryv1.InjectionConfig); ok {
			// Validated above: it parses.
			c, _ := inject.ParseConfig(name, ic.GetTemplate(), ic.GetValues())
			s.injection[name] = c.Values
			s.clusterChanged()
		}
	}
	return handler(upsert, func(cm *corev1.ConfigMap) {
		typeURL, name := configMapCollection(cm.Name)
		if typeURL == "" {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.remove(typeURL, name)
		if typeURL == registry.InjectionConfigTypeURL {
			delete(s.injection, name)
			s.clusterChanged()
		}
	})
}

// InjectionValues returns the values of a revision's injection
// ConfigMap, the last valid one, and whether it exists: what the
// injectors inject with, and what galley deploys the Gateway API's
// gateways with.
func (s *Source) InjectionValues(revision string) (inject.Values, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.injection[revision]
	return v, ok
}

// configMapCollection says which collection and resource a system
// namespace ConfigMap feeds, if any.
func configMapCollection(name string) (typeURL, resource string) {
	if name == MeshConfigMap {
		return registry.MeshConfigTypeURL, registry.MeshConfigName
	}
	if rev, ok := inject.ConfigMapRevision(name); ok {
		return registry.InjectionConfigTypeURL, rev
	}
	return "", ""
}

// configMapResource decodes and validates a system namespace ConfigMap
// into the resource it feeds (typeURL "" when it feeds none).
func configMapResource(cm *corev1.ConfigMap) (typeURL, name string, msg proto.Message, err error) {
	typeURL, name = configMapCollection(cm.Name)
	switch typeURL {
	case registry.MeshConfigTypeURL:
		mesh, err := istio.ParseMeshConfig([]byte(cm.Data["mesh"]))
		if err != nil {
			return typeURL, name, nil, fmt.Errorf("mesh: %w", err)
		}
		return typeURL, name, mesh, nil
	case registry.InjectionConfigTypeURL:
		ic := &registryv1.InjectionConfig{
			Revision: name, Template: cm.Data[inject.ConfigMapTemplateKey], Values: cm.Data[inject.ConfigMapValuesKey],
		}
		if _, err := inject.ParseConfig(name, ic.GetTemplate(), ic.GetValues()); err != nil {
			return typeURL, name, nil, err
		}
		return typeURL, name, ic, nil
	}
	return "", "", nil, nil
}
