package server

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

const (
	issuer   = "https://flotilla.test"
	audience = "istio-ca"
)

type fixture struct {
	ca      *authority.Authority
	signKey *ecdsa.PrivateKey
	addr    string
	roots   *x509.CertPool
	srv     *Server
}

func newFixture(tb testing.TB, mutate func(*Options)) *fixture {
	tb.Helper()
	now := time.Now()
	rootCert, rootKey, err := authority.NewRoot(authority.ECDSAP256, "cluster.local", now)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := authority.New(rootCert, rootKey, nil, rootCert, authority.Options{MaxTTL: 48 * time.Hour}, now)
	if err != nil {
		tb.Fatal(err)
	}
	f := &fixture{ca: ca, roots: x509.NewCertPool()}
	f.roots.AppendCertsFromPEM(ca.RootsPEM())
	if f.signKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		tb.Fatal(err)
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: f.signKey.Public(), KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	if err != nil {
		tb.Fatal(err)
	}
	jwksFile := filepath.Join(tb.TempDir(), "jwks.json")
	if err := os.WriteFile(jwksFile, jwks, 0o600); err != nil {
		tb.Fatal(err)
	}
	j, err := NewJWT(jwksFile, issuer, audience, "cluster.local", time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	current := func() *authority.Authority { return f.ca }
	o := Options{
		Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t"), CA: current,
		Authenticators: []Authenticator{ClientCert{CA: current, Now: time.Now}, j},
		TrustDomain:    "cluster.local", DomainSuffix: "cluster.local",
		ControlPlane: ControlPlaneAccounts("istio-system"),
	}
	if mutate != nil {
		mutate(&o)
	}
	if f.srv, err = New(o); err != nil {
		tb.Fatal(err)
	}
	tlsCfg, err := ServingTLS(current, authority.Identity{
		TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "flotilla-ca",
		DNSNames: []string{"flotilla-ca.istio-system.svc"},
	}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour, time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	f.srv.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	f.addr = lis.Addr().String()
	return f
}

type claims struct {
	sub, aud, iss string
	exp           time.Duration
	key           crypto.Signer
}

func (f *fixture) token(tb testing.TB, c claims) string {
	tb.Helper()
	if c.aud == "" {
		c.aud = audience
	}
	if c.iss == "" {
		c.iss = issuer
	}
	if c.exp == 0 {
		c.exp = time.Hour
	}
	if c.key == nil {
		c.key = f.signKey
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: c.key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{
		Subject: c.sub, Issuer: c.iss, Audience: jwt.Audience{c.aud},
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(c.exp)),
	}).Serialize()
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

func csr(tb testing.TB, key crypto.Signer, uris ...string) string {
	tb.Helper()
	tmpl := &x509.CertificateRequest{}
	for _, u := range uris {
		pu, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		tb.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// dial connects to ca over TLS, optionally with a client certificate.
func (f *fixture) dial(tb testing.TB, client *tls.Certificate) *grpc.ClientConn {
	tb.Helper()
	cfg := &tls.Config{RootCAs: f.roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		tb.Fatal(err)
	}
	return cc
}

// call asks ca on a new connection.
func (f *fixture) call(tb testing.TB, token string, client *tls.Certificate, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	tb.Helper()
	cc := f.dial(tb, client)
	defer cc.Close()
	return ask(cc, token, req)
}

func ask(cc *grpc.ClientConn, token string, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, req)
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func parseChain(t *testing.T, chain []string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, p := range chain {
		b, _ := pem.Decode([]byte(p))
		if b == nil {
			t.Fatalf("not PEM: %q", p)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func TestATokenGetsACertificateForItsServiceAccountOnly(t *testing.T) {
	f := newFixture(t, nil)
	key := newKey(t)
	resp, err := f.call(t, f.token(t, claims{sub: "system:serviceaccount:default:app"}), nil,
		&securityv1alpha1.IstioCertificateRequest{Csr: csr(t, key), ValidityDuration: 3600})
	if err != nil {
		t.Fatal(err)
	}
	chain := parseChain(t, resp.GetCertChain())
	if len(chain) != 2 {
		t.Fatalf("chain of %d, want leaf and root", len(chain))
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/app" || len(leaf.DNSNames) != 0 {
		t.Fatalf("SANs %v %v", leaf.URIs, leaf.DNSNames)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: f.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("does not chain to the root: %v", err)
	}
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d < time.Hour || d > time.Hour+2*time.Minute {
		t.Fatalf("validity %s, want the hour asked for", d)
	}

	// Renewal: the certificate itself authenticates, no token needed.
	client := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	resp, err = f.call(t, "", client, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))})
	if err != nil {
		t.Fatalf("renewal: %v", err)
	}
	if got := parseChain(t, resp.GetCertChain())[0].URIs[0].String(); got != "spiffe://cluster.local/ns/default/sa/app" {
		t.Fatalf("renewed as %s", got)
	}
}

func TestControlPlaneServiceAccountsGetTheirServiceNames(t *testing.T) {
	f := newFixture(t, nil)
	key := newKey(t)
	tmpl := &x509.CertificateRequest{DNSNames: []string{"flotilla-galley.istio-system.svc", "flotilla-galley.istio-system.svc.cluster.local"}}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.call(t, f.token(t, claims{sub: "system:serviceaccount:istio-system:flotilla-galley"}), nil,
		&securityv1alpha1.IstioCertificateRequest{Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))})
	if err != nil {
		t.Fatal(err)
	}
	if got := parseChain(t, resp.GetCertChain())[0].DNSNames; len(got) != 2 {
		t.Fatalf("DNS names %v", got)
	}
	// The same DNS names for a workload are refused.
	_, err = f.call(t, f.token(t, claims{sub: "system:serviceaccount:default:app"}), nil,
		&securityv1alpha1.IstioCertificateRequest{Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a workload asking for galley's names: %v", err)
	}

	// A revision's discovery gets its own Service's names; an account
	// named like one outside the system namespace, or another name for
	// the default revision, gets none.
	ask := func(account, name string) error {
		t.Helper()
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{name}}, key)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.call(t, f.token(t, claims{sub: "system:serviceaccount:" + account}), nil,
			&securityv1alpha1.IstioCertificateRequest{Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))})
		return err
	}
	if err := ask("istio-system:flotilla-discovery-canary", "flotilla-discovery-canary.istio-system.svc"); err != nil {
		t.Fatalf("revision canary's discovery: %v", err)
	}
	// discovery plays istiod's part: it may also be istiod's Service (the
	// name Istio's agent checks), its own revision's only.
	if err := ask("istio-system:flotilla-discovery-canary", "istiod-canary.istio-system.svc.cluster.local"); err != nil {
		t.Fatalf("revision canary's discovery as istiod-canary: %v", err)
	}
	if err := ask("istio-system:flotilla-discovery", "istiod.istio-system.svc"); err != nil {
		t.Fatalf("the default revision's discovery as istiod: %v", err)
	}
	for _, c := range []struct{ account, name string }{
		{"istio-system:flotilla-discovery-canary", "flotilla-discovery.istio-system.svc"}, // another revision's
		{"istio-system:flotilla-discovery-canary", "istiod.istio-system.svc"},             // another revision's istiod
		{"istio-system:flotilla-injector", "istiod.istio-system.svc"},                     // not discovery
		{"istio-system:istiod", "istiod.istio-system.svc"},                                // not an account of Flotilla's
		{"app:flotilla-discovery-canary", "flotilla-discovery-canary.app.svc"},
		{"istio-system:flotilla-discovery-default", "flotilla-discovery-default.istio-system.svc"},
	} {
		if err := ask(c.account, c.name); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s asking for %s: %v", c.account, c.name, err)
		}
	}
}

