package model

import (
	"maps"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func pack(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestPutRejectsWhatDoesNotDecodeAndKeepsTheRest(t *testing.T) {
	s := NewStore()
	svc := &registryv1.Service{Hostname: "a.ns.svc.cluster.local", Namespace: "ns", Ports: []*registryv1.ServicePort{{Name: "http", Number: 80}}}
	if err := s.Put(registry.ServiceTypeURL, "ns/a.ns.svc.cluster.local", Meta{}, pack(t, svc)); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		typeURL, name string
		body          *anypb.Any
		want          string
	}{
		"wrong message":              {registry.ServiceTypeURL, "ns/b", pack(t, wrapperspb.String("x")), "body"},
		"no body":                    {registry.EndpointSetTypeURL, "ns/b/0", nil, "no body"},
		"garbage bytes":              {"networking.istio.io/v1/VirtualService", "ns/vs", &anypb.Any{TypeUrl: "type.googleapis.com/istio.networking.v1alpha3.VirtualService", Value: []byte{0xff, 0xff}}, "VirtualService ns/vs"},
		"name without slash":         {"networking.istio.io/v1/VirtualService", "vs", pack(t, &networking.VirtualService{}), "not namespace/name"},
		"unknown collection":         {"example.com/v1/Thing", "ns/x", pack(t, &networking.VirtualService{}), "unknown collection"},
		"service without a hostname": {registry.ServiceTypeURL, "ns/x", pack(t, &registryv1.Service{}), "no hostname"},
	}
	for name, tt := range tests {
		err := s.Put(tt.typeURL, tt.name, Meta{}, tt.body)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tt.want)
		}
	}
	pc, _ := s.Build(BuildOptions{}, nil, 1)
	if got := len(pc.Services()); got != 1 {
		t.Fatalf("%d services after bad puts, want the 1 good one", got)
	}
}

func TestAnEndpointOnlyChangeKeepsTheConfigurationIndexes(t *testing.T) {
	s := NewStore()
	s.PutService(&registryv1.Service{Hostname: "a.ns.svc.cluster.local", Namespace: "ns"})
	first, cs := s.Build(BuildOptions{}, nil, 1)
	if !cs.Full {
		t.Fatal("the first build is a full change")
	}
	s.PutEndpointSet(&registryv1.EndpointSet{
		ServiceHostname: "a.ns.svc.cluster.local", ServiceNamespace: "ns", Shard: "0",
		Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.1"}},
	})
	second, cs := s.Build(BuildOptions{}, first, 2)
	if cs.Full || !cs.Endpoints["ns/a.ns.svc.cluster.local"] || len(cs.Endpoints) != 1 {
		t.Fatalf("change set %+v, want endpoints of ns/a.ns.svc.cluster.local only", cs)
	}
	if second.cfg != first.cfg {
		t.Fatal("an endpoint-only change rebuilt the configuration indexes")
	}
	if got := second.Endpoints(second.Services()[0]); len(got) != 1 {
		t.Fatalf("endpoints %v", got)
	}
	if got := first.Endpoints(first.Services()[0]); len(got) != 0 {
		t.Fatal("the earlier push context changed: it must be immutable")
	}
	s.Delete(registry.ServiceTypeURL, "ns/a.ns.svc.cluster.local")
	third, cs := s.Build(BuildOptions{}, second, 3)
	if !cs.Full || len(third.Services()) != 0 {
		t.Fatalf("deleting a service: change %+v, %d services", cs, len(third.Services()))
	}
	if _, cs := s.Build(BuildOptions{}, third, 4); !cs.Empty() {
		t.Fatalf("nothing changed, change set %+v", cs)
	}
}

