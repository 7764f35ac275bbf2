// Package model is discovery's view of the mesh: the resources galley
// streams (Istio configuration, registry services and endpoints, namespaces,
// mesh configuration) collected in a Store, and the immutable, indexed
// PushContext built from it for each change set, which translation reads.
// It knows nothing of gRPC, Kubernetes clients or Envoy.
package model

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	extensions "istio.io/api/extensions/v1alpha1"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	networkingv1beta1 "istio.io/api/networking/v1beta1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// TypeURLs are the collections discovery subscribes to: every Istio kind,
// the registry, the mesh configuration and the credentials galley serves
// discovery only.
func TypeURLs() []string {
	out := []string{registry.MeshConfigTypeURL, registry.NamespaceTypeURL, registry.ServiceTypeURL, registry.EndpointSetTypeURL, registry.CredentialTypeURL}
	for _, k := range istio.Kinds() {
		out = append(out, k.TypeURL())
	}
	return out
}

// ChangeSet says what changed since the last PushContext was built.
type ChangeSet struct {
	// Full is set when anything but endpoints changed: configuration,
	// services, namespaces or the mesh configuration.
	Full bool
	// All is set when a full change may concern any proxy (services,
	// Sidecars, PeerAuthentications, namespaces, the mesh configuration).
	// Without it, a full change concerns only Hosts: the hosts (or
	// wildcards) of the VirtualServices and DestinationRules that changed,
	// before and after the change.
	All bool
	// Hosts are the hosts a full change without All concerns (when
	// HostScoped: some VirtualService or DestinationRule changed).
	Hosts      map[string]bool
	HostScoped bool
	// Selections are the workloads a full change without All concerns
	// besides Hosts: the proxies an EnvoyFilter that changed selects,
	// before and after the change.
	Selections []Selection
	// Kinds are the kinds of the configuration objects behind a full
	// change without All ("VirtualService", "DestinationRule"), from which
	// translate tells the types it can change (ConcernedTypes).
	Kinds map[string]bool
	// Endpoints holds the services ("namespace/hostname") whose endpoints
	// changed.
	Endpoints map[string]bool
	// Objects are the Istio objects that changed, by ObjectKey, and what
	// each is now: what distribution tracking (flotilla wait) records.
	// Which proxies a change concerns is said by the fields above.
	Objects map[string]ObjectChange
}

// ObjectChange is what an Istio object is after a change.
type ObjectChange struct {
	// Version is the object's version (Meta.Version); empty when it was
	// deleted.
	Version string
	Deleted bool
}

// ObjectKey names an Istio object across kinds: "Kind/namespace/name".
func ObjectKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

// Meta is a resource's metadata as galley streams it.
type Meta struct {
	Labels, Annotations map[string]string
	// Created is the creation time (zero when unknown).
	Created time.Time
	// Version tells one change of an Istio object from another: its
	// generation in the apiserver, or galley's content version for an
	// object that has none (files); empty when unknown.
	Version string
}

// Concerns reports whether a full change can concern proxy p, which
// watches only hosts (all when hosts is nil): a change of every proxy, of
// a selection that takes p in, or of a host it watches.
func (c ChangeSet) Concerns(hosts map[string]bool, p *Proxy, rootNamespace string) bool {
	if !c.Full {
		return false
	}
	if c.All {
		return true
	}
	if slices.ContainsFunc(c.Selections, func(s Selection) bool { return s.Selects(p, rootNamespace) }) {
		return true
	}
	if !c.HostScoped {
		return false
	}
	if hosts == nil {
		return true
	}
	for changed := range c.Hosts {
		for h := range hosts {
			if HostMatches(changed, h) || HostMatches(h, changed) {
				return true
			}
		}
	}
	return false
}

// Empty reports whether nothing changed (an object whose change reaches
// proxies through the registry is a change: its version moved).
func (c ChangeSet) Empty() bool { return !c.Full && len(c.Endpoints) == 0 && len(c.Objects) == 0 }

