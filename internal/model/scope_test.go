package model

import (
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// scopeStore holds config objects and services for scope tests.
type scopeStore struct {
	t *testing.T
	s *Store
}

func newScopeStore(t *testing.T) *scopeStore {
	t.Helper()
	return &scopeStore{t: t, s: NewStore()}
}

func (ss *scopeStore) put(kind, ns, name string, spec proto.Message) *scopeStore {
	ss.t.Helper()
	k, ok := istio.ByName(kind)
	if !ok {
		ss.t.Fatalf("no kind %s", kind)
	}
	ss.s.PutObject(&istio.Object{Kind: k, Meta: istio.Meta{Namespace: ns, Name: name}, Spec: spec})
	return ss
}

func (ss *scopeStore) service(ns, host string, exportTo ...string) *scopeStore {
	ss.s.PutService(&registryv1.Service{Hostname: host, Namespace: ns, ExportTo: exportTo, Ports: []*registryv1.ServicePort{{Name: "http", Number: 80}}})
	return ss
}

func (ss *scopeStore) build() *PushContext {
	pc, _ := ss.s.Build(BuildOptions{}, nil, 1)
	return pc
}

func proxyIn(ns string, labels map[string]string) *Proxy {
	return &Proxy{Type: SidecarProxy, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, ID: "p." + ns, Namespace: ns, Labels: labels}
}

func sidecar(selector map[string]string, egress ...string) *networking.Sidecar {
	sc := &networking.Sidecar{}
	if selector != nil {
		sc.WorkloadSelector = &networking.WorkloadSelector{Labels: selector}
	}
	if len(egress) > 0 {
		sc.Egress = []*networking.IstioEgressListener{{Hosts: egress}}
	}
	return sc
}

func TestTheSidecarOfAProxyIsItsSelectedOneThenItsNamespacesThenTheRootNamespaces(t *testing.T) {
	pc := newScopeStore(t).
		put(istio.Sidecar, "istio-system", "mesh-default", sidecar(nil)).
		put(istio.Sidecar, "istio-system", "root-selected", sidecar(map[string]string{"app": "a"})).
		put(istio.Sidecar, "shop", "shop-default", sidecar(nil)).
		put(istio.Sidecar, "shop", "for-cart", sidecar(map[string]string{"app": "cart"})).
		build()
	for _, tc := range []struct {
		name, ns string
		labels   map[string]string
		want     string
	}{
		{"a selector matching the proxy's labels wins", "shop", map[string]string{"app": "cart", "v": "1"}, "for-cart"},
		{"else the namespace's Sidecar without a selector", "shop", map[string]string{"app": "web"}, "shop-default"},
		{"else the root namespace's Sidecar without a selector", "other", map[string]string{"app": "a"}, "mesh-default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := pc.Scope(proxyIn(tc.ns, tc.labels)).Sidecar
			if sc == nil || sc.Name != tc.want {
				t.Fatalf("Sidecar = %v, want %s", sc, tc.want)
			}
		})
	}
	if sc := newScopeStore(t).build().Scope(proxyIn("shop", nil)).Sidecar; sc != nil {
		t.Fatalf("no Sidecar anywhere: got %s", sc.Name)
	}
	// Istio never applies a Sidecar to a gateway (DefaultSidecarScopeForGateway).
	gw := proxyIn("shop", map[string]string{"app": "cart"})
	gw.Type = RouterProxy
	if sc := pc.Scope(gw).Sidecar; sc != nil {
		t.Fatalf("a gateway proxy got Sidecar %s", sc.Name)
	}
}

func TestImportsReadsEgressHostsAsIstioDoes(t *testing.T) {
	for _, tc := range []struct {
		egress   string
		ns, host string
		want     bool
	}{
		{"*/*", "any", "a.any.svc.cluster.local", true},
		{"./*", "shop", "a.shop.svc.cluster.local", true},
		{"./*", "other", "a.other.svc.cluster.local", false},
		{"~/*", "shop", "a.shop.svc.cluster.local", false},
		{"istio-system/*", "istio-system", "istiod.istio-system.svc.cluster.local", true},
		{"istio-system/*", "shop", "a.shop.svc.cluster.local", false},
		{"*/*.example.com", "ext", "api.example.com", true},
		{"*/*.example.com", "ext", "example.org", false},
		{"*/api.example.com", "ext", "api.example.com", true},
		{"api.example.com", "ext", "api.example.com", false}, // no namespace part: imports nothing
	} {
		t.Run(tc.egress+" "+tc.ns+"/"+tc.host, func(t *testing.T) {
			pc := newScopeStore(t).put(istio.Sidecar, "shop", "default", sidecar(nil, tc.egress)).build()
			if got := pc.Scope(proxyIn("shop", nil)).Imports(tc.ns, tc.host); got != tc.want {
				t.Fatalf("Imports = %v, want %v", got, tc.want)
			}
		})
	}
	if !newScopeStore(t).build().Scope(proxyIn("shop", nil)).Imports("x", "anything") {
		t.Fatal("without a Sidecar everything is imported")
	}
}

