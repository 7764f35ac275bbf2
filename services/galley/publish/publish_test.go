package publish

import (
	"fmt"
	"slices"
	"testing"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
)

type updates struct{ got []string }

func (u *updates) Update(typeURL string, up []*mcp.Resource, del []string) (int, error) {
	for _, r := range up {
		u.got = append(u.got, fmt.Sprintf("%s +%s %v", typeURL, r.Name, r.Annotations))
	}
	for _, d := range del {
		u.got = append(u.got, typeURL+" -"+d)
	}
	return len(up) + len(del), nil
}

func (u *updates) Replace(typeURL string, all []*mcp.Resource) (int, error) {
	for _, r := range all {
		u.got = append(u.got, fmt.Sprintf("%s =%s", typeURL, r.Name))
	}
	return len(all), nil
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
	err := New(u).Apply([]*istio.Object{vs}, []istio.ID{{Kind: "DestinationRule", Name: "ns/old"}})
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
	if err := New(&updates{}).Apply(nil, []istio.ID{{Kind: "Deployment", Name: "a/b"}}); err == nil {
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
	if err := p.Apply(objs, nil); err != nil {
		t.Fatal(err)
	}
	slices.Sort(u.got)
	want := []string{
		"networking.istio.io/v1/ServiceEntry +default/db map[]",
		"networking.istio.io/v1/WorkloadEntry +default/db-1 map[]",
		"registry.flotilla.io/v1/EndpointSet =default/db-replica.internal/se-db-0",
		"registry.flotilla.io/v1/EndpointSet =default/db.internal/se-db-0",
		"registry.flotilla.io/v1/Service =default/db-replica.internal",
		"registry.flotilla.io/v1/Service =default/db.internal",
	}
	if !slices.Equal(u.got, want) {
		t.Fatalf("got %v\nwant %v", u.got, want)
	}
	// Removing the ServiceEntry empties the registry.
	u.got = nil
	if err := p.Apply(nil, []istio.ID{{Kind: "ServiceEntry", Name: "default/db"}}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"networking.istio.io/v1/ServiceEntry -default/db"}; !slices.Equal(u.got, want) {
		t.Fatalf("got %v", u.got)
	}
}