// Merge adds other's changes to c.
func (c *ChangeSet) Merge(other ChangeSet) {
	c.Full = c.Full || other.Full
	c.All = c.All || other.All
	c.HostScoped = c.HostScoped || other.HostScoped
	c.Selections = append(c.Selections, other.Selections...)
	for k := range other.Kinds {
		c.addKind(k)
	}
	for h := range other.Hosts {
		if c.Hosts == nil {
			c.Hosts = map[string]bool{}
		}
		c.Hosts[h] = true
	}
	for k := range other.Endpoints {
		if c.Endpoints == nil {
			c.Endpoints = map[string]bool{}
		}
		c.Endpoints[k] = true
	}
	for k, o := range other.Objects {
		if c.Objects == nil {
			c.Objects = map[string]ObjectChange{}
		}
		c.Objects[k] = o
	}
}

// Selection is the proxies of a namespace whose labels match (nil
// Labels: all of them); the root namespace's are every proxy's.
type Selection struct {
	Namespace string
	Labels    map[string]string
}

// Selects reports whether the selection takes in p.
func (s Selection) Selects(p *Proxy, rootNamespace string) bool {
	if s.Namespace != rootNamespace && s.Namespace != p.Namespace {
		return false
	}
	return LabelsMatch(s.Labels, p.Labels)
}

func (c *ChangeSet) addKind(k string) {
	if c.Kinds == nil {
		c.Kinds = map[string]bool{}
	}
	c.Kinds[k] = true
}

// Store holds the latest resources of every collection. It is not safe for
// concurrent use: one goroutine applies changes and builds push contexts.
type Store struct {
	configs      map[string]map[string]*istio.Object // kind → namespace/name
	services     map[string]*registryv1.Service      // namespace/hostname
	endpointSets map[string]*registryv1.EndpointSet  // namespace/hostname/shard
	namespaces   map[string]*registryv1.Namespace
	credentials  map[string]*registryv1.Credential // namespace/name
	mesh         *meshv1alpha1.MeshConfig

	pending ChangeSet
	// hostRefs are the hosts, as written, of changed VirtualServices and
	// DestinationRules with their namespaces; Build qualifies them.
	hostRefs []hostRef
}

type hostRef struct{ host, namespace string }

// configChanged records what a change of a configuration object concerns:
// the hosts of VirtualServices and DestinationRules (old and new); for
// ServiceEntries and WorkloadEntries nothing (translation reads only the
// registry services and endpoints galley derives from them, whose
// changes arrive, and count, as registry changes: an edit of endpoints
// alone is an endpoints-only push, as Istio's ServiceEntry controller
// makes it); else every proxy.
func (s *Store) configChanged(objs ...*istio.Object) {
	for _, o := range objs {
		if o == nil {
			continue
		}
		switch spec := o.Spec.(type) {
		case *networking.EnvoyFilter:
			// Only the proxies it selects (Istio's EnvoyFilters), by
			// selector or by targetRefs (attaches).
			s.pending.Full = true
			s.pending.addKind(istio.EnvoyFilter)
			if len(spec.GetTargetRefs()) == 0 {
				s.pending.Selections = append(s.pending.Selections, Selection{Namespace: o.Meta.Namespace, Labels: spec.GetWorkloadSelector().GetLabels()})
			}
			s.pending.Selections = append(s.pending.Selections, gatewaySelections(o.Meta.Namespace, spec.GetTargetRefs())...)
		case *extensions.WasmPlugin, *extensions.TrafficExtension:
			// Only the proxies it selects, as an EnvoyFilter.
			s.pending.Full = true
			s.pending.addKind(o.Kind.Kind)
			sel, refs := extensionSelection(spec)
			if len(refs) == 0 {
				s.pending.Selections = append(s.pending.Selections, Selection{Namespace: o.Meta.Namespace, Labels: sel})
			}
			s.pending.Selections = append(s.pending.Selections, gatewaySelections(o.Meta.Namespace, refs)...)
		case *networking.VirtualService:
			s.pending.Full, s.pending.HostScoped = true, true
			s.pending.addKind(istio.VirtualService)
			if len(spec.GetHosts()) == 0 {
				// A delegate: any root may name it.
				s.pending.All = true
			}
			for _, h := range spec.GetHosts() {
				s.hostRefs = append(s.hostRefs, hostRef{h, o.Meta.Namespace})
			}
		case *networking.DestinationRule:
			s.pending.Full, s.pending.HostScoped = true, true
			s.pending.addKind(istio.DestinationRule)
			s.hostRefs = append(s.hostRefs, hostRef{spec.GetHost(), o.Meta.Namespace})
		case *networking.ServiceEntry, *networking.WorkloadEntry:
		case *networkingv1beta1.ProxyConfig:
			// The injector applies it to the pods it injects; discovery
			// configures no proxy from it.
		default:
			s.pending.Full, s.pending.All = true, true
		}
	}
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		configs:      map[string]map[string]*istio.Object{},
		services:     map[string]*registryv1.Service{},
		endpointSets: map[string]*registryv1.EndpointSet{},
		namespaces:   map[string]*registryv1.Namespace{},
		credentials:  map[string]*registryv1.Credential{},
	}
}

