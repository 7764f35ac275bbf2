// Package proxyconfigs keeps the networking.istio.io ProxyConfig
// resources galley streams, for the webhook to apply to the pods it
// injects (inject.ProxyConfigs).
package proxyconfigs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Source is an mcp.Handler for the ProxyConfig collection and the mesh
// configuration (its defaultConfig and rootNamespace).
type Source struct {
	defaultRoot string
	kind        istio.Kind

	mu      sync.Mutex
	objs    map[string]*istio.Object
	mesh    *meshv1alpha1.MeshConfig
	current *inject.ProxyConfigs // built on first use after a change
}

// New returns an empty source; root is the mesh's root namespace while
// the mesh configuration names none.
func New(root string) *Source {
	k, _ := istio.ByName(istio.ProxyConfig)
	return &Source{defaultRoot: root, kind: k, objs: map[string]*istio.Object{}}
}

// TypeURLs are the collections the source takes.
func (s *Source) TypeURLs() []string { return []string{s.kind.TypeURL(), registry.MeshConfigTypeURL} }

// Current is the ProxyConfigs in force.
func (s *Source) Current() *inject.ProxyConfigs {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		// The discovery address is each revision's own (the injection
		// values'): the mesh's, one revision's, is left out.
		var def *meshv1alpha1.ProxyConfig
		if d := s.mesh.GetDefaultConfig(); d != nil {
			def = proto.CloneOf(d)
			def.DiscoveryAddress = ""
		}
		s.current = inject.NewProxyConfigs(cmp.Or(s.mesh.GetRootNamespace(), s.defaultRoot), def, slices.Collect(maps.Values(s.objs)))
	}
	return s.current
}

// Apply implements mcp.Handler: a resource that does not decode is
// refused (NACKed, with the reason), the others applied.
func (s *Source) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	switch typeURL {
	case s.kind.TypeURL():
	case registry.MeshConfigTypeURL:
		return s.applyMesh(updated, removed)
	default:
		return fmt.Errorf("unexpected collection %s", typeURL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, r := range updated {
		ns, name, ok := strings.Cut(r.Name, "/")
		spec := s.kind.NewSpec()
		if !ok || r.Body == nil || r.Body.UnmarshalTo(spec) != nil {
			errs = append(errs, fmt.Errorf("ProxyConfig %q does not decode", r.Name))
			continue
		}
		s.objs[r.Name] = &istio.Object{
			Kind: s.kind, Meta: istio.Meta{Namespace: ns, Name: name, Labels: r.Labels, Annotations: r.Annotations, CreationTime: r.Created}, Spec: spec,
		}
	}
	for _, n := range removed {
		delete(s.objs, n)
	}
	s.current = nil
	return errors.Join(errs...)
}

func (s *Source) applyMesh(updated []*mcp.Resource, removed []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range updated {
		m := &meshv1alpha1.MeshConfig{}
		if r.Body == nil || r.Body.UnmarshalTo(m) != nil {
			return fmt.Errorf("mesh configuration %q does not decode", r.Name)
		}
		s.mesh = m
	}
	if len(removed) > 0 && len(updated) == 0 {
		s.mesh = nil
	}
	s.current = nil
	return nil
}
