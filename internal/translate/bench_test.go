package translate

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi/gatewayapitest"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// benchMesh is n services in 10 namespaces, each with an HTTP and a gRPC
// port, three endpoints (v1, v2, v3), a DestinationRule with three subsets
// and a VirtualService splitting between two of them.
func benchMesh(b *testing.B, n int) *model.Store {
	b.Helper()
	kinds := kindsByName()
	s := model.NewStore()
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i%10)
		name := fmt.Sprintf("svc-%d", i)
		host := name + "." + ns + ".svc.cluster.local"
		s.PutService(&registryv1.Service{
			Hostname: host, Name: name, Namespace: ns, Addresses: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
			Ports: []*registryv1.ServicePort{
				{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP, TargetPort: 8080},
				{Name: "grpc", Number: 9090, Protocol: registryv1.Protocol_PROTOCOL_GRPC, TargetPort: 9090},
			},
		})
		es := &registryv1.EndpointSet{ServiceHostname: host, ServiceNamespace: ns, Shard: "0"}
		for v := 1; v <= 3; v++ {
			es.Endpoints = append(es.Endpoints, &registryv1.Endpoint{
				Address: fmt.Sprintf("10.%d.%d.%d", 1+v, i/250, i%250+1), Labels: map[string]string{"app": name, "version": fmt.Sprintf("v%d", v)},
				Ports:          []*registryv1.EndpointPort{{ServicePortName: "http", Number: 8080}, {ServicePortName: "grpc", Number: 9090}},
				ServiceAccount: name, Health: registryv1.HealthStatus_HEALTH_STATUS_HEALTHY, TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO,
				Locality: &registryv1.Locality{Region: "r1", Zone: fmt.Sprintf("z%d", v)},
			})
		}
		s.PutEndpointSet(es)
		s.PutObject(&istio.Object{Kind: kinds["DestinationRule"], Meta: istio.Meta{Name: name, Namespace: ns}, Spec: &networking.DestinationRule{
			Host: name,
			TrafficPolicy: &networking.TrafficPolicy{
				ConnectionPool:   &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 100}},
				OutlierDetection: &networking.OutlierDetection{},
			},
			Subsets: []*networking.Subset{
				{Name: "v1", Labels: map[string]string{"version": "v1"}},
				{Name: "v2", Labels: map[string]string{"version": "v2"}},
				{Name: "v3", Labels: map[string]string{"version": "v3"}},
			},
		}})
		s.PutObject(&istio.Object{Kind: kinds["VirtualService"], Meta: istio.Meta{Name: name, Namespace: ns}, Spec: &networking.VirtualService{
			Hosts: []string{name},
			Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{
				{Destination: &networking.Destination{Host: name, Subset: "v1"}, Weight: 90},
				{Destination: &networking.Destination{Host: name, Subset: "v2"}, Weight: 10},
			}}},
		}})
	}
	return s
}

func benchProxy(generator string) *model.Proxy {
	return &model.Proxy{Type: model.SidecarProxy, IPs: []netip.Addr{netip.MustParseAddr("10.2.0.1")}, ID: "svc-0-abc.ns-0", Namespace: "ns-0", Generator: generator}
}

func BenchmarkBuildPushContext(b *testing.B) {
	s := benchMesh(b, 1000)
	b.ReportAllocs()
	var v uint64
	for b.Loop() {
		v++
		s.PutService(&registryv1.Service{Hostname: "extra.ns-0.svc.cluster.local", Namespace: "ns-0"}) // a full change each time
		pc, _ := s.Build(model.BuildOptions{}, nil, v)
		_ = pc.Scope(benchProxy(""))
	}
}

// BenchmarkSidecar is one sidecar's whole configuration in a mesh of 1,000
// services × 2 ports × 3 subsets (8,000 clusters). "cold" is the first
// proxy of a push (nothing shared yet; the push context's build is not
// counted), "warm" another proxy of the same push.
func BenchmarkSidecar(b *testing.B) {
	s := benchMesh(b, 1000)
	benchTypes(b, s, benchProxy(""), []string{"CDS", "EDS", "LDS", "RDS", "all"})
}