// Contents returns what the store holds: every Istio object, Service and
// EndpointSet (in name order) and the mesh configuration (nil when none
// was put). They are the store's own: callers must not change them.
func (s *Store) Contents() (objects []*istio.Object, services []*registryv1.Service, endpoints []*registryv1.EndpointSet, mesh *meshv1alpha1.MeshConfig) {
	for _, kind := range slices.Sorted(maps.Keys(s.configs)) {
		objects = append(objects, sortedObjects(s.configs[kind])...)
	}
	for _, k := range slices.Sorted(maps.Keys(s.services)) {
		services = append(services, s.services[k])
	}
	for _, k := range slices.Sorted(maps.Keys(s.endpointSets)) {
		endpoints = append(endpoints, s.endpointSets[k])
	}
	return objects, services, endpoints, s.mesh
}

// NamespaceLabels are the namespaces the store holds (a cluster's, as
// galley sends them) by name, with their labels.
func (s *Store) NamespaceLabels() map[string]map[string]string {
	out := make(map[string]map[string]string, len(s.namespaces))
	for name, ns := range s.namespaces {
		out[name] = maps.Clone(ns.GetLabels())
	}
	return out
}

// Put stores one resource of a collection, decoding its body; meta is an
// Istio object's metadata (other collections have none). A body that is
// not the collection's message, or does not decode, is an error and
// changes nothing.
func (s *Store) Put(typeURL, name string, meta Meta, body *anypb.Any) error {
	switch typeURL {
	case registry.ServiceTypeURL:
		m := &registryv1.Service{}
		if err := unpack(body, m); err != nil {
			return fmt.Errorf("service %s: %w", name, err)
		}
		if m.GetHostname() == "" {
			return fmt.Errorf("service %s: no hostname", name)
		}
		s.services[name] = m
		s.pending.Full, s.pending.All = true, true
	case registry.EndpointSetTypeURL:
		m := &registryv1.EndpointSet{}
		if err := unpack(body, m); err != nil {
			return fmt.Errorf("endpoint set %s: %w", name, err)
		}
		s.endpointSets[name] = m
		s.endpointsChanged(registry.ServiceName(m.GetServiceNamespace(), m.GetServiceHostname()))
	case registry.NamespaceTypeURL:
		m := &registryv1.Namespace{}
		if err := unpack(body, m); err != nil {
			return fmt.Errorf("namespace %s: %w", name, err)
		}
		s.namespaces[name] = m
		s.pending.Full, s.pending.All = true, true
	case registry.MeshConfigTypeURL:
		m := &meshv1alpha1.MeshConfig{}
		if err := unpack(body, m); err != nil {
			return fmt.Errorf("mesh config: %w", err)
		}
		s.mesh = m
		s.pending.Full, s.pending.All = true, true
	case registry.CredentialTypeURL:
		m := &registryv1.Credential{}
		if err := unpack(body, m); err != nil {
			return fmt.Errorf("credential %s: %w", name, err)
		}
		if want := registry.CredentialResourceName(m); name != want {
			return fmt.Errorf("credential %s: named %s inside", name, want)
		}
		s.credentials[name] = m
		s.pending.Full, s.pending.All = true, true
	default:
		kind, ok := istio.ByTypeURL(typeURL)
		if !ok {
			return fmt.Errorf("unknown collection %q", typeURL)
		}
		spec := kind.NewSpec()
		if err := unpack(body, spec); err != nil {
			return fmt.Errorf("%s %s: %w", kind.Kind, name, err)
		}
		ns, n, ok := strings.Cut(name, "/")
		if !ok || ns == "" || n == "" {
			return fmt.Errorf("%s %q: name is not namespace/name", kind.Kind, name)
		}
		if s.configs[kind.Kind] == nil {
			s.configs[kind.Kind] = map[string]*istio.Object{}
		}
		obj := &istio.Object{
			Kind: kind,
			Meta: istio.Meta{Name: n, Namespace: ns, Labels: maps.Clone(meta.Labels), Annotations: maps.Clone(meta.Annotations), CreationTime: meta.Created, ResourceVersion: meta.Version},
			Spec: spec,
		}
		s.configChanged(s.configs[kind.Kind][name], obj)
		s.configs[kind.Kind][name] = obj
		s.objectChanged(obj, ObjectChange{Version: meta.Version})
	}
	return nil
}

