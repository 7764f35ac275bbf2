// Package faults_test stops and kills Flotilla's services, run as separate
// processes on loopback, and checks that each fails on its own: ca going
// away costs no working certificate and renewal resumes when it is back,
// and every service drains and exits 0 on SIGTERM within its grace
// period. (galley and discovery replicas going away are in test/discovery;
// the demo's split through make run and docker compose in test/binaries
// and test/compose.) Each test logs what it measured.
package faults_test

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, nil, "flotilla-galley", "flotilla-discovery", "flotilla-ca", "flotilla-injector"))
}

// jwks writes a JWKS and returns a function minting service account tokens
// it verifies (ca's no-cluster authentication).
func jwks(t *testing.T) (path string, token func(ns, sa string) (string, error)) {
	t.Helper()
	iss, err := devjwt.New("https://flotilla.test")
	if err != nil {
		t.Fatal(err)
	}
	d := &devjwt.Dir{Path: t.TempDir(), Issuer: iss} // the JWKS only: tokens are minted per test
	if err := d.Write(time.Now()); err != nil {
		t.Fatal(err)
	}
	return d.JWKSFile(), func(ns, sa string) (string, error) {
		return iss.Token(ns, sa, "istio-ca", time.Now(), time.Hour)
	}
}

func startCA(t *testing.T, addr, state, jwksPath string) *proc.Process {
	t.Helper()
	admin := proc.FreeAddr(t)
	p := proc.Start(t, "ca", filepath.Join(binDir, "flotilla-ca"), "--address", addr, "--admin-address", admin,
		"--state-dir", state, "--jwks-file", jwksPath, "--jwt-issuer", "https://flotilla.test")
	proc.WaitReady(t, "http://"+admin+"/readyz")
	return p
}

