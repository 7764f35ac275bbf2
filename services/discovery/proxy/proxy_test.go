package proxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/types/known/structpb"
)

func node(t *testing.T, id string, md map[string]any) *corev3.Node {
	t.Helper()
	st, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: id, Metadata: st}
}

func TestASidecarNodeIsParsedWithItsMetadata(t *testing.T) {
	n := node(t, "sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local", map[string]any{
		"NAMESPACE": "default", "ISTIO_VERSION": "1.30.3", "CLUSTER_ID": "Kubernetes",
		"SERVICE_ACCOUNT": "app", "LABELS": map[string]any{"app": "app", "version": "v1"},
		"INSTANCE_IPS": "10.1.1.1,fd00::1",
	})
	got, err := FromNode(n)
	if err != nil {
		t.Fatal(err)
	}
	want := &Proxy{
		Type: Sidecar, IPs: []netip.Addr{netip.MustParseAddr("10.1.1.1"), netip.MustParseAddr("fd00::1")},
		ID: "app-7d9f.default", DNSDomain: "default.svc.cluster.local", Namespace: "default",
		Labels: map[string]string{"app": "app", "version": "v1"}, IstioVersion: "1.30.3",
		ClusterID: "Kubernetes", ServiceAccount: "app",
		Metadata: map[string]string{
			"CLUSTER_ID": "Kubernetes", "INSTANCE_IPS": "10.1.1.1,fd00::1", "ISTIO_VERSION": "1.30.3",
			"NAMESPACE": "default", "SERVICE_ACCOUNT": "app",
		},
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmpopts.IgnoreUnexported(Proxy{})); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestAProxylessGRPCClientAndAGatewayAreRecognised(t *testing.T) {
	grpc, err := FromNode(node(t, "sidecar~10.0.0.9~client-1.demo~demo.svc.cluster.local", map[string]any{"GENERATOR": "grpc"}))
	if err != nil || grpc.Generator != GeneratorGRPC || grpc.Namespace != "demo" {
		t.Fatalf("grpc client: %+v, %v", grpc, err)
	}
	gw, err := FromNode(node(t, "router~10.0.0.2~ingress-7c.istio-system~istio-system.svc.cluster.local", nil))
	if err != nil || gw.Type != Router || gw.Namespace != "istio-system" {
		t.Fatalf("gateway: %+v, %v", gw, err)
	}
}

func TestAProxysLocalityIsItsNodesElseItsIstioLocalityLabel(t *testing.T) {
	n := node(t, "sidecar~10.0.0.9~a-1.demo~demo.svc.cluster.local", map[string]any{"LABELS": map[string]any{LocalityLabel: "eu.eu-1.rack-2"}})
	p, err := FromNode(n)
	if err != nil || p.Locality.String() != "eu/eu-1/rack-2" {
		t.Fatalf("from the label: %+v, %v", p, err)
	}
	n.Locality = &corev3.Locality{Region: "us-east1", Zone: "us-east1-b"}
	p, err = FromNode(n)
	if err != nil || p.Locality.String() != "us-east1/us-east1-b/" {
		t.Fatalf("the node's wins: %+v, %v", p, err)
	}
	n.Locality = &corev3.Locality{Region: strings.Repeat("r", 600)}
	if _, err := FromNode(n); err == nil || !strings.Contains(err.Error(), "locality is 600 bytes") {
		t.Fatalf("oversized locality: %v", err)
	}
}

func TestBadNodesGetAClearError(t *testing.T) {
	long := strings.Repeat("x", 2000)
	tests := map[string]struct {
		id   string
		md   map[string]any
		want string
	}{
		"too few parts":              {"sidecar~10.1.1.1~pod.ns", nil, "want type~ip~id~domain"},
		"unknown type":               {"waypoint~10.1.1.1~p.ns~ns.svc", nil, `unknown proxy type "waypoint"`},
		"bad ip":                     {"sidecar~10.1.1~p.ns~ns.svc", nil, `"10.1.1" is not an IP address`},
		"empty id":                   {"sidecar~10.1.1.1~~ns.svc", nil, "the id part is empty"},
		"no namespace":               {"sidecar~10.1.1.1~pod~svc", nil, "no namespace"},
		"oversized id":               {"sidecar~10.1.1.1~" + long + "~d", nil, "more than 1024"},
		"labels not a map":           {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"LABELS": "app=x"}, "LABELS must be a map of strings"},
		"label not a string":         {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"LABELS": map[string]any{"n": 3.0}}, "LABELS[n] must be a string"},
		"namespace a number":         {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"NAMESPACE": 7.0}, "NAMESPACE must be a string"},
		"unknown generator":          {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"GENERATOR": "api"}, `GENERATOR "api" is not supported`},
		"bad instance ip":            {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"INSTANCE_IPS": "10.1.1.1,nope"}, `INSTANCE_IPS: "nope"`},
		"proxy config not an object": {"sidecar~10.1.1.1~p.ns~ns.svc", map[string]any{"PROXY_CONFIG": "{}"}, "PROXY_CONFIG must be an object"},
		"proxy config of wrong types": {
			"sidecar~10.1.1.1~p.ns~ns.svc",
			map[string]any{"PROXY_CONFIG": map[string]any{"gatewayTopology": map[string]any{"numTrustedProxies": "many"}}},
			"PROXY_CONFIG is not a proxy config",
		},
		"oversized proxy config": {
			"sidecar~10.1.1.1~p.ns~ns.svc",
			map[string]any{"PROXY_CONFIG": map[string]any{"proxyMetadata": map[string]any{"X": strings.Repeat("y", 70<<10)}}},
			"more than 65536",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := FromNode(node(t, tc.id, tc.md))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := FromNode(nil); err == nil {
		t.Fatal("nil node accepted")
	}
}

