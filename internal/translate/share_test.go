package translate

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// shareMesh: reviews with two subsets; sidecars in default (two with
// different labels) and one in other.
const shareMesh = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: 10.1.0.1, labels: {version: v1}}
  - {address: 10.1.0.2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~10.2.0.1~canary-1.default~default.svc.cluster.local, labels: {app: canary}}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~10.2.0.2~stable-1.default~default.svc.cluster.local, labels: {app: stable}}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~10.2.0.3~other-1.other~other.svc.cluster.local, labels: {app: stable}}
`

// sourceLabelsVS sends the canary app to v2, everyone else to v1.
const sourceLabelsVS = `
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - match: [{sourceLabels: {app: canary}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v1}}]
`

func portRoute(t *testing.T, g *Generator) proto.Message {
	t.Helper()
	rcs := g.Routes([]string{"9080"})
	if len(rcs) != 1 {
		t.Fatalf("%d route configurations 9080, want 1 (problems: %v)", len(rcs), g.Problems())
	}
	return rcs[0]
}

func TestSidecarsOfOneScopeShareTheirRouteConfigurations(t *testing.T) {
	gs := generators(t, shareMesh)
	canary, stable, other := portRoute(t, gs[0]), portRoute(t, gs[1]), portRoute(t, gs[2])
	if canary != stable {
		t.Error("two sidecars of one namespace, without a Sidecar or label-dependent configuration, got route configurations built apart")
	}
	if canary == other {
		t.Error("sidecars of two namespaces share a route configuration: its short names (\"reviews\") are namespace-relative")
	}
	// What is shared is what each would have built alone.
	alone := generators(t, shareMesh)[1]
	if !proto.Equal(portRoute(t, alone), stable) {
		t.Error("the shared route configuration differs from the one built for the proxy")
	}
}

func TestRouteConfigurationsFollowEachProxysLabelsWhenAVirtualServiceMatchesSourceLabels(t *testing.T) {
	gs := generators(t, shareMesh+sourceLabelsVS)
	dest := func(g *Generator) string {
		routes := g.HTTPRoutes("reviews.default.svc.cluster.local", 9080)
		if len(routes) == 0 {
			t.Fatal("no routes")
		}
		return routes[0].GetRoute().GetCluster()
	}
	canary, stable := portRoute(t, gs[0]), portRoute(t, gs[1])
	if canary == stable || proto.Equal(canary, stable) {
		t.Fatal("a canary and a stable proxy got the same routes although a match selects by source labels")
	}
	if got := dest(gs[0]); got != "outbound|9080|v2|reviews.default.svc.cluster.local" {
		t.Errorf("canary routed to %s, want v2", got)
	}
	if got := dest(gs[1]); got != "outbound|9080|v1|reviews.default.svc.cluster.local" {
		t.Errorf("stable routed to %s, want v1", got)
	}
	// Built for canary first or for stable first: each gets its own.
	gs = generators(t, shareMesh+sourceLabelsVS)
	_ = portRoute(t, gs[1])
	if got := dest(gs[0]); got != "outbound|9080|v2|reviews.default.svc.cluster.local" {
		t.Errorf("canary, built after stable, routed to %s, want v2", got)
	}
}

// TestClustersAndEndpointsAreNeverBuiltFromVirtualServices holds
// ConcernedTypes' promise: whatever the VirtualServices say, a proxy's
// clusters, load assignments and secrets are the same.
func TestClustersAndEndpointsAreNeverBuiltFromVirtualServices(t *testing.T) {
	vss := map[string]string{
		"none":          "",
		"sourceLabels":  sourceLabelsVS,
		"weights":       "\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  hosts: [reviews.default.svc.cluster.local]\n  http:\n  - route: [{destination: {host: reviews, subset: v1}, weight: 90}, {destination: {host: reviews, subset: v2}, weight: 10}]\n",
		"tcp and other": "\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: other}\nspec:\n  hosts: [reviews.default.svc.cluster.local]\n  tcp:\n  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]\n",
	}
	want := map[int]map[string][]proto.Message{}
	for _, name := range []string{"none", "sourceLabels", "weights", "tcp and other"} {
		for i, g := range generators(t, shareMesh+vss[name]) {
			got := map[string][]proto.Message{}
			for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.SecretType} {
				got[typ] = g.Resources(typ, nil)
			}
			if name == "none" {
				want[i] = got
				continue
			}
			for typ, msgs := range got {
				if !slices.EqualFunc(msgs, want[i][typ], proto.Equal) {
					t.Errorf("%s: proxy %d: %s differ from those without a VirtualService", name, i, typ)
				}
			}
		}
	}
}

func TestConcernedTypes(t *testing.T) {
	kinds := func(ks ...string) map[string]bool {
		m := map[string]bool{}
		for _, k := range ks {
			m[k] = true
		}
		return m
	}
	lr := []string{resourcev3.ListenerType, resourcev3.RouteType}
	for _, tt := range []struct {
		name string
		cs   model.ChangeSet
		want []string
	}{
		{"VirtualServices only", model.ChangeSet{Full: true, Kinds: kinds(istio.VirtualService)}, lr},
		{"a DestinationRule too", model.ChangeSet{Full: true, Kinds: kinds(istio.VirtualService, istio.DestinationRule)}, Types()},
		{"a DestinationRule", model.ChangeSet{Full: true, Kinds: kinds(istio.DestinationRule)}, Types()},
		{"all proxies", model.ChangeSet{Full: true, All: true, Kinds: kinds(istio.VirtualService)}, Types()},
		{"no kind said", model.ChangeSet{Full: true}, Types()},
	} {
		if got := ConcernedTypes(tt.cs); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func listenerNamed(t *testing.T, g *Generator, name string) *listenerv3.Listener {
	t.Helper()
	for _, m := range g.Resources(resourcev3.ListenerType, nil) {
		if l := m.(*listenerv3.Listener); l.GetName() == name {
			return l
		}
	}
	return nil
}

// tcpCluster is where the listener's first chain proxies TCP to.
func tcpCluster(t *testing.T, l *listenerv3.Listener) string {
	t.Helper()
	var tp tcpproxyv3.TcpProxy
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&tp); err != nil {
		t.Fatalf("listener %s: %v", l.GetName(), err)
	}
	return tp.GetCluster()
}

func TestSidecarsOfOneScopeShareTheirOutboundListeners(t *testing.T) {
	gs := generators(t, shareMesh)
	for _, name := range []string{"0.0.0.0_9080", VirtualOutbound} {
		canary, stable, other := listenerNamed(t, gs[0], name), listenerNamed(t, gs[1], name), listenerNamed(t, gs[2], name)
		if canary == nil || stable == nil || other == nil {
			t.Fatalf("listener %s missing (problems: %v)", name, gs[0].Problems())
		}
		if canary != stable {
			t.Errorf("%s: two sidecars of one namespace got it built apart", name)
		}
		if canary == other {
			t.Errorf("%s: sidecars of two namespaces share it: a scope is a namespace and its Sidecar", name)
		}
		if alone := listenerNamed(t, generators(t, shareMesh)[1], name); !proto.Equal(alone, stable) {
			t.Errorf("%s: the shared listener differs from the one built for the proxy alone", name)
		}
	}
	if listenerNamed(t, gs[0], VirtualInbound) == listenerNamed(t, gs[1], VirtualInbound) {
		t.Error("two sidecars share their virtualInbound listener: inbound listeners are each proxy's own")
	}
}

// tcpSourceLabelsMesh: a TCP service whose VirtualService sends the canary
// app to v2 and everyone else to v1.
const tcpSourceLabelsMesh = shareMesh + `
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: default}
spec:
  hosts: [db.default.svc.cluster.local]
  addresses: [10.9.0.1]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  endpoints:
  - {address: 10.1.1.1, labels: {version: v1}}
  - {address: 10.1.1.2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: default}