func TestAScopeSeesExportedImportedServicesOnePerHostOwnNamespaceFirst(t *testing.T) {
	pc := newScopeStore(t).
		service("shop", "cart.shop.svc.cluster.local").
		service("shop", "private.shop.svc.cluster.local", ".").
		service("billing", "invoice.billing.svc.cluster.local").
		service("billing", "api.example.com").
		service("shop", "api.example.com").
		put(istio.Sidecar, "narrow", "default", sidecar(nil, "./*", "billing/*")).
		build()
	hosts := func(s *Scope) map[string]string {
		out := map[string]string{}
		for _, svc := range s.Services() {
			out[svc.GetHostname()] = svc.GetNamespace()
		}
		return out
	}
	shop := hosts(pc.Scope(proxyIn("shop", nil)))
	if len(shop) != 4 || shop["private.shop.svc.cluster.local"] != "shop" || shop["api.example.com"] != "shop" {
		t.Errorf("shop sees %v: want its private service and its own api.example.com among 4", shop)
	}
	billing := hosts(pc.Scope(proxyIn("billing", nil)))
	if _, ok := billing["private.shop.svc.cluster.local"]; ok || billing["api.example.com"] != "billing" {
		t.Errorf("billing sees %v: want no shop-private service and its own api.example.com", billing)
	}
	narrow := hosts(pc.Scope(proxyIn("narrow", nil)))
	if len(narrow) != 2 || narrow["invoice.billing.svc.cluster.local"] != "billing" || narrow["api.example.com"] != "billing" {
		t.Errorf("a Sidecar importing ./* and billing/* sees %v: want billing's two services", narrow)
	}
	if pc.Scope(proxyIn("narrow", nil)).Service("cart.shop.svc.cluster.local") != nil {
		t.Error("Service finds a host the Sidecar does not import")
	}
}

func TestTheVirtualServiceOfAHostIsExactBeforeWildcardLongestWildcardOwnNamespaceFirst(t *testing.T) {
	vs := func(hosts ...string) *networking.VirtualService {
		return &networking.VirtualService{Hosts: hosts, Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: hosts[0]}}}}}}
	}
	pc := newScopeStore(t).
		put(istio.VirtualService, "a", "exact", vs("api.example.com")).
		put(istio.VirtualService, "a", "wide", vs("*.com")).
		put(istio.VirtualService, "a", "narrow", vs("*.example.com")).
		put(istio.VirtualService, "b", "exact-b", vs("api.example.com")).
		put(istio.VirtualService, "b", "hidden", &networking.VirtualService{Hosts: []string{"hidden.example.com"}, ExportTo: []string{"."}, Http: vs("x").Http}).
		build()
	for _, tc := range []struct {
		ns, host, want string
	}{
		{"a", "api.example.com", "exact"},
		{"b", "api.example.com", "exact-b"}, // its own namespace's first
		{"c", "api.example.com", "exact"},   // else namespace/name order
		{"a", "web.example.com", "narrow"},  // the longer wildcard
		{"a", "web.other.com", "wide"},
		{"a", "hidden.example.com", "narrow"}, // exported to b only
		{"b", "hidden.example.com", "hidden"},
		{"a", "example.org", ""},
	} {
		t.Run(tc.ns+" "+tc.host, func(t *testing.T) {
			got := pc.Scope(proxyIn(tc.ns, nil)).VirtualService(tc.host)
			name := ""
			if got != nil {
				name = got.Name
			}
			if name != tc.want {
				t.Fatalf("VirtualService = %q, want %q", name, tc.want)
			}
		})
	}
}