func TestAGatewaysProxyConfigIsReadFromItsNodeAndUnknownFieldsAreLeftOut(t *testing.T) {
	p, err := FromNode(node(t, "router~10.1.1.1~gw-1.edge~edge.svc.cluster.local", map[string]any{
		"PROXY_CONFIG": map[string]any{
			"gatewayTopology":     map[string]any{"numTrustedProxies": 2.0, "forwardClientCertDetails": "APPEND_FORWARD", "proxyProtocol": map[string]any{}},
			"concurrency":         2.0,
			"aFieldOfANewerIstio": true,
		},
	}))
	if err != nil {
		t.Fatal(err)
	}
	gt := p.ProxyConfig.GetGatewayTopology()
	if gt.GetNumTrustedProxies() != 2 || gt.GetForwardClientCertDetails().String() != "APPEND_FORWARD" || gt.GetProxyProtocol() == nil || p.ProxyConfig.GetConcurrency().GetValue() != 2 {
		t.Fatalf("proxy config %v", p.ProxyConfig)
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local")
	f.Add("router~::1~x.y~z")
	f.Add("~~~")
	f.Fuzz(func(t *testing.T, id string) {
		p, err := ParseID(id)
		if (p == nil) == (err == nil) {
			t.Fatalf("ParseID(%q) = %v, %v", id, p, err)
		}
	})
}

// Istio's build of Envoy lists its stats and peer-metadata filters among
// the extensions in its node; upstream Envoy does not.
func TestAProxyGetsIstiosTelemetryOnlyWhenItsEnvoyListsItsExtensions(t *testing.T) {
	ext := func(urls ...string) *corev3.Extension { return &corev3.Extension{Name: "x", TypeUrls: urls} }
	istio := []*corev3.Extension{
		ext("stats.PluginConfig"), ext("type.googleapis.com/io.istio.http.peer_metadata.Config"),
		ext("envoy.tcp.metadataexchange.config.MetadataExchange"), ext("envoy.extensions.filters.http.router.v3.Router"),
	}
	for _, tt := range []struct {
		name string
		exts []*corev3.Extension
		want bool
	}{
		{"Istio's Envoy", istio, true},
		{"upstream Envoy", istio[3:], false},
		{"one of them missing", istio[1:], false},
		{"one of them disabled", append([]*corev3.Extension{{TypeUrls: []string{"stats.PluginConfig"}, Disabled: true}}, istio[1:]...), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := node(t, "sidecar~10.1.1.1~app-1.default~default.svc.cluster.local", nil)
			n.Extensions = tt.exts
			p, err := FromNode(n)
			if err != nil {
				t.Fatal(err)
			}
			if p.IstioTelemetry != tt.want {
				t.Fatalf("IstioTelemetry = %v, want %v", p.IstioTelemetry, tt.want)
			}
		})
	}
}

func TestANodesClusterAndMeshIDAreBounded(t *testing.T) {
	n := node(t, "sidecar~10.1.1.1~app-1.default~default.svc.cluster.local", map[string]any{"MESH_ID": strings.Repeat("m", 513)})
	if _, err := FromNode(n); err == nil || !strings.Contains(err.Error(), "MESH_ID") {
		t.Fatalf("err = %v, want MESH_ID too long", err)
	}
	n = node(t, "sidecar~10.1.1.1~app-1.default~default.svc.cluster.local", map[string]any{"MESH_ID": "mesh1"})
	n.Cluster = "app.default"
	p, err := FromNode(n)
	if err != nil || p.MeshID != "mesh1" || p.ServiceCluster != "app.default" {
		t.Fatalf("got %+v, %v", p, err)
	}
}

func TestOnlyBoundedStringMetadataIsKeptForEnvoyFilterMatches(t *testing.T) {
	md := map[string]any{"NAMESPACE": "default", "POD_PORTS": strings.Repeat("x", maxLabelLn), "ANNOTATIONS": map[string]any{"a": "b"}, "N": 3.0}
	for i := range 2 * maxLabels {
		md[fmt.Sprintf("K%04d", i)] = "v"
	}
	got, err := FromNode(node(t, "sidecar~10.1.1.1~app.default~default.svc.cluster.local", md))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Metadata) != maxLabels {
		t.Errorf("%d metadata fields kept, want at most %d", len(got.Metadata), maxLabels)
	}
	for _, k := range []string{"POD_PORTS", "ANNOTATIONS", "N"} {
		if _, ok := got.Metadata[k]; ok {
			t.Errorf("%s kept: only string fields within %d bytes are", k, maxLabelLn)
		}
	}
	if got.Metadata["K0000"] != "v" {
		t.Errorf("K0000 = %q, want v (keys are kept in order)", got.Metadata["K0000"])
	}
}