// TestWithCAGoneCertificatesKeepWorkingAndRenewalResumesWhenItIsBack: a
// control-plane service (internal/certclient, as the injector uses it)
// holds a 60 s certificate (renewed 30–48 s after it was issued) and
// serves TLS with it. ca is SIGKILLed: every handshake during the outage
// still succeeds with the certificate held, and renewals fail and are
// retried; once two attempts have failed (the outage covers a renewal,
// whenever it came), ca restarts on the same state: the next renewal
// succeeds, before the certificate expires. The outage ends on that
// event, not at a fixed time, so the certificate's remaining life (12 s
// or more) is what a slow machine has to restart ca in.
func TestWithCAGoneCertificatesKeepWorkingAndRenewalResumesWhenItIsBack(t *testing.T) {
	jwksPath, token := jwks(t)
	state, addr := t.TempDir(), proc.FreeAddr(t)
	ca := startCA(t, addr, state, jwksPath)
	pemRoots, err := os.ReadFile(filepath.Join(state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	renewals := atomic.Int64{}
	cl := certclient.New(certclient.Options{
		Address: addr, ServerName: "127.0.0.1", Roots: certclient.StaticRoots(roots),
		Token: func() (string, error) {
			renewals.Add(1)
			return token("istio-system", "flotilla-injector")
		},
		DNSNames: []string{"flotilla-injector.istio-system.svc"},
		TTL:      60 * time.Second, Log: slog.New(slog.DiscardHandler), MinBackoff: 200 * time.Millisecond, MaxBackoff: time.Second,
	})
	proc.Certificate(t, cl)
	served := proc.ServeTLS(t, cl.ServerConfig(nil))
	handshake := func() (*x509.Certificate, error) {
		conn, err := tls.Dial("tcp", served, &tls.Config{RootCAs: roots, ServerName: "flotilla-injector.istio-system.svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	first, err := handshake()
	if err != nil {
		t.Fatal(err)
	}

	ca.Kill(t)
	down := time.Now()
	attemptsBefore := renewals.Load()
	// Down until two renewal attempts have failed (the first comes at
	// 50–80 % of the 60 s, the second after its backoff).
	handshakes, failed := 0, 0
	for renewals.Load()-attemptsBefore < 2 {
		if time.Now().After(first.NotAfter) {
			t.Fatalf("no renewal was attempted while ca was down, before the certificate expired (%d attempts)", renewals.Load()-attemptsBefore)
		}
		cert, err := handshake()
		handshakes++
		if err != nil {
			failed++
			t.Errorf("handshake with ca down: %v", err)
		} else if cert.SerialNumber.Cmp(first.SerialNumber) != 0 {
			t.Fatal("renewed while ca was down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	triedMeanwhile := renewals.Load() - attemptsBefore
	t.Logf("measured: ca down %s: %d TLS handshakes with the held certificate, %d failed; %d renewal attempts failed meanwhile",
		time.Since(down).Round(100*time.Millisecond), handshakes, failed, triedMeanwhile)

	startCA(t, addr, state, jwksPath)
	back := time.Now()
	var renewed *x509.Certificate
	xdstest.Eventually(t, "a renewed certificate", func() bool {
		cert, err := handshake()
		if err != nil {
			t.Fatalf("handshake after ca's return: %v", err)
		}
		renewed = cert
		return cert.SerialNumber.Cmp(first.SerialNumber) != 0
	})
	t.Logf("measured: renewed %s after ca was back (the old certificate had %s left)",
		time.Since(back).Round(10*time.Millisecond), time.Until(first.NotAfter).Round(100*time.Millisecond))
	if renewed.NotAfter.Before(first.NotAfter) {
		t.Error("the renewed certificate expires before the old one")
	}
}

// TestEveryServiceDrainsAndExitsZeroOnSIGTERM: each service, serving a
// live client (discovery a proxyless gRPC client's ADS stream, galley
// discovery's subscription), exits with status 0 within its shutdown
// timeout after SIGTERM, and the others are not disturbed.
func TestEveryServiceDrainsAndExitsZeroOnSIGTERM(t *testing.T) {
	const grace = 10 * time.Second
	v1 := xdstest.StartBackend(t, "v1")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
	common := []string{"--shutdown-timeout", grace.String()}

	mcp, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	galley := proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"),
		append([]string{"--config-dir", dir, "--mcp-address", mcp, "--admin-address", galleyAdmin}, common...)...)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	xds, discoveryAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	discovery := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		append([]string{"--galley-address", mcp, "--xds-address", xds, "--admin-address", discoveryAdmin}, common...)...)
	proc.WaitReady(t, "http://"+discoveryAdmin+"/readyz")
	jwksPath, _ := jwks(t)
	ca := startCA(t, proc.FreeAddr(t), t.TempDir(), jwksPath)
	injectorAdmin := proc.FreeAddr(t)
	injector := proc.Start(t, "injector", filepath.Join(binDir, "flotilla-injector"),
		append([]string{"--galley-address", mcp, "--webhook-address", proc.FreeAddr(t), "--admin-address", injectorAdmin}, common...)...)
	proc.WaitReady(t, "http://"+injectorAdmin+"/readyz")

	client := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, xds)
	if got := xdstest.Count(t, client, 20); got["v1"] != 20 {
		t.Fatalf("before: %v", got)
	}
	// galley first, with discovery and the injector subscribed.
	for _, p := range []*proc.Process{galley, injector, ca, discovery} {
		start := time.Now()
		if err := p.Stop(t, grace+5*time.Second); err != nil {
			t.Errorf("%s after SIGTERM: %v (want exit status 0)", p.Name, err)
		}
		took := time.Since(start)
		t.Logf("measured: %s exited %s after SIGTERM (grace %s)", p.Name, took.Round(time.Millisecond), grace)
		if took > grace {
			t.Errorf("%s took %s, longer than its %s grace period", p.Name, took, grace)
		}
		// The proxyless client keeps routing with what it has, whoever left.
		if got := xdstest.Count(t, client, 10); got["v1"] != 10 {
			t.Errorf("after %s stopped: %v", p.Name, got)
		}
	}
	for _, p := range []*proc.Process{galley, discovery} {
		if p.Out.Count("drained") == 0 {
			t.Errorf("%s did not report draining:\n%s", p.Name, p.Out.String())
		}
	}
}
