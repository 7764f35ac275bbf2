package ca_test

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// BenchmarkDiscoveryCPUPerConnection measures discovery's CPU for one
// proxy connecting to its secure port and getting its clusters, by how
// the proxy authenticates: a client certificate from ca (Flotilla's
// agent), a token discovery has not seen (Istio's agent's first stream:
// ca is asked), and a token it has (its later streams: the cached
// answer). Each connection is new (its own TLS handshake) and asks once;
// the figure is discovery's CPU-milliseconds per connection, ca's apart.
// The token is checked once per stream, at its first request, so a
// stream's later requests cost the same either way. Run with
// -benchtime=1x.
func BenchmarkDiscoveryCPUPerConnection(b *testing.B) {
	const conns = 300
	for range b.N {
		s := proc.NewSigner(b)
		c := startCA(b, b.TempDir(), s)
		dir := b.TempDir()
		xdstest.WriteFile(b, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(xdstest.StartBackend(b, "v1"), "v1")))
		secureXDS, _, discovery := meshProcesses(b, c, s, dir)
		pem, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
		if err != nil {
			b.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		tok := s.Token(b, "demo", "greeter")
		certs := certclient.New(certclient.Options{
			Address: c.addr, ServerName: "flotilla-ca.istio-system.svc", Roots: certclient.StaticRoots(roots),
			Token: func() (string, error) { return tok, nil }, Log: slog.New(slog.DiscardHandler),
		})
		proc.Certificate(b, certs)
		withCert := certs.ClientConfig("istio-system/flotilla-discovery")
		withoutCert := &tls.Config{RootCAs: roots, ServerName: "istiod.istio-system.svc", MinVersion: tls.VersionTLS12}

		perConn := func(cfg *tls.Config, token func(i int) string) float64 {
			b.Helper()
			before, err := proc.CPUSeconds(discovery.Pid())
			if err != nil {
				b.Fatal(err)
			}
			for i := range conns {
				cc, err := grpc.NewClient(secureXDS, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := clustersWithToken(b, cc, token(i), "demo", "greeter"); err != nil {
					b.Fatal(err)
				}
				_ = cc.Close()
			}
			time.Sleep(200 * time.Millisecond) // the streams' ends handled
			after, err := proc.CPUSeconds(discovery.Pid())
			if err != nil {
				b.Fatal(err)
			}
			return (after - before) * 1000 / conns
		}
		certMS := perConn(withCert, func(int) string { return "" })
		fresh := func(i int) string {
			t, err := s.Issuer.Token("demo", "greeter", "istio-ca", time.Now(), time.Hour+time.Duration(i+1)*time.Second) // a token of its own each
			if err != nil {
				b.Fatal(err)
			}
			return t
		}
		newTokenMS := perConn(withoutCert, fresh)
		cachedTokenMS := perConn(withoutCert, func(int) string { return tok })
		b.ReportMetric(certMS, "cert-CPU-ms/conn")
		b.ReportMetric(newTokenMS, "new-token-CPU-ms/conn")
		b.ReportMetric(cachedTokenMS, "cached-token-CPU-ms/conn")
	}
}
