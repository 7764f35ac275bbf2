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

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
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
// (each once a TokenReview) are refused, the later ones without a review;
// from that address a workload whose token was reviewed before still gets
// its certificate, and so does one whose token is new — the apiserver
// signed it, which ca checks against the apiserver's published keys —
// while a token signed with any other key is not reviewed
// (ResourceExhausted) there.
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
	if err := ask("10.0.0.1", fresh); err != nil {
		t.Fatalf("a genuine token never reviewed, from the address that failed: %v", err)
	}
	forged := forgedToken(t, ns, "app")
	if err := ask("10.0.0.1", forged); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a token signed with another key, from the address that failed: %v, want ResourceExhausted (not reviewed)", err)
	}
	if err := ask("10.0.0.2", forged); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the same forged token from another address: %v, want Unauthenticated (reviewed)", err)
	}
}

// forgedToken looks like a token of ns/sa for istio-ca, signed with a key
// of the test's own.
func forgedToken(t *testing.T, ns, sa string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "forged"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{
		Issuer: "https://kubernetes.default.svc.cluster.local", Subject: "system:serviceaccount:" + ns + ":" + sa,
		Audience: jwt.Audience{"istio-ca"}, IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Hour)),
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
