// Package publish turns galley's objects into MCP resources and hands them
// to the MCP server, one collection per kind. Publishing the same content
// again sends nothing: the server versions resources by content hash.
package publish

import (
	"context"
	"fmt"
	"maps"
	"strings"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Collections is what Publisher publishes: every Istio kind's type URL and
// the registry collections.
func Collections() []string {
	var out []string
	for _, k := range istio.Kinds() {
		out = append(out, k.TypeURL())
	}
	return append(out, registry.ServiceTypeURL, registry.EndpointSetTypeURL, registry.NamespaceTypeURL, registry.MeshConfigTypeURL, registry.InjectionConfigTypeURL)
}

// Updater is the part of mcp.Server a Publisher uses.
type Updater interface {
	UpdateContext(ctx context.Context, typeURL string, upserts []*mcp.Resource, deletes []string) (int, error)
}

// Publisher publishes Istio objects, and the registry made from the
// ServiceEntries and WorkloadEntries among them. It is used from one
// goroutine (a source's Apply).
type Publisher struct {
	up Updater
	// The ServiceEntries and WorkloadEntries in force, by namespace/name.
	serviceEntries map[string]*istio.Object
	workloads      map[string]*istio.Object
	// owned holds the registry resource names this publisher made, per
	// collection: in Kubernetes mode the same collections also carry what
	// the Kubernetes source publishes, which is not ours to delete.
	owned map[string]map[string]bool
	// namespaces, when set (file mode, where nothing else tells what
	// namespaces exist), counts the objects in force per namespace; the
	// namespaces with any are published, without labels.
	namespaces map[string]map[string]bool
}

// PublishNamespaces makes p publish, as the Namespace collection, the
// namespaces its objects are in (without labels): in file mode there is
// no cluster to list them, and the injector decides on a namespace's
// labels. Not for Kubernetes mode, whose source publishes the cluster's.
func (p *Publisher) PublishNamespaces() {
	p.namespaces = map[string]map[string]bool{}
	p.owned[registry.NamespaceTypeURL] = map[string]bool{}
}

// New returns a publisher writing to up.
func New(up Updater) *Publisher {
	return &Publisher{
		up: up, serviceEntries: map[string]*istio.Object{}, workloads: map[string]*istio.Object{},
		owned: map[string]map[string]bool{registry.ServiceTypeURL: {}, registry.EndpointSetTypeURL: {}},
	}
}

// Apply publishes changed objects and removes deleted ones, grouped by kind,
// then refreshes the registry if a ServiceEntry or WorkloadEntry changed;
// what changed carries ctx's span (the change's) to the subscribers.
func (p *Publisher) Apply(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error {
	if err := p.applyConfig(ctx, upserts, deletes); err != nil {
		return err
	}
	if err := p.applyNamespaces(ctx, upserts, deletes); err != nil {
		return err
	}
	changed := false
	for _, o := range upserts {
		switch o.Kind.Kind {
		case istio.ServiceEntry:
			p.serviceEntries[o.Key()], changed = o, true
		case istio.WorkloadEntry:
			p.workloads[o.Key()], changed = o, true
		}
	}
	for _, id := range deletes {
		switch id.Kind {
		case istio.ServiceEntry:
			delete(p.serviceEntries, id.Name)
			changed = true
		case istio.WorkloadEntry:
			delete(p.workloads, id.Name)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return p.publishRegistry(ctx)
}

// applyNamespaces keeps the published namespaces those of the objects in
// force, when PublishNamespaces asked for it.
func (p *Publisher) applyNamespaces(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error {
	if p.namespaces == nil {
		return nil
	}
	changed := false
	for _, o := range upserts {
		ns := o.Meta.Namespace
		if p.namespaces[ns] == nil {
			p.namespaces[ns], changed = map[string]bool{}, true
		}
		p.namespaces[ns][o.Kind.Kind+"/"+o.Key()] = true
	}
	for _, id := range deletes {
		ns, _, _ := strings.Cut(id.Name, "/")
		if objs := p.namespaces[ns]; objs != nil {
			delete(objs, id.Kind+"/"+id.Name)
			if len(objs) == 0 {
				delete(p.namespaces, ns)
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	all := make([]*mcp.Resource, 0, len(p.namespaces))
	for ns := range p.namespaces {
		r, err := mcp.NewResource(ns, &registryv1.Namespace{Name: ns}, nil, nil)
		if err != nil {
			return err
		}
		all = append(all, r)
	}
	if err := p.replaceOwned(ctx, registry.NamespaceTypeURL, all); err != nil {
		return fmt.Errorf("publish namespaces: %w", err)
	}
	return nil
}

// publishRegistry publishes what the ServiceEntries now describe and
// withdraws what they no longer do. Unchanged resources are not re-sent:
// the server compares content hashes.
func (p *Publisher) publishRegistry(ctx context.Context) error {
	workloads := make([]*istio.Object, 0, len(p.workloads))
	for _, w := range p.workloads {
		workloads = append(workloads, w)
	}
	var svcs, sets []*mcp.Resource
	for _, se := range p.serviceEntries {
		services, endpointSets := normalize.ServiceEntry(se, workloads)
		for _, s := range services {
			r, err := mcp.NewResource(registry.ServiceName(s.GetNamespace(), s.GetHostname()), s, nil, nil)
			if err != nil {
				return err
			}
			svcs = append(svcs, r)
		}
		for _, es := range endpointSets {
			r, err := mcp.NewResource(registry.EndpointSetName(es.GetServiceNamespace(), es.GetServiceHostname(), es.GetShard()), es, nil, nil)
			if err != nil {
				return err
			}
			sets = append(sets, r)
		}
	}
	if err := p.replaceOwned(ctx, registry.ServiceTypeURL, svcs); err != nil {
		return fmt.Errorf("publish registry services: %w", err)
	}
	if err := p.replaceOwned(ctx, registry.EndpointSetTypeURL, sets); err != nil {
		return fmt.Errorf("publish registry endpoints: %w", err)
	}
	return nil
}

// replaceOwned makes this publisher's share of a collection exactly all.
func (p *Publisher) replaceOwned(ctx context.Context, typeURL string, all []*mcp.Resource) error {
	now := make(map[string]bool, len(all))
	for _, r := range all {
		now[r.Name] = true
	}
	var gone []string
	for name := range p.owned[typeURL] {
		if !now[name] {
			gone = append(gone, name)
		}
	}
	if _, err := p.up.UpdateContext(ctx, typeURL, all, gone); err != nil {
		return err
	}
	p.owned[typeURL] = now
	return nil
}

func (p *Publisher) applyConfig(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error {
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
		r.Created, r.Generation = o.Meta.CreationTime, o.Meta.Generation
		b := get(o.Kind.TypeURL())
		b.up = append(b.up, r)
	}
	for _, id := range deletes {
		k, ok := istio.ByName(id.Kind)
		if !ok {
			return fmt.Errorf("publish: unknown kind %q", id.Kind)
		}
		b := get(k.TypeURL())
		b.del = append(b.del, id.Name)
	}
	for t, b := range byType {
		if _, err := p.up.UpdateContext(ctx, t, b.up, b.del); err != nil {
			return fmt.Errorf("publish %s: %w", t, err)
		}
	}
	return nil
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

// MeshFile publishes the MeshConfig in a file (galley's and discovery's
// --mesh-config-file); a file that cannot be read or decoded is an error.
func MeshFile(up Updater, path string) error {
	mesh, err := istio.ReadMeshConfig(path)
	if err != nil {
		return err
	}
	r, err := mcp.NewResource(registry.MeshConfigName, mesh, nil, nil)
	if err != nil {
		return err
	}
	if _, err := up.UpdateContext(context.Background(), registry.MeshConfigTypeURL, []*mcp.Resource{r}, nil); err != nil {
		return fmt.Errorf("mesh config %s: %w", path, err)
	}
	return nil
}
