// Package ca_test runs flotilla-ca as its own process (no-cluster mode: a
// state directory and a JWKS) and asks it for certificates over gRPC/TLS
// on 127.0.0.1, as agents will.
package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var (
	binDir string
	env    *kubeenv.Env
)

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, &env, "flotilla-ca", "flotilla-injector", "flotilla-galley", "flotilla-discovery", "flotilla-agent", "fakeenvoy", "flotilla-demo", "flotilla"))
}

type ca struct {
	p     *proc.Process
	addr  string
	state string
}

func startCA(tb testing.TB, state string, s *proc.Signer, extra ...string) *ca {
	tb.Helper()
	return startCAAt(tb, proc.FreeAddr(tb), state, s, extra...)
}

// startCAAt starts ca on addr (a restart keeps its address and state).
func startCAAt(tb testing.TB, addr, state string, s *proc.Signer, extra ...string) *ca {
	tb.Helper()
	c := &ca{addr: addr, state: state}
	admin := proc.FreeAddr(tb)
	c.p = proc.Start(tb, "ca", filepath.Join(binDir, "flotilla-ca"), append([]string{
		"--address", c.addr, "--admin-address", admin,
		"--state-dir", state, "--jwks-file", s.JWKS, "--jwt-issuer", proc.SignerIssuer,
	}, extra...)...)
	proc.WaitReady(tb, "http://"+admin+"/readyz")
	return c
}

// certificate asks ca for a certificate with a token, trusting roots.pem.
func (c *ca) certificate(tb testing.TB, token string) []*x509.Certificate {
	tb.Helper()
	pemRoots, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		tb.Fatalf("roots.pem: %v", err)
	}
	chain, err := request(tb, c.addr, pemRoots, token)
	if err != nil {
		tb.Fatal(err)
	}
	return chain
}

// request asks the ca at addr for a certificate with a token.
func request(tb testing.TB, addr string, pemRoots []byte, token string) ([]*x509.Certificate, error) {
	tb.Helper()
	return requestAs(tb, addr, "127.0.0.1", pemRoots, token)
}

// requestAs asks the certificate service at addr, whose certificate must
// name serverName, for a certificate with a token.
func requestAs(tb testing.TB, addr, serverName string, pemRoots []byte, token string) ([]*x509.Certificate, error) {
	tb.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemRoots) {
		tb.Fatal("no roots")
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12})))
	if err != nil {
		tb.Fatal(err)
	}
	defer cc.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
	})
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for _, p := range resp.GetCertChain() {
		b, _ := pem.Decode([]byte(p))
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			tb.Fatal(err)
		}
		chain = append(chain, c)
	}
	return chain, nil
}

func TestTwoCAsStartedTogetherEndWithOneRootAndIssueUnderIt(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	// Both start before either is ready.
	a := &ca{addr: proc.FreeAddr(t), state: state}
	b := &ca{addr: proc.FreeAddr(t), state: state}
	adminA, adminB := proc.FreeAddr(t), proc.FreeAddr(t)
	for _, x := range []struct {
		c     *ca
		admin string
	}{{a, adminA}, {b, adminB}} {
		x.c.p = proc.Start(t, "ca", filepath.Join(binDir, "flotilla-ca"), "--address", x.c.addr, "--admin-address", x.admin,
			"--state-dir", state, "--jwks-file", s.JWKS, "--jwt-issuer", proc.SignerIssuer)
	}
	proc.WaitReady(t, "http://"+adminA+"/readyz")
	proc.WaitReady(t, "http://"+adminB+"/readyz")
	tok := s.Token(t, "default", "app")
	ca, cb := a.certificate(t, tok), b.certificate(t, tok)
	if !ca[len(ca)-1].Equal(cb[len(cb)-1]) {
		t.Fatal("the two replicas issue under different roots")
	}
	if got := ca[0].URIs[0].String(); got != "spiffe://cluster.local/ns/default/sa/app" {
		t.Fatalf("issued for %s", got)
	}
	if err := a.p.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
}