// BenchmarkCDSAndRDS100HTTPServices is a sidecar's clusters and routes in
// a mesh of 100 services with one HTTP port each and no subsets (the
// target is under 1 ms).
func BenchmarkCDSAndRDS100HTTPServices(b *testing.B) {
	s := model.NewStore()
	for i := range 100 {
		name := fmt.Sprintf("svc-%d", i)
		s.PutService(&registryv1.Service{
			Hostname: name + ".default.svc.cluster.local", Name: name, Namespace: "default",
			Addresses: []string{fmt.Sprintf("10.96.0.%d", i+1)}, SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
			Ports: []*registryv1.ServicePort{{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP, TargetPort: 8080}},
		})
	}
	benchTypes(b, s, benchProxy(""), []string{"CDS+RDS"})
}

func benchTypes(b *testing.B, s *model.Store, p *model.Proxy, types []string) {
	b.Helper()
	for _, mode := range []string{"cold", "warm"} {
		for _, typ := range types {
			b.Run(mode+"/"+typ, func(b *testing.B) {
				b.ReportAllocs()
				var v uint64 = 1
				pc, _ := s.Build(model.BuildOptions{}, nil, v)
				pc.Scope(p)
				n := 0
				for range b.N {
					if mode == "cold" {
						b.StopTimer()
						v++
						s.PutMesh(nil)
						pc, _ = s.Build(model.BuildOptions{}, nil, v)
						pc.Scope(p)
						b.StartTimer()
					}
					g := NewGenerator(pc, p)
					switch typ {
					case "CDS":
						n = len(g.Clusters(nil))
					case "EDS":
						n = len(g.Endpoints(nil))
					case "LDS":
						n = len(g.Listeners(nil))
					case "RDS":
						n = len(g.Routes(nil))
					case "CDS+RDS":
						n = len(g.Clusters(nil)) + len(g.Routes(nil))
					default:
						out := Generate(pc, p)
						n = len(out.Clusters) + len(out.Endpoints) + len(out.Listeners) + len(out.Routes)
					}
				}
				b.ReportMetric(float64(n), "resources")
			})
		}
	}
}

// BenchmarkProxylessClientOneTarget is what a proxyless gRPC client
// dialing one service gets in the 1,000-service mesh: its listener, route,
// clusters and endpoints (warm: another client of the same push).
func BenchmarkProxylessClientOneTarget(b *testing.B) {
	s := benchMesh(b, 1000)
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	p := benchProxy(model.GeneratorGRPC)
	pc.Scope(p)
	name := ListenerName("svc-7.ns-7.svc.cluster.local", 9090)
	clusters := []string{
		ClusterName("outbound", 9090, "v1", "svc-7.ns-7.svc.cluster.local"),
		ClusterName("outbound", 9090, "v2", "svc-7.ns-7.svc.cluster.local"),
	}
	b.ReportAllocs()
	for b.Loop() {
		g := NewGenerator(pc, p)
		if len(g.Listeners([]string{name})) != 1 || len(g.Routes([]string{name})) != 1 ||
			len(g.Clusters(clusters)) != 2 || len(g.Endpoints(clusters)) != 2 {
			b.Fatal("missing resources")
		}
	}
}

// authzMesh is Istio's authorizationpolicy benchmark workload
// (pilot/pkg/xds/testdata/benchmarks/authorizationpolicy.yaml): the
// proxy's own service (HTTP 80, HTTPS 443, one endpoint: the proxy),
// and n AuthorizationPolicies, each a DENY rule from a namespace on a
// method, spread over namespaces ns-0 … ns-<spread-1> (the proxy's is
// ns-0); spread 1 puts them all on the proxy.
func authzMesh(b *testing.B, n, spread int) (*model.Store, *model.Proxy) {
	b.Helper()
	kinds := kindsByName()
	s := model.NewStore()
	s.PutService(&registryv1.Service{
		Hostname: "example.com", Name: "example.com", Namespace: "ns-0", SourceKind: registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY,
		Ports: []*registryv1.ServicePort{
			{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP},
			{Name: "https", Number: 443, Protocol: registryv1.Protocol_PROTOCOL_HTTPS},
		},
	})
	s.PutEndpointSet(&registryv1.EndpointSet{ServiceHostname: "example.com", ServiceNamespace: "ns-0", Shard: "0", Endpoints: []*registryv1.Endpoint{{
		Address: "10.2.0.1", Labels: map[string]string{"istio.io/benchmark": "true"}, Health: registryv1.HealthStatus_HEALTH_STATUS_HEALTHY,
		Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 80}, {ServicePortName: "https", Number: 443}},
	}}})
	for i := range n {
		s.PutObject(&istio.Object{Kind: kinds["AuthorizationPolicy"], Meta: istio.Meta{Name: fmt.Sprintf("authn-%d", i), Namespace: fmt.Sprintf("ns-%d", i%spread)}, Spec: &security.AuthorizationPolicy{
			Action: security.AuthorizationPolicy_DENY,
			Rules: []*security.Rule{{
				From: []*security.Rule_From{{Source: &security.Source{Namespaces: []string{"default"}}}},
				To:   []*security.Rule_To{{Operation: &security.Operation{Methods: []string{"POST"}}}},
			}},
		}})
	}
	p := benchProxy("")
	p.Labels = map[string]string{"istio.io/benchmark": "true"}
	return s, p
}