// Delete removes a resource; deleting what is not there is not an error.
func (s *Store) Delete(typeURL, name string) {
	switch typeURL {
	case registry.ServiceTypeURL:
		if _, ok := s.services[name]; ok {
			delete(s.services, name)
			s.pending.Full, s.pending.All = true, true
		}
	case registry.EndpointSetTypeURL:
		if es, ok := s.endpointSets[name]; ok {
			delete(s.endpointSets, name)
			s.endpointsChanged(registry.ServiceName(es.GetServiceNamespace(), es.GetServiceHostname()))
		}
	case registry.NamespaceTypeURL:
		if _, ok := s.namespaces[name]; ok {
			delete(s.namespaces, name)
			s.pending.Full, s.pending.All = true, true
		}
	case registry.MeshConfigTypeURL:
		if s.mesh != nil {
			s.mesh = nil
			s.pending.Full, s.pending.All = true, true
		}
	case registry.CredentialTypeURL:
		if _, ok := s.credentials[name]; ok {
			delete(s.credentials, name)
			s.pending.Full, s.pending.All = true, true
		}
	default:
		if kind, ok := istio.ByTypeURL(typeURL); ok {
			if old, ok := s.configs[kind.Kind][name]; ok {
				delete(s.configs[kind.Kind], name)
				s.configChanged(old)
				s.objectChanged(old, ObjectChange{Deleted: true})
			}
		}
	}
}

// PutObject stores an already decoded Istio object (the file source and
// tests use it).
func (s *Store) PutObject(o *istio.Object) {
	if s.configs[o.Kind.Kind] == nil {
		s.configs[o.Kind.Kind] = map[string]*istio.Object{}
	}
	s.configChanged(s.configs[o.Kind.Kind][o.Key()], o)
	s.configs[o.Kind.Kind][o.Key()] = o
	var version string
	if o.Meta.Generation > 0 {
		version = strconv.FormatInt(o.Meta.Generation, 10)
	}
	s.objectChanged(o, ObjectChange{Version: version})
}

func (s *Store) objectChanged(o *istio.Object, c ObjectChange) {
	if s.pending.Objects == nil {
		s.pending.Objects = map[string]ObjectChange{}
	}
	s.pending.Objects[ObjectKey(o.Kind.Kind, o.Meta.Namespace, o.Meta.Name)] = c
}

// PutService stores a registry service.
func (s *Store) PutService(svc *registryv1.Service) {
	s.services[registry.ServiceName(svc.GetNamespace(), svc.GetHostname())] = svc
	s.pending.Full, s.pending.All = true, true
}

// PutEndpointSet stores a registry endpoint set.
func (s *Store) PutEndpointSet(es *registryv1.EndpointSet) {
	s.endpointSets[registry.EndpointSetName(es.GetServiceNamespace(), es.GetServiceHostname(), es.GetShard())] = es
	s.endpointsChanged(registry.ServiceName(es.GetServiceNamespace(), es.GetServiceHostname()))
}

// PutMesh stores the mesh configuration.
func (s *Store) PutMesh(m *meshv1alpha1.MeshConfig) {
	s.mesh = m
	s.pending.Full, s.pending.All = true, true
}

// KeysChanged records that something translation reads besides the store
// changed for every proxy (the fetched JWKS keys): the next Build is a
// full one.
func (s *Store) KeysChanged() {
	s.pending.Full, s.pending.All = true, true
}

func (s *Store) endpointsChanged(service string) {
	if s.pending.Endpoints == nil {
		s.pending.Endpoints = map[string]bool{}
	}
	s.pending.Endpoints[service] = true
}

// Pending returns what changed since the last Build.
func (s *Store) Pending() ChangeSet { return s.pending }

func unpack(body *anypb.Any, m proto.Message) error {
	if body == nil {
		return fmt.Errorf("no body (want %s)", m.ProtoReflect().Descriptor().FullName())
	}
	if err := body.UnmarshalTo(m); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	return nil
}
