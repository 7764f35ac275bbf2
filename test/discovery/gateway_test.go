package discovery_test

import (
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

const gatewayConfig = `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: public, namespace: edge}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*/shop.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: shop}
spec:
  hosts: [shop.example.com]
  gateways: [edge/public]
  http: [{route: [{destination: {host: cart.shop.svc.cluster.local}}]}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cart, namespace: shop}
spec:
  hosts: [cart.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.3.1}]
`

// adsStream opens an ADS stream as node id with labels in its metadata
// (as the agent's bootstrap sets them) and asks for typeURL.
func adsStream(t *testing.T, addr, id string, labels map[string]any, typeURL string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"LABELS": labels})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id, Metadata: md}, TypeUrl: typeURL}); err != nil {
		t.Fatal(err)
	}
	return st
}

// adsRecv waits (at most 30 s) for the next response on an ADS stream
// and ACKs it (naming no resources: for a wildcard type).
func adsRecv(t *testing.T, st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) *discoveryv3.DiscoveryResponse {
	t.Helper()
	ch := make(chan *discoveryv3.DiscoveryResponse, 1)
	errs := make(chan error, 1)
	go func() {
		resp, err := st.Recv()
		if err != nil {
			errs <- err
			return
		}
		ch <- resp
	}()
	select {
	case resp := <-ch:
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		return resp
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("no response within 30 s")
	}
	return nil
}

// TestAGatewayProxyGetsTheListenersAndRoutesOfItsGateways runs discovery
// on a directory with a Gateway in one namespace and a VirtualService in
// another bound to it; a raw ADS client connecting as a gateway proxy
// (node type router, with the Gateway's selector labels) gets the port's
// listener, naming route "http.80", and that route routes the host to
// the service.
func TestAGatewayProxyGetsTheListenersAndRoutesOfItsGateways(t *testing.T) {
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "gateway.yaml", gatewayConfig)
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin, "--debounce-quiet", "20ms")
	proc.WaitReady(t, "http://"+admin+"/readyz")

	st := adsStream(t, xdsAddr, "router~10.0.9.9~ingress-1.edge~edge.svc.cluster.local", map[string]any{"istio": "ingressgateway"}, resourcev3.ListenerType)
	resp := adsRecv(t, st)
	var rds string
	for _, a := range resp.GetResources() {
		l := &listenerv3.Listener{}
		if err := a.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		if l.GetName() != "0.0.0.0_80" {
			t.Fatalf("gateway listener %s, want only 0.0.0.0_80", l.GetName())
		}
		hcm := &hcmv3.HttpConnectionManager{}
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
			t.Fatal(err)
		}
		rds = hcm.GetRds().GetRouteConfigName()
	}
	if rds != "http.80" {
		t.Fatalf("the listener's route %q, want http.80", rds)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{rds}}); err != nil {
		t.Fatal(err)
	}
	resp = adsRecv(t, st)
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%d route configurations", len(resp.GetResources()))
	}
	rc := &routev3.RouteConfiguration{}
	if err := resp.GetResources()[0].UnmarshalTo(rc); err != nil {
		t.Fatal(err)
	}
	vhs := rc.GetVirtualHosts()
	if len(vhs) != 1 || vhs[0].GetDomains()[0] != "shop.example.com" || vhs[0].GetRoutes()[0].GetRoute().GetCluster() != "outbound|80||cart.shop.svc.cluster.local" {
		t.Fatalf("route http.80: %v", vhs)
	}
}