// BenchmarkAuthorizationPolicies is a sidecar's listeners with its
// workload's AuthorizationPolicies as RBAC filters: none, Istio's
// benchmark (1,000 policies on the proxy), and 1,000 across 100
// namespaces (10 on the proxy); and a proxyless gRPC server's listener
// with the 1,000.
func BenchmarkAuthorizationPolicies(b *testing.B) {
	for _, tc := range []struct {
		name      string
		n, spread int
	}{{"none", 0, 1}, {"1000-on-proxy", 1000, 1}, {"1000-in-100-namespaces", 1000, 100}} {
		s, p := authzMesh(b, tc.n, tc.spread)
		b.Run(tc.name, func(b *testing.B) { benchTypes(b, s, p, []string{"LDS"}) })
	}
	s, p := authzMesh(b, 1000, 1)
	p.Generator = model.GeneratorGRPC
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	name := GRPCInboundPrefix + "10.2.0.1:80"
	b.Run("1000-on-proxy/proxyless-server-LDS", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(NewGenerator(pc, p).Listeners([]string{name})) != 1 {
				b.Fatal("no listener")
			}
		}
	})
}

// gatewayMesh is Istio's gateways benchmark workload
// (pilot/pkg/xds/testdata/benchmarks/gateways.yaml): n Gateways on one
// gateway proxy, each with an HTTP server (port 80) and an ISTIO_MUTUAL
// HTTPS server (443) for three hosts, a VirtualService binding those
// hosts to a ServiceEntry of its own.
func gatewayMesh(b *testing.B, n int) (*model.Store, *model.Proxy) {
	b.Helper()
	kinds := kindsByName()
	s := model.NewStore()
	for i := range n {
		hosts := []string{fmt.Sprintf("random-a-%d.host.example", i), fmt.Sprintf("random-b-%d.host.example", i), fmt.Sprintf("random-c-%d.host.example", i)}
		host := fmt.Sprintf("random-%d.host.example", i)
		s.PutService(&registryv1.Service{
			Hostname: host, Name: host, Namespace: "gateway", SourceKind: registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY,
			Resolution: registryv1.Resolution_RESOLUTION_STATIC, Location: registryv1.Location_LOCATION_MESH_EXTERNAL,
			Ports: []*registryv1.ServicePort{{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		})
		s.PutObject(&istio.Object{Kind: kinds["Gateway"], Meta: istio.Meta{Name: fmt.Sprintf("gateway-%d", i), Namespace: "gateway"}, Spec: &networking.Gateway{
			Selector: map[string]string{"istio.io/benchmark": "true"},
			Servers: []*networking.Server{
				{Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}, Hosts: hosts},
				{Port: &networking.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: hosts, Tls: &networking.ServerTLSSettings{Mode: networking.ServerTLSSettings_ISTIO_MUTUAL}},
			},
		}})
		s.PutObject(&istio.Object{Kind: kinds["VirtualService"], Meta: istio.Meta{Name: fmt.Sprintf("vs-%d", i), Namespace: "gateway"}, Spec: &networking.VirtualService{
			Hosts:    hosts,
			Gateways: []string{fmt.Sprintf("gateway/gateway-%d", i)},
			Http: []*networking.HTTPRoute{{
				Match: []*networking.HTTPMatchRequest{{Uri: &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: fmt.Sprintf("/route-%d", i)}}}},
				Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: host}}},
			}},
		}})
	}
	p := &model.Proxy{
		Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.2.0.9")}, ID: "gateway-abc.gateway", Namespace: "gateway",
		Labels: map[string]string{"istio.io/benchmark": "true"},
	}
	return s, p
}