spec:
  host: db.default.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: default}
spec:
  hosts: [db.default.svc.cluster.local]
  tcp:
  - match: [{sourceLabels: {app: canary}}]
    route: [{destination: {host: db, subset: v2}}]
  - route: [{destination: {host: db, subset: v1}}]
`

func TestOutboundListenersFollowEachProxysLabelsWhenATCPMatchSelectsSourceLabels(t *testing.T) {
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		gs := generators(t, tcpSourceLabelsMesh)
		var ls [2]*listenerv3.Listener
		for _, i := range order {
			ls[i] = listenerNamed(t, gs[i], "10.9.0.1_5432")
		}
		if ls[0] == nil || ls[1] == nil {
			t.Fatalf("listener 10.9.0.1_5432 missing (problems: %v)", gs[0].Problems())
		}
		if got := tcpCluster(t, ls[0]); got != "outbound|5432|v2|db.default.svc.cluster.local" {
			t.Errorf("built in order %v: canary proxied to %s, want v2", order, got)
		}
		if got := tcpCluster(t, ls[1]); got != "outbound|5432|v1|db.default.svc.cluster.local" {
			t.Errorf("built in order %v: stable proxied to %s, want v1", order, got)
		}
	}
}

// perEndpointMesh: a headless Service, one of whose endpoints is the
// canary proxy itself (10.2.0.1); headless-services/input.yaml says why
// the proxy's own address gets no listener.
const perEndpointMesh = shareMesh + `
---
apiVersion: v1
kind: Service
metadata: {name: mysql, namespace: default}
spec: {clusterIP: None, selector: {app: mysql}, ports: [{name: tcp-mysql, port: 3306, targetPort: 3306}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mysql-1, namespace: default, labels: {kubernetes.io/service-name: mysql}}
addressType: IPv4
ports: [{name: tcp-mysql, port: 3306}]
endpoints:
- {addresses: [10.2.0.1], conditions: {ready: true}}
- {addresses: [10.3.0.1], conditions: {ready: true}}
`

func TestAListenerPerEndpointLeavesOutTheProxysOwnAddressThoughListenersAreShared(t *testing.T) {
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		gs := generators(t, perEndpointMesh)
		for _, i := range order {
			_ = gs[i].Resources(resourcev3.ListenerType, nil)
		}
		for i, want := range []map[string]bool{
			{"10.2.0.1_3306": false, "10.3.0.1_3306": true}, // canary is 10.2.0.1
			{"10.2.0.1_3306": true, "10.3.0.1_3306": true},
		} {
			for name, has := range want {
				if got := listenerNamed(t, gs[i], name) != nil; got != has {
					t.Errorf("built in order %v: proxy %d has listener %s: %v, want %v", order, i, name, got, has)
				}
			}
		}
	}
}

// clusterNamed is the proxy's cluster of that name, or nil.
func clusterNamed(g *Generator, name string) proto.Message {
	for _, m := range g.Resources(resourcev3.ClusterType, []string{name}) {
		return m
	}
	return nil
}

func TestTheBlackHoleAndPassthroughClustersAreSharedByProxiesOfOneAddressFamily(t *testing.T) {
	mesh := shareMesh + `
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~fd00::9~v6-1.default~default.svc.cluster.local}
`
	gs := generators(t, mesh)
	for _, name := range []string{BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster} {
		canary, other, v6 := clusterNamed(gs[0], name), clusterNamed(gs[2], name), clusterNamed(gs[3], name)
		if canary == nil || other == nil || v6 == nil {
			t.Fatalf("%s missing (problems: %v)", name, gs[0].Problems())
		}
		if canary != other {
			t.Errorf("%s: two sidecars of two namespaces got it built apart: it depends on their address families alone", name)
		}
		if alone := clusterNamed(generators(t, mesh)[2], name); !proto.Equal(alone, other) {
			t.Errorf("%s: the shared cluster differs from the one built for the proxy alone", name)
		}
		if name != InboundPassthroughCluster && v6 != canary {
			t.Errorf("%s: an IPv6 sidecar got it built apart", name)
		}
	}
	v4, v6 := clusterNamed(gs[0], InboundPassthroughCluster), clusterNamed(gs[3], InboundPassthroughCluster)
	if proto.Equal(v4, v6) {
		t.Error("the IPv6 sidecar's inbound passthrough binds as the IPv4 one's (127.0.0.6)")
	}
}

// What a proxy's own node or labels put into its outbound listeners keeps
// it from sharing them with a proxy whose differ: a Telemetry selecting
// one of two sidecars of a namespace (access logs), their canonical
// service (the spans' tags), and whether their Envoy is Istio's build
// (stats filters).
func TestOutboundListenersAreSharedOnlyByProxiesWhoseTelemetryIsTheSame(t *testing.T) {
	const selected = shareMesh + `
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: canary-logs, namespace: default}
spec:
  selector: {matchLabels: {app: canary}}
  accessLogging: [{providers: [{name: envoy}]}]