func TestBadCredentialsAndRequestsGetTheRightCodes(t *testing.T) {
	f := newFixture(t, nil)
	other := newKey(t)
	good := func() string { return f.token(t, claims{sub: "system:serviceaccount:default:app"}) }
	req := func() *securityv1alpha1.IstioCertificateRequest {
		return &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}
	}
	tests := map[string]struct {
		token string
		req   *securityv1alpha1.IstioCertificateRequest
		code  codes.Code
		says  string
	}{
		"no token":              {"", req(), codes.Unauthenticated, "no credential"},
		"another audience":      {f.token(t, claims{sub: "system:serviceaccount:default:app", aud: "kubernetes"}), req(), codes.Unauthenticated, "audience"},
		"another issuer":        {f.token(t, claims{sub: "system:serviceaccount:default:app", iss: "https://evil"}), req(), codes.Unauthenticated, "issuer"},
		"expired":               {f.token(t, claims{sub: "system:serviceaccount:default:app", exp: -time.Hour}), req(), codes.Unauthenticated, "expired"},
		"signed by a stranger":  {f.token(t, claims{sub: "system:serviceaccount:default:app", key: other}), req(), codes.Unauthenticated, "does not verify"},
		"not a service account": {f.token(t, claims{sub: "alice"}), req(), codes.Unauthenticated, "not a service account"},
		"garbage token":         {"not.a.jwt", req(), codes.Unauthenticated, "token"},
		"oversized token":       {strings.Repeat("a", maxTokenBytes+1), req(), codes.Unauthenticated, "more than"},
		"another identity":      {good(), &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t), "spiffe://cluster.local/ns/kube-system/sa/admin")}, codes.PermissionDenied, "kube-system"},
		"TTL above the max":     {good(), &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t)), ValidityDuration: 72 * 3600}, codes.InvalidArgument, "maximum 48h0m0s"},
		"negative TTL":          {good(), &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t)), ValidityDuration: -5}, codes.InvalidArgument, "out of range"},
		"garbage CSR":           {good(), &securityv1alpha1.IstioCertificateRequest{Csr: "hello"}, codes.InvalidArgument, "PEM"},
		"empty CSR":             {good(), &securityv1alpha1.IstioCertificateRequest{}, codes.InvalidArgument, "no CSR"},
	}
	for name, tt := range tests {
		_, err := f.call(t, tt.token, nil, tt.req)
		if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.says) {
			t.Errorf("%s: %v, want %s mentioning %q", name, err, tt.code, tt.says)
		}
	}
	// A client certificate from another CA does not authenticate.
	otherRoot, otherKey, err := authority.NewRoot(authority.ECDSAP256, "elsewhere", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := authority.New(otherRoot, otherKey, nil, otherRoot, authority.Options{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k := newKey(t)
	issued, err := otherCA.IssueServing(k.Public(), authority.Identity{TrustDomain: "cluster.local", Namespace: "default", ServiceAccount: "app"}, nil, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.call(t, "", &tls.Certificate{Certificate: [][]byte{issued.Chain[0].Raw}, PrivateKey: k}, req())
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a foreign client certificate: %v", err)
	}
}

func TestRateLimitAndNoAuthority(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.RatePerIdentity, o.Burst = 0.001, 2 })
	tok := f.token(t, claims{sub: "system:serviceaccount:default:app"})
	codesSeen := map[codes.Code]int{}
	for range 4 {
		_, err := f.call(t, tok, nil, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))})
		codesSeen[status.Code(err)]++
	}
	if codesSeen[codes.OK] != 2 || codesSeen[codes.ResourceExhausted] != 2 {
		t.Fatalf("codes %v, want 2 OK then 2 ResourceExhausted", codesSeen)
	}
	// Another identity has its own budget.
	if _, err := f.call(t, f.token(t, claims{sub: "system:serviceaccount:default:other"}), nil,
		&securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	f.ca = nil
	_, err := f.call(t, tok, nil, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("without an authority: %v", err)
	}
}

