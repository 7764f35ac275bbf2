// Package injectconfig keeps the injection template and values the webhook
// uses: those of this injector's revision from galley's
// registry.flotilla.io/v1/InjectionConfig collection (the injection
// ConfigMap, so the injector watches nothing in the cluster), or the local
// ones (files or built-in) while galley has none.
package injectconfig

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Source is an mcp.Handler for the InjectionConfig collection.
type Source struct {
	revision string
	local    inject.Config
	log      *slog.Logger

	mu      sync.RWMutex
	current inject.Config
	synced  chan struct{}
	once    sync.Once
}

// New returns a source serving local until galley sends revision's
// configuration.
func New(revision string, local inject.Config, log *slog.Logger) *Source {
	return &Source{
		revision: revision, local: local, log: log,
		current: local, synced: make(chan struct{}),
	}
}

// Synced is closed once galley sent the collection (possibly empty).
func (s *Source) Synced() <-chan struct{} { return s.synced }

// Current returns the configuration in force.
func (s *Source) Current() inject.Config {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.current
}

// Apply implements mcp.Handler. A configuration that does not decode or
// parse is refused (NACKed, with the reason) and the one in force stays;
// removing this revision's configuration goes back to the local one.
// Other revisions' configurations are ignored.
func (s *Source) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	if typeURL != registry.InjectionConfigTypeURL {
		return fmt.Errorf("unexpected collection %s", typeURL)
	}
	defer s.once.Do(func() { close(s.synced) })
	var errs []error
	for _, r := range updated {
		if r.Name != s.revision {
			continue
		}
		ic := &registryv1.InjectionConfig{}
		if r.Body == nil || r.Body.UnmarshalTo(ic) != nil {
			errs = append(errs, fmt.Errorf("injection configuration %s does not decode", r.Name))
			continue
		}
		c, err := inject.ParseConfig(s.revision, ic.GetTemplate(), ic.GetValues())
		if err != nil {
			errs = append(errs, fmt.Errorf("injection configuration %s: %w", r.Name, err))
			continue
		}
		s.set(c, "galley", r.Version)
	}
	for _, n := range removed {
		if n == s.revision {
			s.set(s.local, "local", "")
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Error("refusing galley's injection configuration; keeping the one in force", "revision", s.revision, "error", err)
		return err
	}
	return nil
}

func (s *Source) set(c inject.Config, from, version string) {
	s.mu.Lock()
	s.current = c
	s.mu.Unlock()
	s.log.Info("injection configuration in force", "revision", s.revision, "from", from, "version", version)
}