`
	accessLogs := func(l *listenerv3.Listener) int {
		var hcm hcmv3.HttpConnectionManager
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
			t.Fatal(err)
		}
		return len(hcm.GetAccessLog())
	}
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		gs := generators(t, selected)
		var ls [2]*listenerv3.Listener
		for _, i := range order {
			ls[i] = listenerNamed(t, gs[i], "0.0.0.0_9080")
		}
		if accessLogs(ls[0]) != 1 || accessLogs(ls[1]) != 0 {
			t.Fatalf("order %v: the canary's listener has %d access logs, the stable one's %d; want 1 and 0", order, accessLogs(ls[0]), accessLogs(ls[1]))
		}
	}

	path := filepath.Join(t.TempDir(), "input.yaml")
	if err := os.WriteFile(path, []byte(shareMesh), 0o600); err != nil {
		t.Fatal(err)
	}
	store, proxies, opts := loadCase(t, path)
	pc, _ := store.Build(opts, nil, 1)
	outbound := func(p *model.Proxy) *listenerv3.Listener {
		return listenerNamed(t, NewGenerator(pc, p), "0.0.0.0_9080")
	}
	src := proxies[1].Proxy
	like := func(mut func(*model.Proxy)) *model.Proxy {
		p := &model.Proxy{Type: src.Type, IPs: src.IPs, ID: src.ID, DNSDomain: src.DNSDomain, Namespace: src.Namespace, Labels: src.Labels}
		if mut != nil {
			mut(p)
		}
		return p
	}
	base := like(nil)
	if outbound(base) != outbound(like(func(p *model.Proxy) { p.ID = "stable-2.default" })) {
		t.Fatal("two sidecars alike in all that their outbound listeners read do not share them")
	}
	canonical := like(func(p *model.Proxy) {
		p.Labels = map[string]string{"app": "stable", "service.istio.io/canonical-name": "other"}
	})
	istioEnvoy := like(func(p *model.Proxy) { p.IstioTelemetry = true })
	for name, p := range map[string]*model.Proxy{"another canonical service": canonical, "Istio's Envoy": istioEnvoy} {
		if outbound(p) == outbound(base) {
			t.Errorf("%s: shares the outbound listeners of a sidecar it differs from", name)
		}
	}
}