// BenchmarkGateways1000 is Istio's 1,000-gateway benchmark for one
// gateway proxy (Istio: CDS 21.9 ms, LDS 23.6 ms, RDS 41.4 ms on this
// kind of machine; the target is half of each).
//
// Istio's generators return resources encoded (protoconv.MessageToAny),
// so its figures include the encoding; "encoded" is the comparable
// figure here: a warm generation and the deterministic encoding of each
// resource, as discovery sends them (services/discovery/xds/generation.go).
func BenchmarkGateways1000(b *testing.B) {
	s, p := gatewayMesh(b, 1000)
	benchTypes(b, s, p, []string{"CDS", "LDS", "RDS"})
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	pc.Scope(p)
	for _, typ := range []struct{ name, url string }{{"CDS", resourcev3.ClusterType}, {"LDS", resourcev3.ListenerType}, {"RDS", resourcev3.RouteType}} {
		b.Run("encoded/"+typ.name, func(b *testing.B) {
			b.ReportAllocs()
			opts := proto.MarshalOptions{Deterministic: true}
			var n, size int
			for b.Loop() {
				n, size = 0, 0
				for _, m := range NewGenerator(pc, p).Resources(typ.url, nil) {
					raw, err := opts.Marshal(m)
					if err != nil {
						b.Fatal(err)
					}
					n++
					size += len(raw)
				}
			}
			b.ReportMetric(float64(n), "resources")
			b.ReportMetric(float64(size)/1024, "KiB")
		})
	}
}

// kindsByName are Istio's kinds by kind name.
func kindsByName() map[string]istio.Kind {
	kinds := map[string]istio.Kind{}
	for _, k := range istio.Kinds() {
		kinds[k.Kind] = k
	}
	return kinds
}

// BenchmarkSidecarTelemetry is one sidecar's listeners and clusters in
// the 1,000-service mesh, first of its push (cold), with the mesh's
// telemetry off (enableTracing false), at Istio's defaults (tracing
// sampling and tags on every connection manager), and configured by
// the Telemetry API for a proxy on Istio's Envoy (a file access log, an
// OpenTelemetry tracer, Istio's metrics with an override, and the peer
// metadata exchange). listener-bytes is the encoded size of its
// listeners.
func BenchmarkSidecarTelemetry(b *testing.B) {
	const providers = "extensionProviders:\n" +
		"- name: otel\n  opentelemetry: {service: svc-1.ns-1.svc.cluster.local, port: 9090}\n" +
		"defaultProviders: {metrics: [prometheus], accessLogging: [envoy], tracing: [otel]}\n"
	for _, tc := range []struct {
		name, mesh string
		telemetry  bool
	}{
		{"off", "enableTracing: false\n", false},
		{"defaults", "", false},
		{"telemetry-api", providers, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := benchMesh(b, 1000)
			mesh, err := istio.ParseMeshConfig([]byte(tc.mesh))
			if err != nil {
				b.Fatal(err)
			}
			s.PutMesh(mesh)
			if tc.telemetry {
				spec := &telemetry.Telemetry{Metrics: []*telemetry.Metrics{{Overrides: []*telemetry.MetricsOverrides{{
					Match:        &telemetry.MetricSelector{MetricMatch: &telemetry.MetricSelector_Metric{Metric: telemetry.MetricSelector_REQUEST_COUNT}},
					TagOverrides: map[string]*telemetry.MetricsOverrides_TagOverride{"request_protocol": {Operation: telemetry.MetricsOverrides_TagOverride_REMOVE}},
				}}}}, Tracing: []*telemetry.Tracing{{RandomSamplingPercentage: wrapperspb.Double(10)}}}
				s.PutObject(&istio.Object{Kind: kindsByName()[istio.Telemetry], Meta: istio.Meta{Name: "mesh", Namespace: "istio-system"}, Spec: spec})
			}
			p := benchProxy("")
			p.IstioTelemetry = tc.telemetry
			b.ReportAllocs()
			var v uint64
			size := 0
			for b.Loop() {
				b.StopTimer()
				v++
				s.PutService(&registryv1.Service{Hostname: "extra.ns-0.svc.cluster.local", Namespace: "ns-0"})
				pc, _ := s.Build(model.BuildOptions{}, nil, v)
				pc.Scope(p)
				b.StartTimer()
				g := NewGenerator(pc, p)
				ls := g.Listeners(nil)
				_ = g.Clusters(nil)
				size = 0
				for _, l := range ls {
					size += proto.Size(l)
				}
			}
			b.ReportMetric(float64(size), "listener-bytes")
		})
	}
}

