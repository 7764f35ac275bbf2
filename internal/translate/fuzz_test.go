package translate

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// FuzzGenerate translates an arbitrary VirtualService, DestinationRule,
// Sidecar and delegate VirtualService, and the Sidecar's bytes read as a
// Gateway (as if they had bypassed validation), for a sidecar, a
// proxyless client and a gateway: translation never panics, and whatever
// it returns passes the checks it promises.
func FuzzGenerate(f *testing.F) {
	vs, _ := proto.Marshal(&networking.VirtualService{Hosts: []string{"a"}, Http: []*networking.HTTPRoute{{
		Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a", Subset: "v1"}, Weight: 50}},
	}}})
	dr, _ := proto.Marshal(&networking.DestinationRule{Host: "a", Subsets: []*networking.Subset{{Name: "v1", Labels: map[string]string{"v": "1"}}}})
	sc, _ := proto.Marshal(&networking.Sidecar{
		Ingress: []*networking.IstioIngressListener{{Port: &networking.SidecarPort{Number: 8080, Protocol: "HTTP"}, DefaultEndpoint: "0.0.0.0:18080"}},
		Egress: []*networking.IstioEgressListener{
			{Port: &networking.SidecarPort{Number: 9000, Protocol: "TCP"}, Bind: "127.0.0.1", Hosts: []string{"./*"}},
			{Hosts: []string{"*/*"}},
		},
		OutboundTrafficPolicy: &networking.OutboundTrafficPolicy{EgressProxy: &networking.Destination{Host: "a", Port: &networking.PortSelector{Number: 80}}},
	})
	del, _ := proto.Marshal(&networking.VirtualService{Http: []*networking.HTTPRoute{{
		Match: []*networking.HTTPMatchRequest{{Uri: &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/x"}}}},
		Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a"}}},
	}}})
	root, _ := proto.Marshal(&networking.VirtualService{Hosts: []string{"a"}, Http: []*networking.HTTPRoute{{
		Match:    []*networking.HTTPMatchRequest{{Uri: &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/"}}}},
		Delegate: &networking.Delegate{Name: "delegate"},
	}}})
	f.Add(vs, dr, []byte{}, []byte{})
	f.Add(root, dr, sc, del)
	f.Add([]byte{}, []byte{0x0a, 0x01, 0x2a}, []byte{0x0a, 0x01}, []byte{0x12})
	gwBytes, _ := proto.Marshal(&networking.Gateway{Servers: []*networking.Server{
		{Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}, Hosts: []string{"*"}},
		{Port: &networking.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"./a"}, Tls: &networking.ServerTLSSettings{Mode: networking.ServerTLSSettings_SIMPLE, CredentialName: "c"}},
		{Port: &networking.Port{Number: 15443, Name: "tls", Protocol: "TLS"}, Hosts: []string{"*"}, Tls: &networking.ServerTLSSettings{Mode: networking.ServerTLSSettings_AUTO_PASSTHROUGH}},
	}})
	vsGW, _ := proto.Marshal(&networking.VirtualService{Hosts: []string{"*"}, Gateways: []string{"gw"}, Http: []*networking.HTTPRoute{{
		Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a"}}},
	}}, Tcp: []*networking.TCPRoute{{Route: []*networking.RouteDestination{{Destination: &networking.Destination{Host: "a", Port: &networking.PortSelector{Number: 9000}}}}}}})
	f.Add(vsGW, dr, gwBytes, []byte{})
	kinds := kindsByName()
	f.Fuzz(func(t *testing.T, vsBytes, drBytes, scBytes, delegateBytes []byte) {
		s := serviceA(&registryv1.Endpoint{Address: "10.1.0.1", Labels: map[string]string{"v": "1"}})
		v := &networking.VirtualService{}
		if proto.Unmarshal(vsBytes, v) == nil {
			s.PutObject(&istio.Object{Kind: kinds["VirtualService"], Meta: istio.Meta{Name: "vs", Namespace: "default"}, Spec: v})
		}
		d := &networking.DestinationRule{}
		if proto.Unmarshal(drBytes, d) == nil {
			s.PutObject(&istio.Object{Kind: kinds["DestinationRule"], Meta: istio.Meta{Name: "dr", Namespace: "default"}, Spec: d})
		}
		sc := &networking.Sidecar{}
		if proto.Unmarshal(scBytes, sc) == nil {
			s.PutObject(&istio.Object{Kind: kinds["Sidecar"], Meta: istio.Meta{Name: "default", Namespace: "default"}, Spec: sc})
		}
		del := &networking.VirtualService{}
		if proto.Unmarshal(delegateBytes, del) == nil {
			s.PutObject(&istio.Object{Kind: kinds["VirtualService"], Meta: istio.Meta{Name: "delegate", Namespace: "default"}, Spec: del})
		}
		gw := &networking.Gateway{}
		if proto.Unmarshal(scBytes, gw) == nil {
			s.PutObject(&istio.Object{Kind: kinds["Gateway"], Meta: istio.Meta{Name: "gw", Namespace: "default"}, Spec: gw})
		}
		pc, _ := s.Build(model.BuildOptions{}, nil, 1)
		for _, gen := range []string{"", model.GeneratorGRPC, "router"} {
			p := &model.Proxy{Type: model.SidecarProxy, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.9")}, Namespace: "default", Generator: gen}
			if gen == "router" {
				p.Type, p.Generator = model.RouterProxy, ""
			}
			out := Generate(pc, p)
			for _, c := range out.Clusters {
				if err := Validate(c); err != nil {
					t.Fatalf("cluster %s passed the checks but is invalid: %v", c.GetName(), err)
				}
			}
			for _, r := range out.Routes {
				if err := Validate(r); err != nil {
					t.Fatalf("route %s passed the checks but is invalid: %v", r.GetName(), err)
				}
			}
			for _, l := range out.Listeners {
				if err := Validate(l); err != nil {
					t.Fatalf("listener %s passed the checks but is invalid: %v", l.GetName(), err)
				}
			}
		}
	})
}

// serviceA is a store with service a (HTTP on 80, TCP on 9000) of one
// endpoint.
func serviceA(ep *registryv1.Endpoint) *model.Store {
	s := model.NewStore()
	s.PutService(&registryv1.Service{
		Hostname: "a.default.svc.cluster.local", Name: "a", Namespace: "default", Addresses: []string{"10.96.0.1"},
		SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
		Ports: []*registryv1.ServicePort{
			{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP},
			{Name: "tcp", Number: 9000, Protocol: registryv1.Protocol_PROTOCOL_TCP},
		},
	})
	s.PutEndpointSet(&registryv1.EndpointSet{
		ServiceHostname: "a.default.svc.cluster.local", ServiceNamespace: "default", Shard: "0",
		Endpoints: []*registryv1.Endpoint{ep},
	})
	return s
}
