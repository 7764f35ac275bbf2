package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

// clientCert is a certificate f's ca issued to namespace/account.
func (f *fixture) clientCert(tb testing.TB, namespace, account string) *tls.Certificate {
	tb.Helper()
	k := newKey(tb)
	issued, err := f.ca.IssueServing(k.Public(), authority.Identity{TrustDomain: "cluster.local", Namespace: namespace, ServiceAccount: account}, nil, time.Hour, time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{issued.Chain[0].Raw}, PrivateKey: k}
}

func (f *fixture) review(tb testing.TB, caller *tls.Certificate, req *cav1.ReviewRequest) (*cav1.ReviewResponse, error) {
	tb.Helper()
	cc := f.dial(tb, caller)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cav1.NewTokenReviewServiceClient(cc).Review(ctx, req)
}

func TestDiscoveryLearnsWhoAProxysTokenIsAndForHowLongItMayRememberIt(t *testing.T) {
	f := newFixture(t, nil)
	discovery := f.clientCert(t, "istio-system", "flotilla-discovery")
	resp, err := f.review(t, discovery, &cav1.ReviewRequest{Token: f.token(t, claims{sub: "system:serviceaccount:demo:greeter"}), PeerAddress: "10.1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetNamespace() != "demo" || resp.GetServiceAccount() != "greeter" || resp.GetTrustDomain() != "cluster.local" {
		t.Fatalf("identity %v", resp)
	}
	if got := time.Duration(resp.GetCacheSeconds()) * time.Second; got != MaxReviewCache {
		t.Fatalf("a token valid for an hour may be remembered %s, want %s", got, MaxReviewCache)
	}
	// A token about to expire is remembered no longer than it lives.
	resp, err = f.review(t, discovery, &cav1.ReviewRequest{Token: f.token(t, claims{sub: "system:serviceaccount:demo:greeter", exp: 40 * time.Second})})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetCacheSeconds(); got > 40 || got < 30 {
		t.Fatalf("a token valid for 40s may be remembered %ds", got)
	}
	// A revision's discovery may ask too.
	if _, err := f.review(t, f.clientCert(t, "istio-system", "flotilla-discovery-canary"), &cav1.ReviewRequest{Token: f.token(t, claims{sub: "system:serviceaccount:demo:greeter"})}); err != nil {
		t.Fatalf("revision canary's discovery: %v", err)
	}
}

func TestOnlyDiscoveryMayAskWhoATokenIs(t *testing.T) {
	f := newFixture(t, nil)
	tok := f.token(t, claims{sub: "system:serviceaccount:demo:greeter"})
	for name, c := range map[string]struct {
		caller *tls.Certificate
		code   codes.Code
	}{
		"no client certificate":                {nil, codes.Unauthenticated},
		"a workload":                           {f.clientCert(t, "demo", "greeter"), codes.PermissionDenied},
		"galley":                               {f.clientCert(t, "istio-system", "flotilla-galley"), codes.PermissionDenied},
		"the injector":                         {f.clientCert(t, "istio-system", "flotilla-injector"), codes.PermissionDenied},
		"discovery's name in a user namespace": {f.clientCert(t, "demo", "flotilla-discovery"), codes.PermissionDenied},
	} {
		if _, err := f.review(t, c.caller, &cav1.ReviewRequest{Token: tok}); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
}

func TestABadProxyTokenIsRefusedAndCostsOnlyItsAddress(t *testing.T) {
	f := newFixture(t, nil)
	discovery := f.clientCert(t, "istio-system", "flotilla-discovery")
	bad := map[string]struct {
		token string
		says  string
	}{
		"expired":          {f.token(t, claims{sub: "system:serviceaccount:demo:greeter", exp: -time.Hour}), "expired"},
		"another audience": {f.token(t, claims{sub: "system:serviceaccount:demo:greeter", aud: "kubernetes"}), "audience"},
		"not a JWT":        {"garbage", "token"},
		"empty":            {"", "bearer"},
		"oversized":        {strings.Repeat("a", maxTokenBytes+1), "more than"},
		"a user's":         {f.token(t, claims{sub: "alice"}), "not a service account"},
	}
	for name, c := range bad {
		_, err := f.review(t, discovery, &cav1.ReviewRequest{Token: c.token, PeerAddress: "10.9.9.9"})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), c.says) {
			t.Errorf("%s: %v, want Unauthenticated mentioning %q", name, err, c.says)
		}
	}
	// Another proxy behind the same discovery is not shut out, and nor is
	// a genuine token from the address that failed (the JWT is checked
	// here, at no other service's cost).
	for _, addr := range []string{"10.1.1.1", "10.9.9.9", "not an address"} {
		if _, err := f.review(t, discovery, &cav1.ReviewRequest{Token: f.token(t, claims{sub: "system:serviceaccount:demo:greeter"}), PeerAddress: addr}); err != nil {
			t.Errorf("a genuine token from %s: %v", addr, err)
		}
	}
}

func FuzzReviewAnswersAnIdentityOrRefusesWithAStatus(f *testing.F) {
	fx := newFixture(f, nil)
	f.Add(fx.token(f, claims{sub: "system:serviceaccount:demo:greeter"}), "10.0.0.1")
	f.Add("", "")
	f.Add("a.b.c", "::1")
	f.Add("eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", "not an address")
	caller := fx.clientCert(f, "istio-system", "flotilla-discovery")
	leaf, err := x509.ParseCertificate(caller.Certificate[0])
	if err != nil {
		f.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1},
		AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}},
	})
	f.Fuzz(func(t *testing.T, token, addr string) {
		resp, err := fx.srv.reviewer.Review(ctx, &cav1.ReviewRequest{Token: token, PeerAddress: addr})
		switch code := status.Code(err); {
		case err == nil && (resp.GetNamespace() == "" || resp.GetServiceAccount() == ""):
			t.Fatalf("%q: an incomplete identity %v", token, resp)
		case err != nil && code != codes.Unauthenticated && code != codes.ResourceExhausted:
			t.Fatalf("%q: %v, want Unauthenticated (or ResourceExhausted past the address's budget)", token, err)
		case err != nil && !utf8.ValidString(status.Convert(err).Message()):
			t.Fatalf("the refusal of %q is not valid UTF-8", token)
		}
	})
}
