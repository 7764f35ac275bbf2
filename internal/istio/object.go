package istio

import (
	"maps"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
)

// Meta is the part of Kubernetes object metadata Flotilla keeps.
type Meta struct {
	Name        string
	Namespace   string
	Labels      map[string]string
	Annotations map[string]string
	// ResourceVersion and Generation come from the apiserver; empty in
	// file mode.
	ResourceVersion string
	Generation      int64
	// CreationTime is the object's creationTimestamp: set by the apiserver,
	// or as written in a file (zero when not). Istio lets the oldest of
	// conflicting objects win (CreationOrder).
	CreationTime time.Time
}

// CreationOrder is the order in which Istio lets configuration objects
// take precedence (configCompareByCreationTime): older first, then by
// name, then by namespace. Objects without a creation time come first.
func CreationOrder(a, b *Object) int {
	if c := a.Meta.CreationTime.Compare(b.Meta.CreationTime); c != 0 {
		return c
	}
	if c := strings.Compare(a.Meta.Name, b.Meta.Name); c != 0 {
		return c
	}
	return strings.Compare(a.Meta.Namespace, b.Meta.Namespace)
}

// Object is one Istio configuration object: its kind, metadata and spec.
// Objects are treated as immutable once built: copy before changing.
type Object struct {
	Kind Kind
	Meta Meta
	Spec proto.Message
	// Status is the part of the object's status that Flotilla serves,
	// nil for most: for a ServiceEntry, the addresses allocated to its
	// hosts (a ServiceEntryStatus holding only addresses), as Istio's
	// ServiceEntry controller reads them (GetHostAddressesFromConfig);
	// for a WorkloadEntry, its Healthy condition (HealthStatus).
	Status proto.Message
}

// Key is "namespace/name".
func (o *Object) Key() string { return o.Meta.Namespace + "/" + o.Meta.Name }

// ID identifies an object among all kinds.
type ID struct {
	Kind string // e.g. "VirtualService"
	Name string // namespace/name
}

// ID returns the object's identity.
func (o *Object) ID() ID { return ID{Kind: o.Kind.Kind, Name: o.Key()} }

// String is "Kind namespace/name", the way messages name an object.
func (o *Object) String() string { return o.Kind.Kind + " " + o.Key() }

// DeepCopy returns a copy sharing nothing with o.
func (o *Object) DeepCopy() *Object {
	c := *o
	c.Meta.Labels = maps.Clone(o.Meta.Labels)
	c.Meta.Annotations = maps.Clone(o.Meta.Annotations)
	if o.Spec != nil {
		c.Spec = proto.Clone(o.Spec)
	}
	if o.Status != nil {
		c.Status = proto.Clone(o.Status)
	}
	return &c
}

// SameContent reports whether two objects say the same thing: kind,
// identity, labels, annotations, creation time (it decides precedence),
// spec and the status Flotilla serves (Status). Apiserver bookkeeping
// (resource version, generation) and the rest of status are not content.
func (o *Object) SameContent(other *Object) bool {
	return o == other || (o.Kind.Kind == other.Kind.Kind && o.Meta.Name == other.Meta.Name &&
		o.Meta.Namespace == other.Meta.Namespace && maps.Equal(o.Meta.Labels, other.Meta.Labels) &&
		maps.Equal(o.Meta.Annotations, other.Meta.Annotations) && o.Meta.CreationTime.Equal(other.Meta.CreationTime) &&
		proto.Equal(o.Spec, other.Spec) && proto.Equal(o.Status, other.Status))
}
