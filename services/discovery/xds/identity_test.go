package xds_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// mtlsServer is an ADS server on 127.0.0.1 that requires client
// certificates from ca, with a push context so streams are answered.
func mtlsServer(t *testing.T, ca *testpki.CA, verify bool) string {
	t.Helper()
	return mtlsServerWith(t, ca, xds.Options{VerifyIdentity: verify})
}

// mtlsServerWith is mtlsServer with o (its log and meter are the test's).
func mtlsServerWith(t *testing.T, ca *testpki.CA, o xds.Options) string {
	t.Helper()
	_, addr := mtlsServerOf(t, ca, o)
	return addr
}

// mtlsServerOf is mtlsServerWith, returning the server too.
func mtlsServerOf(t *testing.T, ca *testpki.CA, o xds.Options) (*xds.Server, string) {
	t.Helper()
	o.Log, o.Meter = quiet(), noop.NewMeterProvider().Meter("t")
	srv, err := xds.New(o)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "discovery", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
	})))
	srv.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	pc, cs := model.NewStore().Build(model.BuildOptions{}, nil, 1)
	srv.Push(context.Background(), pc, cs, time.Now())
	return srv, lis.Addr().String()
}

// dialAs connects with a workload certificate for spiffeID.
func dialAs(t *testing.T, ca *testpki.CA, addr, spiffeID string) *grpc.ClientConn {
	t.Helper()
	leaf, err := ca.Issue(testpki.Request{CommonName: "w", URIs: []string{spiffeID}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), ServerName: "127.0.0.1",
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// firstResponse opens a stream for a node and returns the first response
// or the error that ended the stream.
func firstResponse(t *testing.T, cc *grpc.ClientConn, nodeID string, md map[string]any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node(nodeID, md), TypeUrl: resourcev3.ClusterType}); err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

func TestAProxyOnTheMTLSPortIsTheIdentityOfItsCertificate(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	addr := mtlsServerWith(t, ca, xds.Options{VerifyIdentity: true, SystemNamespace: "istio-system"})
	cart := dialAs(t, ca, addr, "spiffe://cluster.local/ns/shop/sa/cart")
	if err := firstResponse(t, cart, "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", map[string]any{"SERVICE_ACCOUNT": "cart"}); err != nil {
		t.Fatalf("a proxy that is who its certificate says: %v", err)
	}
	for name, tc := range map[string]struct {
		id string
		md map[string]any
	}{
		"another namespace":             {"sidecar~10.0.0.1~cart-1.bank~bank.svc.cluster.local", nil},
		"another service account":       {"sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", map[string]any{"SERVICE_ACCOUNT": "admin"}},
		"another namespace in metadata": {"sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", map[string]any{"NAMESPACE": "bank"}},
	} {
		err := firstResponse(t, cart, tc.id, tc.md)
		if grpcstatus.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", name, err)
		}
	}

	// syncz shows the identity of a connected proxy (to the proxy's own
	// namespace, whose proxies a caller of it may see).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cart).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node("sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", nil), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := syncz(t, cart); len(got) != 1 || got[0].Identity != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("syncz: %+v", got)
	}
}

func TestTheIdentityCheckCanBeTurnedOff(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	addr := mtlsServer(t, ca, false)
	cc := dialAs(t, ca, addr, "spiffe://cluster.local/ns/shop/sa/cart")
	if err := firstResponse(t, cc, "sidecar~10.0.0.1~cart-1.bank~bank.svc.cluster.local", nil); err != nil {
		t.Fatalf("with the check off, a node claiming another namespace: %v", err)
	}
}
