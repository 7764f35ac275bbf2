package ca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// istioAgentConn dials discovery's secure port as Istio's agent does:
// TLS, verifying discovery's certificate as istiod.istio-system.svc (the
// name pilot-agent checks by default, pilot/pkg/grpc/tls.go), and no
// client certificate.
func istioAgentConn(tb testing.TB, c *ca, secureXDS string) *grpc.ClientConn {
	tb.Helper()
	pem, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cc, err := grpc.NewClient(secureXDS, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clustersWithToken asks for clusters as sidecar demo/<pod> claiming
// namespace ns and account sa, with token (none when empty).
func clustersWithToken(tb testing.TB, cc *grpc.ClientConn, token, ns, sa string) (*discoveryv3.DiscoveryResponse, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "CLUSTER_ID": "Kubernetes"})
	if err != nil {
		tb.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.ClusterType,
		Node:    &corev3.Node{Id: "sidecar~127.0.0.1~app-1." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta},
	}); err != nil {
		return nil, err
	}
	return stream.Recv()
}

func TestIstiosAgentAuthenticatesToDiscoveryWithItsTokenAndGetsCertificatesThroughIt(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, _ := meshWithDiscovery(t, c, s)
	cc := istioAgentConn(t, c, secureXDS)

	// The token is the identity: its proxy is served.
	resp, err := clustersWithToken(t, cc, s.Token(t, "demo", "greeter"), "demo", "greeter")
	if err != nil {
		t.Fatalf("a proxy with its token and no certificate: %v", err)
	}
	if len(resp.GetResources()) == 0 {
		t.Fatal("no clusters for a proxy authenticated by its token")
	}

	// It is checked against the node as a certificate is, and a missing,
	// forged or oversized token is refused.
	for name, c := range map[string]struct {
		token, ns, sa string
		code          codes.Code
		says          string
	}{
		"another namespace's token":       {s.Token(t, "other", "greeter"), "demo", "greeter", codes.PermissionDenied, "its token is spiffe://cluster.local/ns/other/sa/greeter"},
		"another service account's token": {s.Token(t, "demo", "intruder"), "demo", "greeter", codes.PermissionDenied, "service account \"greeter\""},
		"no token":                        {"", "demo", "greeter", codes.Unauthenticated, "no client certificate and no token"},
		"a forged token":                  {s.Token(t, "demo", "greeter")[:40] + "x.y.z", "demo", "greeter", codes.Unauthenticated, "token refused"},
		"an oversized token":              {strings.Repeat("a", 20<<10), "demo", "greeter", codes.Unauthenticated, "more than"},
	} {
		_, err := clustersWithToken(t, cc, c.token, c.ns, c.sa)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.says) {
			t.Errorf("%s: %v, want %s saying %q", name, err, c.code, c.says)
		}
	}

	// Istio's agent asks istiod's address for its certificate too (its
	// CA_ADDR defaults to discoveryAddress): discovery passes the request
	// to ca, which signs it for the token's account.
	pem, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := requestAs(t, secureXDS, "istiod.istio-system.svc", pem, s.Token(t, "demo", "greeter"))
	if err != nil {
		t.Fatalf("a certificate through discovery: %v", err)
	}
	if got := chain[0].URIs[0].String(); got != "spiffe://cluster.local/ns/demo/sa/greeter" {
		t.Fatalf("certificate through discovery is %s", got)
	}
	if _, err := requestAs(t, secureXDS, "istiod.istio-system.svc", pem, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a certificate through discovery without a token: %v", err)
	}
	if _, err := requestAs(t, secureXDS, "istiod.istio-system.svc", pem, "garbage"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a certificate through discovery with a bad token: %v (ca's answer, passed back as it is)", err)
	}
}