// A consumer's Gateway API route (a VirtualService of gateway semantics
// in the proxy's namespace) overrides everything else for its host, even
// an older VirtualService of that namespace; elsewhere it is one more
// route in the usual order (Istio's SelectVirtualServices).
func TestAConsumersHTTPRouteOverridesVirtualServicesForItsHostInItsNamespace(t *testing.T) {
	route := func(host string) *networking.VirtualService {
		return &networking.VirtualService{Hosts: []string{host}, Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: host}}}}}}
	}
	ss := newScopeStore(t).
		put(istio.VirtualService, "a", "producer", route("api.example.com")).
		put(istio.VirtualService, "b", "a-virtual-service", route("api.example.com"))
	kind, _ := istio.ByName(istio.VirtualService)
	ss.s.PutObject(&istio.Object{Kind: kind, Meta: istio.Meta{
		Namespace: "b", Name: "z-http-route",
		Annotations: map[string]string{AnnotationRouteSemantics: RouteSemanticsGateway},
	}, Spec: route("api.example.com")})
	pc := ss.build()
	for ns, want := range map[string]string{"a": "producer", "b": "z-http-route", "c": "a-virtual-service"} {
		if got := pc.Scope(proxyIn(ns, nil)).VirtualService("api.example.com"); got == nil || got.Name != want {
			t.Errorf("a proxy in %s routes api.example.com by %v, want %s", ns, got, want)
		}
	}
}

// A Sidecar importing one host sees a VirtualService for a wildcard that
// covers it, as Istio keeps it for VirtualServices (VSMatches matches
// both ways), but not a Gateway API route for that wildcard, whose hosts
// are imported as a service's are.
func TestASidecarImportingAHostSeesAWildcardVirtualServiceButNotAWildcardHTTPRoute(t *testing.T) {
	route := func(host string) *networking.VirtualService {
		return &networking.VirtualService{Hosts: []string{host}, Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "api.example.com"}}}}}}
	}
	kind, _ := istio.ByName(istio.VirtualService)
	for _, tc := range []struct {
		name       string
		gatewayAPI bool
		want       bool
	}{
		{"a VirtualService", false, true},
		{"a Gateway API route", true, false},
	} {
		ss := newScopeStore(t).put(istio.Sidecar, "a", "default", sidecar(nil, "*/api.example.com"))
		meta := istio.Meta{Namespace: "b", Name: "wide"}
		if tc.gatewayAPI {
			meta.Annotations = map[string]string{AnnotationRouteSemantics: RouteSemanticsGateway}
		}
		ss.s.PutObject(&istio.Object{Kind: kind, Meta: meta, Spec: route("*.example.com")})
		got := ss.build().Scope(proxyIn("a", nil)).VirtualService("api.example.com") != nil
		if got != tc.want {
			t.Errorf("%s for *.example.com seen by a proxy importing api.example.com: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTheDestinationRuleOfAServiceFollowsIstiosLookupOrder(t *testing.T) {
	dr := func(host string, selector map[string]string, exportTo ...string) *networking.DestinationRule {
		d := &networking.DestinationRule{Host: host, ExportTo: exportTo}
		if selector != nil {
			d.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: selector}
		}
		return d
	}
	const host = "reviews.shop.svc.cluster.local"
	store := newScopeStore(t).service("shop", host)
	store.s.PutMesh(&meshv1alpha1.MeshConfig{RootNamespace: "istio-system"})
	pc := store.
		put(istio.DestinationRule, "client", "selected", dr(host, map[string]string{"app": "a"})).
		put(istio.DestinationRule, "client", "client-ns", dr("*.shop.svc.cluster.local", nil)).
		put(istio.DestinationRule, "shop", "service-ns", dr(host, nil)).
		put(istio.DestinationRule, "shop", "service-ns-wide", dr("*.svc.cluster.local", nil)).
		put(istio.DestinationRule, "private", "not-exported", dr(host, nil, ".")).
		put(istio.DestinationRule, "istio-system", "root", dr("*", nil)).
		build()
	svc := pc.Scope(proxyIn("client", nil)).Service(host)
	if svc == nil {
		t.Fatal("the client does not see the service")
	}
	for _, tc := range []struct {
		name, ns string
		labels   map[string]string
		want     string
	}{
		{"a selector matching the proxy, in its namespace, first", "client", map[string]string{"app": "a"}, "selected"},
		{"then the proxy's namespace (a wildcard host is enough)", "client", nil, "client-ns"},
		{"then the service's namespace, the most specific host", "web", nil, "service-ns"},
		{"a rule exported to its own namespace only applies there", "private", nil, "not-exported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxyIn(tc.ns, tc.labels)
			got := pc.Scope(p).DestinationRule(p, svc)
			if got == nil || got.Name != tc.want {
				t.Fatalf("DestinationRule = %v, want %s", got, tc.want)
			}
		})
	}
	rootOnly := newScopeStore(t).service("shop", host).put(istio.DestinationRule, "istio-system", "root", dr("*", nil)).build()
	p := proxyIn("web", nil)
	if got := rootOnly.Scope(p).DestinationRule(p, rootOnly.Scope(p).Service(host)); got == nil || got.Name != "root" {
		t.Fatalf("with only the root namespace's rule: %v, want root", got)
	}
}

