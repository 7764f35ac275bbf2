package carelay

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
)

// ca answers as ca's certificate service: a chain naming the token it
// was given, or Unauthenticated for "bad".
type ca struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	got chan metadata.MD
}

func (c *ca) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.got <- md
	if md.Get("authorization")[0] == "Bearer bad" {
		return nil, status.Error(codes.Unauthenticated, "token: signature does not verify")
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: []string{"for " + md.Get("authorization")[0], req.GetCsr()}}, nil
}

// relayed serves the relay in front of c over real gRPC and returns a
// client of it.
func relayed(t *testing.T, c *ca) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	serve := func(register func(*grpc.Server)) string {
		gs := grpc.NewServer()
		register(gs)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = gs.Serve(lis) }()
		t.Cleanup(gs.Stop)
		return lis.Addr().String()
	}
	dial := func(addr string) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	caAddr := serve(func(gs *grpc.Server) { securityv1alpha1.RegisterIstioCertificateServiceServer(gs, c) })
	relay := New(securityv1alpha1.NewIstioCertificateServiceClient(dial(caAddr)))
	return securityv1alpha1.NewIstioCertificateServiceClient(dial(serve(func(gs *grpc.Server) {
		securityv1alpha1.RegisterIstioCertificateServiceServer(gs, relay)
	})))
}

func TestTheRequestReachesCAWithTheCallersTokenOnlyAndCAsAnswerComesBack(t *testing.T) {
	c := &ca{got: make(chan metadata.MD, 1)}
	client := relayed(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.CreateCertificate(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer good", "clusterid", "Kubernetes", "x-other", "1"),
		&securityv1alpha1.IstioCertificateRequest{Csr: "csr"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetCertChain(); len(got) != 2 || got[0] != "for Bearer good" || got[1] != "csr" {
		t.Fatalf("chain %v", got)
	}
	if md := <-c.got; len(md.Get("x-other")) != 0 || len(md.Get("clusterid")) != 0 {
		t.Fatalf("ca was sent more than the token: %v", md)
	}
	_, err = client.CreateCertificate(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer bad"), &securityv1alpha1.IstioCertificateRequest{Csr: "csr"})
	<-c.got
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), "signature") {
		t.Fatalf("ca's refusal came back as %v", err)
	}
}

func TestHostileRequestsAreRefusedBeforeCAIsAsked(t *testing.T) {
	c := &ca{got: make(chan metadata.MD, 1)}
	client := relayed(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, tc := range map[string]struct {
		md   []string
		csr  string
		code codes.Code
	}{
		"no token":             {nil, "csr", codes.Unauthenticated},
		"two tokens":           {[]string{"authorization", "Bearer a", "authorization", "Bearer b"}, "csr", codes.Unauthenticated},
		"an oversized token":   {[]string{"authorization", "Bearer " + strings.Repeat("a", 17<<10)}, "csr", codes.Unauthenticated},
		"an oversized request": {[]string{"authorization", "Bearer good"}, strings.Repeat("c", MaxRequestBytes+1), codes.InvalidArgument},
	} {
		_, err := client.CreateCertificate(metadata.AppendToOutgoingContext(ctx, tc.md...), &securityv1alpha1.IstioCertificateRequest{Csr: tc.csr})
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	select {
	case md := <-c.got:
		t.Fatalf("ca was asked: %v", md)
	default:
	}
}