// otherDomain authenticates every caller as an identity of another trust
// domain.
type otherDomain struct{}

func (otherDomain) Authenticate(context.Context) (authority.Identity, bool, error) {
	return authority.Identity{TrustDomain: "cluster-b.local", Namespace: "istio-system", ServiceAccount: "flotilla-galley"}, true, nil
}

func TestACredentialOfAnotherTrustDomainIsRefused(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Authenticators = []Authenticator{otherDomain{}} })
	_, err := f.call(t, "", nil, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), `trust domain "cluster-b.local"`) {
		t.Fatalf("an identity of cluster-b.local: %v, want Unauthenticated naming the trust domain", err)
	}
}

// TestFailedAuthenticationsFromOnePeerNeverShutOutAValidTokenFromIt: 300
// bad tokens from one address, then a valid one from the same address (a
// pod behind the same node address): the valid one gets its certificate,
// and ca logged no more refusals than the address's failure budget.
func TestFailedAuthenticationsFromOnePeerNeverShutOutAValidTokenFromIt(t *testing.T) {
	var logs testenv.SyncBuffer
	f := newFixture(t, func(o *Options) { o.Log = slog.New(slog.NewTextHandler(&logs, nil)) })
	cc := f.dial(t, nil)
	defer cc.Close()
	for range 300 {
		if _, err := ask(cc, "not.a.jwt", &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a bad token: %v, want Unauthenticated", err)
		}
	}
	good := f.token(t, claims{sub: "system:serviceaccount:default:app"})
	if _, err := ask(cc, good, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}); err != nil {
		t.Fatalf("a valid token after 300 bad ones from its address: %v", err)
	}
	if n := strings.Count(logs.String(), "certificate refused"); n < failuresBurst || n > failuresBurst+2 {
		t.Fatalf("%d refusals logged for 300 bad tokens, want the budget's %d", n, failuresBurst)
	}
}

