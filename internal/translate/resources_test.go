package translate

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// dependsMesh: a proxyless client in demo whose VirtualService for
// front sends to back and, mirrored, to shadow.
const dependsMesh = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: services, namespace: demo}
spec:
  hosts: [front.demo.svc.cluster.local, back.demo.svc.cluster.local, shadow.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: front, namespace: demo}
spec:
  hosts: [front.demo.svc.cluster.local]
  http:
  - route: [{destination: {host: back}}]
    mirror: {host: shadow.demo.svc.cluster.local}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec:
  id: sidecar~10.1.0.9~client-1.demo~demo.svc.cluster.local
  generator: grpc
`

func dependsGenerator(t *testing.T) *Generator {
	t.Helper()
	return generators(t, dependsMesh)[0]
}

// generators reads a mesh written as a golden case's input and returns a
// generator for each of its proxies, in order.
func generators(t *testing.T, mesh string) []*Generator {
	t.Helper()
	path := filepath.Join(t.TempDir(), "input.yaml")
	if err := os.WriteFile(path, []byte(mesh), 0o600); err != nil {
		t.Fatal(err)
	}
	store, proxies, opts := loadCase(t, path)
	pc, _ := store.Build(opts, nil, 1)
	out := make([]*Generator, len(proxies))
	for i, p := range proxies {
		out[i] = NewGenerator(pc, p.Proxy)
	}
	return out
}

func TestDependsOnNamesTheHostsAResourceIsBuiltFrom(t *testing.T) {
	gen := dependsGenerator(t)
	const (
		front  = "front.demo.svc.cluster.local"
		back   = "back.demo.svc.cluster.local"
		shadow = "shadow.demo.svc.cluster.local"
	)
	for _, tc := range []struct {
		name, typeURL, resource string
		hosts                   []string
		all                     bool
	}{
		{"an outbound cluster depends on its service", resourcev3.ClusterType, "outbound|8080|v1|" + back, []string{back}, false},
		{"its endpoints too", resourcev3.EndpointType, "outbound|8080||" + back, []string{back}, false},
		{"a cluster of a service that does not exist yet", resourcev3.ClusterType, "outbound|80||new.demo.svc.cluster.local", []string{"new.demo.svc.cluster.local"}, false},
		{"an inbound cluster depends on more than its name", resourcev3.ClusterType, "inbound|8080||", nil, true},
		{"so does a special cluster", resourcev3.ClusterType, BlackHoleCluster, nil, true},
		{"a listener depends on its host and its VirtualService's destinations", resourcev3.ListenerType, front + ":8080", []string{front, back, shadow}, false},
		{"and so does its route configuration", resourcev3.RouteType, front + ":8080", []string{front, back, shadow}, false},
		{"a host without a VirtualService", resourcev3.ListenerType, back + ":8080", []string{back}, false},
		{"a sidecar's port route depends on many hosts", resourcev3.RouteType, "8080", nil, true},
		{"a proxyless server's listener depends on the workload's services and policies", resourcev3.ListenerType, GRPCInboundPrefix + "127.0.0.1:8080", nil, true},
		{"a name whose port is not a number", resourcev3.ListenerType, "front:http", nil, true},
		{"a type not served", "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "default", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts, all := gen.DependsOn(tc.typeURL, tc.resource)
			slices.Sort(hosts)
			want := slices.Clone(tc.hosts)
			slices.Sort(want)
			if all != tc.all || !slices.Equal(hosts, want) {
				t.Errorf("DependsOn(%s) = %v, all=%v; want %v, all=%v", tc.resource, hosts, all, want, tc.all)
			}
		})
	}
}

func TestResourcesReturnsWhatTheTypedMethodsReturn(t *testing.T) {
	gen := dependsGenerator(t)
	if got := gen.Resources("type.googleapis.com/not.Served", nil); got != nil {
		t.Errorf("a type not served: %d resources, want none", len(got))
	}
	typed := map[string][]proto.Message{
		resourcev3.ClusterType:  messages(gen.Clusters(nil)),
		resourcev3.EndpointType: messages(gen.Endpoints(nil)),
		resourcev3.ListenerType: messages(gen.Listeners(nil)),
		resourcev3.RouteType:    messages(gen.Routes(nil)),
		resourcev3.SecretType:   messages(gen.Secrets(nil)),

		resourcev3.ExtensionConfigType: messages(gen.ExtensionConfigs(nil)),
		xdstype.NameTableType:          {gen.NameTable()},
	}
	for _, typeURL := range Types() {
		got := gen.Resources(typeURL, nil)
		if len(got) == 0 && typeURL != resourcev3.SecretType && typeURL != resourcev3.ExtensionConfigType { // asked for by name only
			t.Errorf("%s: no resources for the proxyless client", typeURL)
		}
		if !slices.EqualFunc(got, typed[typeURL], proto.Equal) {
			t.Errorf("%s: Resources differs from the typed method", typeURL)
		}
	}
	named := gen.Resources(resourcev3.ClusterType, []string{"outbound|8080||back.demo.svc.cluster.local", "outbound|1||missing"})
	if len(named) != 1 || ResourceName(named[0]) != "outbound|8080||back.demo.svc.cluster.local" {
		t.Errorf("asking for one existing and one missing cluster: got %d resources", len(named))
	}
}

func messages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

func TestNamesRoundTrip(t *testing.T) {
	if got := ResourceName(&endpointv3.ClusterLoadAssignment{ClusterName: "c"}); got != "c" {
		t.Errorf("a load assignment is named by its cluster: %q", got)
	}
	if got := ResourceName(&clusterv3.Cluster{Name: "c"}); got != "c" {
		t.Errorf("a cluster by its name: %q", got)
	}
	if host, port, ok := ParseListenerName(ListenerName("a.b.svc.cluster.local", 50051)); !ok || host != "a.b.svc.cluster.local" || port != 50051 {
		t.Errorf("ParseListenerName(ListenerName(…)) = %q, %d, %v", host, port, ok)
	}
	for _, bad := range []string{"", "80", "host:", "host:http", "host:99999999999"} {
		if _, _, ok := ParseListenerName(bad); ok {
			t.Errorf("ParseListenerName(%q) accepted", bad)
		}
	}
	if port, subset, host, ok := ParseClusterName(ClusterName("outbound", 80, "v1", "r.default.svc.cluster.local")); !ok || port != 80 || subset != "v1" || host != "r.default.svc.cluster.local" {
		t.Errorf("ParseClusterName(ClusterName(…)) = %d, %q, %q, %v", port, subset, host, ok)
	}
}