// TestAHeadlessServicesNewPodIsAFullChangeItsHealthIsNot: sidecars have a
// listener per address of a passthrough service without a cluster IP, so
// a new or removed address changes listeners (a full change, as Istio
// pushes fully for headless services); the same addresses with another
// health change endpoints only.
func TestAHeadlessServicesNewPodIsAFullChangeItsHealthIsNot(t *testing.T) {
	s := NewStore()
	s.PutService(&registryv1.Service{Hostname: "db.ns.svc.cluster.local", Namespace: "ns", Resolution: registryv1.Resolution_RESOLUTION_NONE})
	pods := func(health registryv1.HealthStatus, addrs ...string) *registryv1.EndpointSet {
		es := &registryv1.EndpointSet{ServiceHostname: "db.ns.svc.cluster.local", ServiceNamespace: "ns", Shard: "0"}
		for _, a := range addrs {
			es.Endpoints = append(es.Endpoints, &registryv1.Endpoint{Address: a, Health: health})
		}
		return es
	}
	s.PutEndpointSet(pods(registryv1.HealthStatus_HEALTH_STATUS_HEALTHY, "10.0.0.1"))
	pc, _ := s.Build(BuildOptions{}, nil, 1)
	s.PutEndpointSet(pods(registryv1.HealthStatus_HEALTH_STATUS_HEALTHY, "10.0.0.1", "10.0.0.2"))
	pc, cs := s.Build(BuildOptions{}, pc, 2)
	if !cs.Full || !cs.All {
		t.Fatalf("a new pod: change set %+v, want a full change", cs)
	}
	s.PutEndpointSet(pods(registryv1.HealthStatus_HEALTH_STATUS_UNHEALTHY, "10.0.0.1", "10.0.0.2"))
	if _, cs := s.Build(BuildOptions{}, pc, 3); cs.Full || !cs.Endpoints["ns/db.ns.svc.cluster.local"] {
		t.Fatalf("a health change: change set %+v, want endpoints only", cs)
	}
}

// FuzzPut feeds arbitrary bytes as every collection's body: Put returns an
// error or stores something; it never panics, and a push context can be
// built and read afterwards.
func FuzzPut(f *testing.F) {
	svc, _ := proto.Marshal(&registryv1.Service{Hostname: "a", Namespace: "ns", Ports: []*registryv1.ServicePort{{Number: 80}}})
	vs, _ := proto.Marshal(&networking.VirtualService{Hosts: []string{"a"}})
	f.Add(0, "ns/a", svc)
	f.Add(4, "ns/vs", vs)
	f.Add(1, "ns/a/0", []byte{0x0a, 0xff})
	types := TypeURLs()
	f.Fuzz(func(t *testing.T, typ int, name string, body []byte) {
		if typ < 0 {
			typ = -typ
		}
		t.Helper()
		s := NewStore()
		typeURL := types[typ%len(types)]
		msgName := map[string]string{
			registry.ServiceTypeURL:     "flotilla.registry.v1.Service",
			registry.EndpointSetTypeURL: "flotilla.registry.v1.EndpointSet",
		}[typeURL]
		if msgName == "" {
			msgName = "istio.networking.v1alpha3.VirtualService"
		}
		_ = s.Put(typeURL, name, Meta{}, &anypb.Any{TypeUrl: "type.googleapis.com/" + msgName, Value: body})
		pc, _ := s.Build(BuildOptions{}, nil, 1)
		p := &Proxy{Namespace: "ns"}
		sc := pc.Scope(p)
		for _, svc := range sc.Services() {
			_ = sc.DestinationRule(p, svc)
			_ = sc.VirtualService(svc.GetHostname())
			_ = pc.Endpoints(svc)
		}
	})
}

func TestABuildSaysWhichObjectsChangedAndWhatTheyAreNow(t *testing.T) {
	s := NewStore()
	const vsType = "networking.istio.io/v1/VirtualService"
	for _, name := range []string{"ns/a", "ns/b"} {
		if err := s.Put(vsType, name, Meta{Version: "1"}, pack(t, &networking.VirtualService{Hosts: []string{"x"}})); err != nil {
			t.Fatal(err)
		}
	}
	pc, cs := s.Build(BuildOptions{}, nil, 1)
	want := map[string]ObjectChange{"VirtualService/ns/a": {Version: "1"}, "VirtualService/ns/b": {Version: "1"}}
	if !maps.Equal(cs.Objects, want) {
		t.Fatalf("first build: %v, want %v", cs.Objects, want)
	}
	if err := s.Put(vsType, "ns/a", Meta{Version: "2"}, pack(t, &networking.VirtualService{Hosts: []string{"y"}})); err != nil {
		t.Fatal(err)
	}
	s.Delete(vsType, "ns/b")
	s.Delete(vsType, "ns/never-there")
	_, cs = s.Build(BuildOptions{}, pc, 2)
	want = map[string]ObjectChange{"VirtualService/ns/a": {Version: "2"}, "VirtualService/ns/b": {Deleted: true}}
	if !maps.Equal(cs.Objects, want) {
		t.Fatalf("second build: %v, want %v", cs.Objects, want)
	}
}