// TestAnAuthenticatorCostingAnotherServiceIsToldTheCallerIsThrottled:
// past its address's failure budget a caller's credential still reaches
// the authenticators, marked Throttled, and ErrThrottled is
// ResourceExhausted.
func TestAnAuthenticatorCostingAnotherServiceIsToldTheCallerIsThrottled(t *testing.T) {
	seen := make(chan bool, 100)
	f := newFixture(t, func(o *Options) {
		o.Authenticators = []Authenticator{remote{seen: seen}}
	})
	cc := f.dial(t, nil)
	defer cc.Close()
	var last error
	for range failuresBurst + 3 {
		_, last = ask(cc, "bad", &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))})
	}
	throttled := 0
	for range failuresBurst + 3 {
		if <-seen {
			throttled++
		}
	}
	if throttled == 0 || status.Code(last) != codes.ResourceExhausted {
		t.Fatalf("%d calls marked throttled, the last refused with %v; want some, and ResourceExhausted", throttled, last)
	}
}

// remote is an authenticator that costs another service: it refuses
// every credential, and throttled callers without checking.
type remote struct{ seen chan bool }

func (r remote) Authenticate(ctx context.Context) (authority.Identity, bool, error) {
	r.seen <- Throttled(ctx)
	if Throttled(ctx) {
		return authority.Identity{}, true, ErrThrottled
	}
	return authority.Identity{}, true, fmt.Errorf("%w: bad", ErrUnauthenticated)
}

// TestIstiosDashboardsReadTheIssuancesUnderIstiosNames makes a good
// request, refused ones and failing ones over gRPC, then reads /metrics
// as Prometheus scrapes it: citadel_server_* as Istio's CA counts them,
// signing errors by Istio's error codes.
func TestIstiosDashboardsReadTheIssuancesUnderIstiosNames(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-ca"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	f := newFixture(t, func(o *Options) { o.IstioMeter = tel.Istio.Meter("istio") })
	good := f.token(t, claims{sub: "system:serviceaccount:default:app"})
	for _, c := range []struct {
		token string
		req   *securityv1alpha1.IstioCertificateRequest
		code  codes.Code
	}{
		{good, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}, codes.OK},
		{good, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}, codes.OK},
		{"", &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}, codes.Unauthenticated},
		{good, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t), "spiffe://cluster.local/ns/kube-system/sa/admin")}, codes.PermissionDenied},
		{good, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t)), ValidityDuration: 72 * 3600}, codes.InvalidArgument},
		{good, &securityv1alpha1.IstioCertificateRequest{Csr: "hello"}, codes.InvalidArgument},
	} {
		if _, err := f.call(t, c.token, nil, c.req); status.Code(err) != c.code {
			t.Fatalf("%v, want %s", err, c.code)
		}
	}
	f.ca = nil
	if _, err := f.call(t, good, nil, &securityv1alpha1.IstioCertificateRequest{Csr: csr(t, newKey(t))}); status.Code(err) != codes.Unavailable {
		t.Fatalf("without an authority: %v", err)
	}

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	got := rec.Body.String()
	for _, want := range []string{
		"citadel_server_csr_count 7",
		"citadel_server_success_cert_issuance_count 2",
		"citadel_server_authentication_failure_count 2",
		`citadel_server_csr_sign_err_count{error="TTL_ERROR"} 1`,
		`citadel_server_csr_sign_err_count{error="CSR_ERROR"} 1`,
		`citadel_server_csr_sign_err_count{error="CA_NOT_READY"} 1`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