// BenchmarkEnvoyFilters is one push to 20 and to 100 sidecars of one
// namespace (the 200-service mesh of benchMesh: every resource a sidecar
// gets) with 0, 10 and 100 EnvoyFilters in the root namespace selecting every sidecar,
// each one patch in turn: a Lua filter before the router of one outbound
// port, a merge into one service's clusters, a merge into its virtual
// host. The patched resources are built once per push for all the
// sidecars.
func BenchmarkEnvoyFilters(b *testing.B) {
	lua, err := structpb.NewStruct(map[string]any{"name": "lua", "typed_config": map[string]any{
		"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "default_source_code": map[string]any{"inline_string": "-- x"},
	}})
	if err != nil {
		b.Fatal(err)
	}
	buffer, _ := structpb.NewStruct(map[string]any{"per_connection_buffer_limit_bytes": 1024.0})
	attempts, _ := structpb.NewStruct(map[string]any{"include_request_attempt_count": true})
	for _, tc := range [][2]int{{0, 20}, {10, 20}, {100, 20}, {0, 100}, {100, 100}} {
		n, sidecars := tc[0], tc[1]
		b.Run(fmt.Sprintf("envoyfilters-%d/sidecars-%d", n, sidecars), func(b *testing.B) {
			s := benchMesh(b, 200)
			for i := range n {
				var cp *networking.EnvoyFilter_EnvoyConfigObjectPatch
				svc := fmt.Sprintf("svc-%d.ns-%d.svc.cluster.local", i, i%10)
				switch i % 3 {
				case 0:
					cp = &networking.EnvoyFilter_EnvoyConfigObjectPatch{
						ApplyTo: networking.EnvoyFilter_HTTP_FILTER,
						Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{Context: networking.EnvoyFilter_SIDECAR_OUTBOUND, ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Listener{
							Listener: &networking.EnvoyFilter_ListenerMatch{PortNumber: uint32(80 + i%2*9010), FilterChain: &networking.EnvoyFilter_ListenerMatch_FilterChainMatch{
								Filter: &networking.EnvoyFilter_ListenerMatch_FilterMatch{Name: hcmFilter, SubFilter: &networking.EnvoyFilter_ListenerMatch_SubFilterMatch{Name: "envoy.filters.http.router"}},
							}},
						}},
						Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_INSERT_BEFORE, Value: lua},
					}
				case 1:
					cp = &networking.EnvoyFilter_EnvoyConfigObjectPatch{
						ApplyTo: networking.EnvoyFilter_CLUSTER,
						Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Cluster{
							Cluster: &networking.EnvoyFilter_ClusterMatch{Service: svc},
						}},
						Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_MERGE, Value: buffer},
					}
				default:
					cp = &networking.EnvoyFilter_EnvoyConfigObjectPatch{
						ApplyTo: networking.EnvoyFilter_VIRTUAL_HOST,
						Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_RouteConfiguration{
							RouteConfiguration: &networking.EnvoyFilter_RouteConfigurationMatch{Vhost: &networking.EnvoyFilter_RouteConfigurationMatch_VirtualHostMatch{Name: svc + ":80"}},
						}},
						Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_MERGE, Value: attempts},
					}
				}
				s.PutObject(&istio.Object{
					Kind: kindsByName()[istio.EnvoyFilter], Meta: istio.Meta{Name: fmt.Sprintf("ef-%d", i), Namespace: "istio-system"},
					Spec: &networking.EnvoyFilter{ConfigPatches: []*networking.EnvoyFilter_EnvoyConfigObjectPatch{cp}},
				})
			}
			proxies := make([]*model.Proxy, sidecars)
			for i := range proxies {
				proxies[i] = benchProxy("")
				proxies[i].ID = fmt.Sprintf("app-%d.ns-0", i)
				proxies[i].IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 9, 0, byte(i + 1)})}
			}
			b.ReportAllocs()
			var v uint64
			for b.Loop() {
				b.StopTimer()
				v++
				s.PutService(&registryv1.Service{Hostname: "extra.ns-0.svc.cluster.local", Namespace: "ns-0"})
				pc, _ := s.Build(model.BuildOptions{}, nil, v)
				b.StartTimer()
				for _, p := range proxies {
					g := NewGenerator(pc, p)
					_ = g.Listeners(nil)
					_ = g.Clusters(nil)
					_ = g.Routes(nil)
				}
			}
		})
	}
}