// A DestinationRule generated from a BackendTLSPolicy (it carries
// internal.istio.io/parents) and a user's for the same host merge as in
// Istio's mergeDestinationRule whichever is older: the user's fields win,
// the policy's fill what the user's leaves unset, port by port too.
func TestAUsersDestinationRuleWinsOverABackendPolicysWhicheverIsOlder(t *testing.T) {
	const host = "secure.apps.svc.cluster.local"
	policyTLS := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "secure.example.com"}
	adminTLS := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "admin.example.com"}
	userTLS := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "mine.example.com"}
	leastRequest := &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_LEAST_REQUEST}}
	roundRobin := &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_ROUND_ROBIN}}
	generated := &networking.DestinationRule{Host: host, TrafficPolicy: &networking.TrafficPolicy{
		Tls: policyTLS,
		PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{
			{Port: &networking.PortSelector{Number: 9443}, Tls: adminTLS},
			{Port: &networking.PortSelector{Number: 8443}, Tls: adminTLS},
		},
	}}
	user := &networking.DestinationRule{Host: host, TrafficPolicy: &networking.TrafficPolicy{
		LoadBalancer: roundRobin,
		PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{
			{Port: &networking.PortSelector{Number: 9443}, LoadBalancer: leastRequest},
			{Port: &networking.PortSelector{Number: 8443}, Tls: userTLS},
		},
	}}
	for _, policyOlder := range []bool{true, false} {
		ss := newScopeStore(t).service("apps", host)
		policyTime, userTime := time.Unix(100, 0), time.Unix(200, 0)
		if !policyOlder {
			policyTime, userTime = userTime, policyTime
		}
		drKind, _ := istio.ByName(istio.DestinationRule)
		ss.s.PutObject(&istio.Object{Kind: drKind, Meta: istio.Meta{
			Namespace: "apps", Name: "secure~istio-autogenerated-k8s-gateway", CreationTime: policyTime,
			Annotations: map[string]string{AnnotationParents: "BackendTLSPolicy/apps.secure-tls"},
		}, Spec: generated})
		ss.s.PutObject(&istio.Object{Kind: drKind, Meta: istio.Meta{Namespace: "apps", Name: "secure-lb", CreationTime: userTime}, Spec: user})
		pc := ss.build()
		p := proxyIn("apps", nil)
		dr := pc.Scope(p).DestinationRule(p, pc.Scope(p).Service(host))
		if dr == nil {
			t.Fatalf("policy older %v: no DestinationRule", policyOlder)
		}
		tp := dr.Spec.GetTrafficPolicy()
		if !proto.Equal(tp.GetLoadBalancer(), roundRobin) || !proto.Equal(tp.GetTls(), policyTLS) {
			t.Errorf("policy older %v: top level %v, want the user's load balancer and the policy's TLS", policyOlder, tp)
		}
		ports := map[uint32]*networking.TrafficPolicy_PortTrafficPolicy{}
		for _, pl := range tp.GetPortLevelSettings() {
			ports[pl.GetPort().GetNumber()] = pl
		}
		if got := ports[9443]; len(ports) != 2 || !proto.Equal(got.GetLoadBalancer(), leastRequest) || !proto.Equal(got.GetTls(), adminTLS) {
			t.Errorf("policy older %v: port 9443 %v, want the user's load balancer and the policy's TLS", policyOlder, got)
		}
		if got := ports[8443]; !proto.Equal(got.GetTls(), userTLS) {
			t.Errorf("policy older %v: port 8443 %v, want the user's TLS", policyOlder, got)
		}
		if !proto.Equal(user.GetTrafficPolicy().GetPortLevelSettings()[0], &networking.TrafficPolicy_PortTrafficPolicy{Port: &networking.PortSelector{Number: 9443}, LoadBalancer: leastRequest}) {
			t.Fatalf("the user's rule was changed: %v", user)
		}
	}
}
