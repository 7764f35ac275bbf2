package ca_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
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
func debugSyncz(t *testing.T, c *ca, s *signer, secureXDS, ns, sa string) []debugapi.ProxySync {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	tok := s.token(t, ns, sa)
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
