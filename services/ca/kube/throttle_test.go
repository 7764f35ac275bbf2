package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
	"github.com/flotilla-mesh/flotilla/services/ca/server"
)

// TestAnAddressThatFailedTooOftenIsRefusedOnlyWhatWouldCostTheAPIServer:
// against the real apiserver, 300 garbage tokens from one node address
// (each once a TokenReview) are refused, the later ones without a
// review; a workload at that address whose token was reviewed before
// still gets its certificate; a token never reviewed waits
// (ResourceExhausted) there, and is served from another address.
func TestAnAddressThatFailedTooOftenIsRefusedOnlyWhatWouldCostTheAPIServer(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "ca-throttle")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rootCert, rootKey, err := authority.NewRoot(authority.ECDSAP256, "cluster.local", now)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := authority.New(rootCert, rootKey, nil, rootCert, authority.Options{MaxTTL: 48 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewTokenReview(env.Client, "istio-ca", noop.NewMeterProvider().Meter("t"), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{
		Log: quiet(), Meter: noop.NewMeterProvider().Meter("t"), CA: func() *authority.Authority { return ca },
		Authenticators: []server.Authenticator{r}, TrustDomain: "cluster.local", DomainSuffix: "cluster.local",
	})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	req := &securityv1alpha1.IstioCertificateRequest{Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))}
	ask := func(addr, tok string) error {
		c := metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
		c = peer.NewContext(c, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
		_, err := srv.CreateCertificate(c, req)
		return err
	}
	reviewed, err := env.CreateToken(ctx, ns, "app", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ask("10.0.0.1", reviewed); err != nil {
		t.Fatalf("a valid token: %v", err)
	}
	codesSeen := map[codes.Code]int{}
	for range 300 {
		codesSeen[status.Code(ask("10.0.0.1", "garbage"))]++
	}
	if codesSeen[codes.ResourceExhausted] < 250 || codesSeen[codes.Unauthenticated]+codesSeen[codes.ResourceExhausted] != 300 {
		t.Fatalf("300 garbage tokens from one address: %v, want most not reviewed (ResourceExhausted)", codesSeen)
	}
	if err := ask("10.0.0.1", reviewed); err != nil {
		t.Fatalf("a token reviewed before, from the address that failed: %v", err)
	}
	fresh, err := env.CreateToken(ctx, ns, "app", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ask("10.0.0.1", fresh); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a token never reviewed, from the address that failed: %v, want ResourceExhausted", err)
	}
	if err := ask("10.0.0.2", fresh); err != nil {
		t.Fatalf("the same token from another address: %v", err)
	}
}
