package ca_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// debugSyncz asks discovery's mTLS xDS port for its sync state as a
// debug client with a certificate from ca for ns/sa (what flotilla
// proxy-status does in a cluster).
func debugSyncz(t *testing.T, c *ca, s *proc.Signer, secureXDS, ns, sa string) []debugapi.ProxySync {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	tok := s.Token(t, ns, sa)
	certs := certclient.New(certclient.Options{
		Address: c.addr, ServerName: "flotilla-ca.istio-system.svc", Roots: certclient.StaticRoots(roots),
		Token: func() (string, error) { return tok, nil }, Log: slog.New(slog.DiscardHandler),
	})
	proc.Certificate(t, certs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(secureXDS, grpc.WithTransportCredentials(credentials.NewTLS(certs.ClientConfig("istio-system/flotilla-discovery"))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := debugapi.Fetch(ctx, cc, debugapi.Syncz)
	if err != nil {
		t.Fatalf("syncz as %s/%s: %v", ns, sa, err)
	}
	out, err := debugapi.Syncs(resp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestATokenFromTheCLIGetsItsServiceAccountsCertificateFromCA: without a
// cluster, flotilla token's JWKS is what ca trusts, and its token gets
// the service account's certificate.
func TestATokenFromTheCLIGetsItsServiceAccountsCertificateFromCA(t *testing.T) {
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, "token.key"), filepath.Join(dir, "jwks.json")
	cli := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "flotilla"), args...).Output()
		if err != nil {
			t.Fatalf("flotilla %v: %v", args, err)
		}
		return out
	}
	if err := os.WriteFile(jwks, cli("token", "jwks", "--key-file", key, "--issuer", proc.SignerIssuer), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCA(t, t.TempDir(), &proc.Signer{JWKS: jwks})
	tok := strings.TrimSpace(string(cli("token", "create", "--key-file", key, "--issuer", proc.SignerIssuer, "-n", "vm", "--service-account", "legacy-app")))
	chain := c.certificate(t, tok)
	if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != "spiffe://cluster.local/ns/vm/sa/legacy-app" {
		t.Fatalf("certificate for %v", chain[0].URIs)
	}
	// Another key's token is refused.
	other := strings.TrimSpace(string(cli("token", "create", "--key-file", filepath.Join(dir, "other.key"), "--issuer", proc.SignerIssuer, "-n", "vm", "--service-account", "legacy-app")))
	pemRoots, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := request(t, c.addr, pemRoots, other); err == nil {
		t.Fatal("ca took a token signed with a key it does not trust")
	}
}
