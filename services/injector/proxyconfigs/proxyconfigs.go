// Package proxyconfigs keeps the networking.istio.io ProxyConfig
// resources galley streams, for the webhook to apply to the pods it
// injects (inject.ProxyConfigs).
package proxyconfigs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
)

// Source is an mcp.Handler for the ProxyConfig collection.
type Source struct {
	root string
	kind istio.Kind

	mu      sync.Mutex
	objs    map[string]*istio.Object
	current *inject.ProxyConfigs // built on first use after a change
}

// New returns an empty source; root is the mesh's root namespace.
func New(root string) *Source {
	k, _ := istio.ByName(istio.ProxyConfig)
	return &Source{root: root, kind: k, objs: map[string]*istio.Object{}}
}

// TypeURL is the collection the source takes.
func (s *Source) TypeURL() string { return s.kind.TypeURL() }

// Current is the ProxyConfigs in force.
func (s *Source) Current() *inject.ProxyConfigs {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		s.current = inject.NewProxyConfigs(s.root, slices.Collect(maps.Values(s.objs)))
	}
	return s.current
}

// Apply implements mcp.Handler: a resource that does not decode as a
// ProxyConfig is refused (NACKed, with the reason), the others applied.
func (s *Source) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	if typeURL != s.kind.TypeURL() {
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
