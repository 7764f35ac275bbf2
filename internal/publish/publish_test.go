package publish

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

type updates struct{ got []string }

func (u *updates) UpdateContext(_ context.Context, typeURL string, up []*mcp.Resource, del []string) (int, error) {
	for _, r := range up {
		u.got = append(u.got, fmt.Sprintf("%s +%s %v", typeURL, r.Name, r.Annotations))
	}
	for _, d := range del {
		u.got = append(u.got, typeURL+" -"+d)
	}
	return len(up) + len(del), nil
}

func kind(t *testing.T, name string) istio.Kind {
	t.Helper()
	for _, k := range istio.Kinds() {
		if k.Kind == name {
			return k
		}
	}
	t.Fatalf("no kind %s", name)
	return istio.Kind{}
}

func TestObjectsArePublishedPerKindWithoutKubectlsLastAppliedCopy(t *testing.T) {
	u := &updates{}
	vs := &istio.Object{
		Kind: kind(t, "VirtualService"),
		Meta: istio.Meta{Name: "r", Namespace: "ns", Annotations: map[string]string{
			"kubectl.kubernetes.io/last-applied-configuration": "{...}", "team": "a",
		}},
		Spec: &networking.VirtualService{Hosts: []string{"r"}},
	}
	err := New(u).Apply(t.Context(), []*istio.Object{vs}, []istio.ID{{Kind: "DestinationRule", Name: "ns/old"}})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(u.got)
	want := []string{
		"networking.istio.io/v1/DestinationRule -ns/old",
		"networking.istio.io/v1/VirtualService +ns/r map[team:a]",
	}
	if !slices.Equal(u.got, want) {
		t.Fatalf("got %v, want %v", u.got, want)
	}
	if vs.Meta.Annotations["kubectl.kubernetes.io/last-applied-configuration"] == "" {
		t.Fatal("the source object was modified")
	}
}

func TestDeletingAnUnknownKindIsAnError(t *testing.T) {
	if err := New(&updates{}).Apply(t.Context(), nil, []istio.ID{{Kind: "Deployment", Name: "a/b"}}); err == nil {
		t.Fatal("want error")
	}
}

func TestServiceEntriesAndWorkloadEntriesArePublishedAsTheRegistryToo(t *testing.T) {
	u := &updates{}
	p := New(u)
	docs := istio.Decode("se.yaml", []byte(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db}
spec:
  hosts: [db.internal, db-replica.internal]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  workloadSelector: {labels: {app: db}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: db-1}
spec: {address: 10.0.0.5, labels: {app: db}}
`), "default")
	objs := []*istio.Object{docs[0].Object, docs[1].Object}
	if err := p.Apply(t.Context(), objs, nil); err != nil {
		t.Fatal(err)
	}
	slices.Sort(u.got)
	want := []string{
		"networking.istio.io/v1/ServiceEntry +default/db map[]",
		"networking.istio.io/v1/WorkloadEntry +default/db-1 map[]",
		"registry.flotilla.io/v1/EndpointSet +default/db-replica.internal/se-db-0 map[]",
		"registry.flotilla.io/v1/EndpointSet +default/db.internal/se-db-0 map[]",
		"registry.flotilla.io/v1/Service +default/db-replica.internal map[]",
		"registry.flotilla.io/v1/Service +default/db.internal map[]",
	}
	if !slices.Equal(u.got, want) {
		t.Fatalf("got %v\nwant %v", u.got, want)
	}
	// Removing the ServiceEntry withdraws what it made.
	u.got = nil
	if err := p.Apply(t.Context(), nil, []istio.ID{{Kind: "ServiceEntry", Name: "default/db"}}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(u.got)
	want = []string{
		"networking.istio.io/v1/ServiceEntry -default/db",
		"registry.flotilla.io/v1/EndpointSet -default/db-replica.internal/se-db-0",
		"registry.flotilla.io/v1/EndpointSet -default/db.internal/se-db-0",
		"registry.flotilla.io/v1/Service -default/db-replica.internal",
		"registry.flotilla.io/v1/Service -default/db.internal",
	}
	if !slices.Equal(u.got, want) {
		t.Fatalf("got %v\nwant %v", u.got, want)
	}
}

// In Kubernetes mode the registry collections also hold what the Kubernetes
// source publishes; the ServiceEntry registry must only ever touch its own.
func TestServiceEntryChangesLeaveOtherRegistryResourcesAlone(t *testing.T) {
	srv, err := mcp.NewServer(t.Context(), slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("t"), Collections())
	if err != nil {
		t.Fatal(err)
	}
	k8s, err := mcp.NewResource("default/reviews.default.svc.cluster.local/reviews-abc", &registryv1.EndpointSet{ServiceHostname: "reviews.default.svc.cluster.local"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Update(registry.EndpointSetTypeURL, []*mcp.Resource{k8s}, nil); err != nil {
		t.Fatal(err)
	}
	p := New(srv)
	se := istio.Decode("se.yaml", []byte(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db}
spec:
  hosts: [db.internal]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.5}]
`), "default")[0].Object
	if err := p.Apply(t.Context(), []*istio.Object{se}, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(t.Context(), nil, []istio.ID{{Kind: "ServiceEntry", Name: "default/db"}}); err != nil {
		t.Fatal(err)
	}
	// Removing the ServiceEntry removed its set (changing nothing else):
	// re-adding the Kubernetes set is a no-op only if it is still there.
	if n, err := srv.Update(registry.EndpointSetTypeURL, []*mcp.Resource{k8s}, nil); err != nil || n != 0 {
		t.Fatalf("the Kubernetes EndpointSet was removed by a ServiceEntry change (re-adding changed %d, %v)", n, err)
	}
	if n, err := srv.Update(registry.EndpointSetTypeURL, nil, []string{"default/db.internal/se-db-0"}); err != nil || n != 0 {
		t.Fatalf("the ServiceEntry's set outlived the ServiceEntry (deleting changed %d, %v)", n, err)
	}
}

func TestInFileModeTheNamespacesTheObjectsUseArePublished(t *testing.T) {
	u := &updates{}
	p := New(u)
	p.PublishNamespaces()
	obj := func(k, ns, name string) *istio.Object {
		return &istio.Object{Kind: kind(t, k), Meta: istio.Meta{Name: name, Namespace: ns}, Spec: &networking.VirtualService{Hosts: []string{name}}}
	}
	if err := p.Apply(t.Context(), []*istio.Object{obj("VirtualService", "demo", "a"), obj("VirtualService", "shop", "b")}, nil); err != nil {
		t.Fatal(err)
	}
	has := func(want string) bool { return slices.Contains(u.got, want) }
	if !has(registry.NamespaceTypeURL+" +demo map[]") || !has(registry.NamespaceTypeURL+" +shop map[]") {
		t.Fatalf("published %v, want namespaces demo and shop", u.got)
	}
	u.got = nil
	if err := p.Apply(t.Context(), nil, []istio.ID{{Kind: "VirtualService", Name: "shop/b"}}); err != nil {
		t.Fatal(err)
	}
	if !has(registry.NamespaceTypeURL+" -shop") || has(registry.NamespaceTypeURL+" -demo") {
		t.Fatalf("after shop's last object went: %v, want shop withdrawn and demo kept", u.got)
	}
	// Without PublishNamespaces (Kubernetes mode) no namespace is published.
	k := &updates{}
	if err := New(k).Apply(t.Context(), []*istio.Object{obj("VirtualService", "demo", "a")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, g := range k.got {
		if strings.HasPrefix(g, registry.NamespaceTypeURL) {
			t.Fatalf("Kubernetes mode published %s", g)
		}
	}
}
