// Package publish turns galley's objects into MCP resources and hands them
// to the MCP server, one collection per kind. Publishing the same content
// again sends nothing: the server versions resources by content hash.
package publish

import (
	"fmt"
	"maps"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
)

// Collections is what Publisher publishes: every Istio kind's type URL.
func Collections() []string {
	var out []string
	for _, k := range istio.Kinds() {
		out = append(out, k.TypeURL())
	}
	return out
}

// Updater is the part of mcp.Server a Publisher uses.
type Updater interface {
	Update(typeURL string, upserts []*mcp.Resource, deletes []string) (int, error)
}

// Publisher publishes Istio objects.
type Publisher struct {
	up Updater
}

// New returns a publisher writing to up.
func New(up Updater) *Publisher { return &Publisher{up: up} }

// Apply publishes changed objects and removes deleted ones, grouped by kind.
func (p *Publisher) Apply(upserts []*istio.Object, deletes []istio.ID) error {
	type batch struct {
		up  []*mcp.Resource
		del []string
	}
	byType := map[string]*batch{}
	get := func(t string) *batch {
		if byType[t] == nil {
			byType[t] = &batch{}
		}
		return byType[t]
	}
	for _, o := range upserts {
		r, err := mcp.NewResource(o.Key(), o.Spec, o.Meta.Labels, annotations(o.Meta.Annotations))
		if err != nil {
			return fmt.Errorf("publish %s: %w", o, err)
		}
		b := get(o.Kind.TypeURL())
		b.up = append(b.up, r)
	}
	for _, id := range deletes {
		k, err := kindByName(id.Kind)
		if err != nil {
			return err
		}
		b := get(k.TypeURL())
		b.del = append(b.del, id.Name)
	}
	for t, b := range byType {
		if _, err := p.up.Update(t, b.up, b.del); err != nil {
			return fmt.Errorf("publish %s: %w", t, err)
		}
	}
	return nil
}

func kindByName(name string) (istio.Kind, error) {
	for _, k := range istio.Kinds() {
		if k.Kind == name {
			return k, nil
		}
	}
	return istio.Kind{}, fmt.Errorf("publish: unknown kind %q", name)
}

// annotations drops what subscribers never need and what would make equal
// content look different: kubectl's copy of the last applied object.
func annotations(in map[string]string) map[string]string {
	if _, ok := in["kubectl.kubernetes.io/last-applied-configuration"]; !ok {
		return in
	}
	out := maps.Clone(in)
	delete(out, "kubectl.kubernetes.io/last-applied-configuration")
	return out
}