func TestAnEnvoyFilterChangeConcernsOnlyTheProxiesItSelectedOrSelects(t *testing.T) {
	s := NewStore()
	const efType = "networking.istio.io/v1alpha3/EnvoyFilter"
	const vsType = "networking.istio.io/v1/VirtualService"
	put := func(typ, name string, m proto.Message) {
		t.Helper()
		if err := s.Put(typ, name, Meta{Version: "1"}, pack(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	proxy := func(ns string, labels map[string]string) *Proxy { return &Proxy{Namespace: ns, Labels: labels} }
	reviews, ratings, other := proxy("shop", map[string]string{"app": "reviews"}), proxy("shop", map[string]string{"app": "ratings"}), proxy("web", map[string]string{"app": "reviews"})
	// The pods of the Gateway API Gateway "ingress" in shop.
	ingress := proxy("shop", map[string]string{LabelGatewayName: "ingress"})
	pc, _ := s.Build(BuildOptions{}, nil, 1)
	selector := func(app string) *networking.EnvoyFilter {
		return &networking.EnvoyFilter{WorkloadSelector: &networking.WorkloadSelector{Labels: map[string]string{"app": app}}}
	}
	for _, tc := range []struct {
		name   string
		change func()
		want   map[*Proxy]bool
	}{
		{"a new EnvoyFilter selecting reviews", func() { put(efType, "shop/ef", selector("reviews")) }, map[*Proxy]bool{reviews: true}},
		{"the same EnvoyFilter now selecting ratings (it selected reviews)", func() { put(efType, "shop/ef", selector("ratings")) }, map[*Proxy]bool{reviews: true, ratings: true}},
		{"an EnvoyFilter without a selector", func() { put(efType, "shop/all", &networking.EnvoyFilter{}) }, map[*Proxy]bool{reviews: true, ratings: true, ingress: true}},
		{"an EnvoyFilter of the root namespace", func() { put(efType, DefaultRootNamespace+"/mesh", &networking.EnvoyFilter{}) }, map[*Proxy]bool{reviews: true, ratings: true, other: true, ingress: true}},
		{"an EnvoyFilter with Gateway API targets: the Gateway's pods", func() {
			put(efType, "shop/gw", &networking.EnvoyFilter{TargetRefs: selectorRefs()})
		}, map[*Proxy]bool{ingress: true}},
		{"a deleted EnvoyFilter (it selected ratings)", func() { s.Delete(efType, "shop/ef") }, map[*Proxy]bool{ratings: true}},
		{"an EnvoyFilter and a VirtualService", func() {
			put(efType, "shop/ef2", selector("ratings"))
			put(vsType, "web/vs", &networking.VirtualService{Hosts: []string{"x"}})
		}, map[*Proxy]bool{reviews: true, ratings: true, other: true, ingress: true}},
	} {
		tc.change()
		var cs ChangeSet
		pc, cs = s.Build(BuildOptions{}, pc, pc.Seq+1)
		for _, p := range []*Proxy{reviews, ratings, other, ingress} {
			// Sidecars watch everything (nil hosts).
			if got := cs.Concerns(nil, p, pc.RootNamespace); got != tc.want[p] {
				t.Errorf("%s: concerns %s %v = %v, want %v", tc.name, p.Namespace, p.Labels, got, tc.want[p])
			}
		}
	}
}

func selectorRefs() []*typev1beta1.PolicyTargetReference {
	return []*typev1beta1.PolicyTargetReference{{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "ingress"}}
}

// A credential is stored under its own name only: a Secret's as
// "namespace/name", a ConfigMap's CA certificates as
// "configmap/namespace/name", so that neither can pass for the other.
func TestACredentialIsStoredUnderItsOwnKindOfNameOnly(t *testing.T) {
	s := NewStore()
	secret := &registryv1.Credential{Namespace: "edge", Name: "ca", CaCertificates: []byte("secret's")}
	configMap := &registryv1.Credential{Namespace: "edge", Name: "ca", CaCertificates: []byte("configmap's"), ConfigMap: true}
	for _, tc := range []struct {
		name string
		c    *registryv1.Credential
		ok   bool
	}{
		{"edge/ca", secret, true},
		{"configmap/edge/ca", configMap, true},
		{"edge/ca", configMap, false},
		{"configmap/edge/ca", secret, false},
	} {
		err := s.Put(registry.CredentialTypeURL, tc.name, Meta{}, pack(t, tc.c))
		if (err == nil) != tc.ok {
			t.Errorf("%s as %s (config map %v): %v, want accepted %v", tc.c.GetName(), tc.name, tc.c.GetConfigMap(), err, tc.ok)
		}
	}
	pc, _ := s.Build(BuildOptions{}, nil, 1)
	if got := string(pc.Credential("edge", "ca").GetCaCertificates()); got != "secret's" {
		t.Errorf("the Secret's credential holds %q", got)
	}
	if got := string(pc.ConfigMapCACertificates("edge", "ca")); got != "configmap's" {
		t.Errorf("the ConfigMap's CA certificates are %q", got)
	}
}