// BenchmarkGatewayAPI1000HTTPRoutesOn10Gateways is the xDS of one gateway
// proxy (of gw-0, with its 100 routes) when the cluster's Gateway API is
// 1,000 HTTPRoutes on 10 Gateways, converted as galley converts it: the
// push cost of the Gateway API, beside BenchmarkGateways1000's for
// Istio's own Gateways.
func BenchmarkGatewayAPI1000HTTPRoutesOn10Gateways(b *testing.B) {
	in := gatewayapitest.Routes(1000, 10)
	s := model.NewStore()
	for key := range in.Cluster.(*gatewayapitest.Cluster).Services {
		ns, name, _ := strings.Cut(key, "/")
		host := name + "." + ns + ".svc.cluster.local"
		s.PutService(&registryv1.Service{
			Hostname: host, Name: name, Namespace: ns, SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
			Ports: []*registryv1.ServicePort{{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP, TargetPort: 8080}},
		})
		addr := "10.3.0.1" // the gateway proxy, an instance of gw-0-flotilla
		if name != "gw-0-flotilla" {
			addr = fmt.Sprintf("10.4.%d.%d", len(key)%250, len(ns)%250+1)
		}
		s.PutEndpointSet(&registryv1.EndpointSet{ServiceHostname: host, ServiceNamespace: ns, Shard: "0", Endpoints: []*registryv1.Endpoint{{
			Address: addr, Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 8080}}, Health: registryv1.HealthStatus_HEALTH_STATUS_HEALTHY,
		}}})
	}
	for _, o := range gatewayapi.Convert(in).Objects {
		s.PutObject(o)
	}
	p := &model.Proxy{Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.3.0.1")}, ID: "gw-0-flotilla-abc.edge", Namespace: "edge"}
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	hosts := 0
	for _, r := range NewGenerator(pc, p).Resources(resourcev3.RouteType, nil) {
		hosts += len(r.(*routev3.RouteConfiguration).GetVirtualHosts()) //nolint:forcetypeassert // RDS resources are route configurations
	}
	if hosts != 100 {
		b.Fatalf("the gateway proxy has %d virtual hosts, want gw-0's 100", hosts)
	}
	benchTypes(b, s, p, []string{"CDS", "LDS", "RDS"})
}

// BenchmarkNameTable is the name table (NDS) of a sidecar that captures
// DNS in a mesh of 10,000 hosts (benchMesh's 5,000 services and 5,000
// ServiceEntry hosts with allocated addresses), built once per push and
// shared by the proxies of a scope: the first proxy's build, and the
// table's encoded size (bytes).
func BenchmarkNameTable(b *testing.B) {
	s := benchMesh(b, 5000)
	for i := range 5000 {
		s.PutService(&registryv1.Service{
			Hostname: fmt.Sprintf("db-%d.example.com", i), Name: fmt.Sprintf("db-%d", i), Namespace: "ns-0",
			SourceKind: registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY, Resolution: registryv1.Resolution_RESOLUTION_DNS,
			AutoAllocatedAddresses: []string{fmt.Sprintf("240.240.%d.%d", i/250, i%250+1), fmt.Sprintf("2001:2::%x", i+1)},
			Ports:                  []*registryv1.ServicePort{{Name: "tcp", Number: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP}},
		})
	}
	p := benchProxy("")
	p.Metadata = map[string]string{"DNS_CAPTURE": "true"}
	var v uint64
	b.Run("build", func(b *testing.B) {
		b.ReportAllocs()
		var size int
		for b.Loop() {
			b.StopTimer()
			v++
			pc, _ := s.Build(model.BuildOptions{}, nil, v)
			b.StartTimer()
			nt := NewGenerator(pc, p).NameTable()
			if len(nt.GetTable()) != 10000 {
				b.Fatalf("%d names, want 10,000", len(nt.GetTable()))
			}
			size = proto.Size(nt)
		}
		b.ReportMetric(float64(size), "bytes")
	})
}