func TestAPluggedInIntermediateIsUsedAndReloaded(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rootTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "corp root"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * 365 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(rootDER)
	plug := func(cn string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root, key.Public(), rootKey)
		if err != nil {
			t.Fatal(err)
		}
		pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		// Key first: the certificate's arrival is what triggers a reload.
		xdstest.WriteFile(t, state, "ca-key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})))
		xdstest.WriteFile(t, state, "cert-chain.pem", string(cert))
		xdstest.WriteFile(t, state, "root-cert.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER})))
		xdstest.WriteFile(t, state, "ca-cert.pem", string(cert))
	}
	plug("intermediate-1")
	c := startCA(t, state, s)
	tok := s.Token(t, "shop", "cart")
	chain := c.certificate(t, tok)
	if len(chain) != 3 || chain[1].Subject.CommonName != "intermediate-1" || !chain[2].Equal(root) {
		t.Fatalf("chain %d long, intermediate %q", len(chain), chain[1].Subject.CommonName)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)
	inter := x509.NewCertPool()
	inter.AddCert(chain[1])
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter}); err != nil {
		t.Fatalf("does not verify against the plugged root: %v", err)
	}
	plug("intermediate-2")
	xdstest.Eventually(t, "the new intermediate", func() bool { return c.certificate(t, tok)[1].Subject.CommonName == "intermediate-2" })
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n.Add(n, big.NewInt(1))
}

// TestAControlPlaneServiceServesWithACertificateFromCAAndRenewsIt uses
// internal/certclient as galley will: its Service names, served over TLS,
// renewed before it expires.
func TestAControlPlaneServiceServesWithACertificateFromCAAndRenewsIt(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	c := startCA(t, state, s)
	pemRoots, err := os.ReadFile(filepath.Join(state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	cl := certclient.New(certclient.Options{
		Address: c.addr, ServerName: "127.0.0.1", Roots: certclient.StaticRoots(roots),
		Token:    func() (string, error) { return s.Token(t, "istio-system", "flotilla-galley"), nil },
		DNSNames: []string{"flotilla-galley.istio-system.svc", "flotilla-galley.istio-system.svc.cluster.local"},
		TTL:      4 * time.Second, Log: slog.New(slog.DiscardHandler), MinBackoff: 100 * time.Millisecond,
	})
	proc.Certificate(t, cl)
	addr := proc.ServeTLS(t, cl.ServerConfig(nil))
	serial := func() string {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "flotilla-galley.istio-system.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatalf("a client trusting the mesh roots: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := serial()
	xdstest.Eventually(t, "a renewed certificate", func() bool { return serial() != first })
}

// TestAnExtraTrustedRootReachesTheBundle: during a root rotation the old
// and new roots are trusted together; adding trust-bundle.pem to the state
// directory updates roots.pem without a restart.
func TestAnExtraTrustedRootReachesTheBundle(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	startCA(t, state, s)
	count := func() int {
		data, err := os.ReadFile(filepath.Join(state, "roots.pem"))
		if err != nil {
			return 0
		}
		n := 0
		for b, rest := pem.Decode(data); b != nil; b, rest = pem.Decode(rest) {
			n++
		}
		return n
	}
	if count() != 1 {
		t.Fatalf("roots.pem holds %d roots at start", count())
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "next root"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	xdstest.WriteFile(t, state, "trust-bundle.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	xdstest.Eventually(t, "roots.pem with both roots", func() bool { return count() == 2 })
}

// TestTheInjectorServesItsWebhookWithACertificateFromCA: the injector
// gets its serving certificate from ca for its Service names.
func TestTheInjectorServesItsWebhookWithACertificateFromCA(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	c := startCA(t, state, s)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(s.Token(t, "istio-system", "flotilla-injector")), 0o600); err != nil {
		t.Fatal(err)
	}
	hook, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	// No galley here: the webhook serves (readiness waits for namespaces).
	proc.Start(t, "injector", filepath.Join(binDir, "flotilla-injector"), "--webhook-address", hook, "--admin-address", admin,
		"--galley-address", proc.FreeAddr(t), "--ca-address", c.addr, "--ca-roots-file", filepath.Join(state, "roots.pem"), "--token-file", tokenFile)
	pemRoots, err := os.ReadFile(filepath.Join(state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	var served *x509.Certificate
	xdstest.Eventually(t, "the webhook's certificate from ca", func() bool {
		conn, err := tls.Dial("tcp", hook, &tls.Config{RootCAs: roots, ServerName: "flotilla-injector.istio-system.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			return false
		}
		defer conn.Close()
		served = conn.ConnectionState().PeerCertificates[0]
		return true
	})
	if len(served.URIs) != 1 || served.URIs[0].String() != "spiffe://cluster.local/ns/istio-system/sa/flotilla-injector" {
		t.Fatalf("served %v", served.URIs)
	}
}
