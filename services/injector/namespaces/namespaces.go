// Package namespaces keeps the namespaces' labels the injection policy
// reads, from galley's registry.flotilla.io/v1/Namespace collection: the
// injector itself watches nothing in the cluster.
package namespaces

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Labels is an mcp.Handler for the Namespace collection.
type Labels struct {
	mu     sync.RWMutex
	labels map[string]map[string]string
	synced chan struct{}
	once   sync.Once
}

// New returns an empty set, not synced.
func New() *Labels {
	return &Labels{labels: map[string]map[string]string{}, synced: make(chan struct{})}
}

// Synced is closed once galley sent the collection.
func (l *Labels) Synced() <-chan struct{} { return l.synced }

// Apply implements mcp.Handler.
func (l *Labels) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	if typeURL != registry.NamespaceTypeURL {
		return fmt.Errorf("unexpected collection %s", typeURL)
	}
	var bad []error
	l.mu.Lock()
	for _, r := range updated {
		ns := &registryv1.Namespace{}
		if r.Body == nil || r.Body.UnmarshalTo(ns) != nil {
			bad = append(bad, fmt.Errorf("namespace %s does not decode", r.Name))
			continue
		}
		l.labels[r.Name] = maps.Clone(ns.GetLabels())
	}
	for _, n := range removed {
		delete(l.labels, n)
	}
	l.mu.Unlock()
	l.once.Do(func() { close(l.synced) })
	return errors.Join(bad...)
}

// Get returns a namespace's labels; an unknown namespace is an error (the
// webhook then refuses rather than guess).
func (l *Labels) Get(_ context.Context, namespace string) (map[string]string, error) {
	select {
	case <-l.synced:
	default:
		return nil, errors.New("namespaces not received from galley yet")
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	labels, ok := l.labels[namespace]
	if !ok {
		return nil, fmt.Errorf("namespace %s is not known (yet) to galley", namespace)
	}
	return labels, nil
}
