package ca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestTheControlPlaneTalksMTLSWithCertificatesFromCA: galley, discovery
// and the injector each get their certificate from ca; discovery and the
// injector subscribe to galley over mTLS, which galley accepts from their
// service accounts only; discovery serves ADS over mTLS to workloads with
// ca certificates.
func TestTheControlPlaneTalksMTLSWithCertificatesFromCA(t *testing.T) {
	s := proc.NewSigner(t)
	state := t.TempDir()
	c := startCA(t, state, s)
	rootsFile := filepath.Join(state, "roots.pem")
	tokenFile := func(sa string) string {
		path := filepath.Join(t.TempDir(), sa)
		if err := os.WriteFile(path, []byte(s.Token(t, "istio-system", sa)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fromCA := func(sa string) []string {
		return []string{"--ca-address", c.addr, "--ca-roots-file", rootsFile, "--token-file", tokenFile(sa)}
	}
	v1 := xdstest.StartBackend(t, "v1")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1")))

	mcpAddr, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	galley := proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), append([]string{
		"--config-dir", dir,
		"--mcp-address", mcpAddr, "--admin-address", galleyAdmin, "--webhook-address", proc.FreeAddr(t),
	}, fromCA("flotilla-galley")...)...)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	secureXDS, discoveryAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"), append([]string{
		"--galley-address", mcpAddr,
		"--xds-address", proc.FreeAddr(t), "--secure-xds-address", secureXDS, "--admin-address", discoveryAdmin,
	}, fromCA("flotilla-discovery")...)...)
	injectorAdmin := proc.FreeAddr(t)
	proc.Start(t, "injector", filepath.Join(binDir, "flotilla-injector"), append([]string{
		"--galley-address", mcpAddr,
		"--webhook-address", proc.FreeAddr(t), "--admin-address", injectorAdmin,
	}, fromCA("flotilla-injector")...)...)
	// Ready means each received galley's collections, over mTLS.
	proc.WaitReady(t, "http://"+discoveryAdmin+"/readyz")
	proc.WaitReady(t, "http://"+injectorAdmin+"/readyz")
	galley.Out.WaitForCount(t, "subscriber connected", 2)

	// A workload's certificate from the same ca.
	pemRoots, err := os.ReadFile(rootsFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	app := certclient.New(certclient.Options{
		Address: c.addr, ServerName: "127.0.0.1", Roots: certclient.StaticRoots(roots), Log: slog.New(slog.DiscardHandler),
		Token: func() (string, error) { return s.Token(t, "default", "app"), nil },
	})
	proc.Certificate(t, app)
	workload := app.Certificate()

	// galley's MCP refuses a workload, and anyone without a certificate.
	subscribe := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(mcpAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		got := make(chan struct{}, 1)
		cl, err := mcp.NewClient(mcp.ClientOptions{
			Conn: conn, NodeID: "intruder", TypeURLs: []string{registry.ServiceTypeURL}, Log: slog.New(slog.DiscardHandler),
			Handler: mcp.HandlerFunc(func(string, []*mcp.Resource, []string) error { got <- struct{}{}; return nil }),
		})
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer ccancel()
		go func() { _ = cl.Run(cctx) }()
		select {
		case <-got:
			return nil
		case <-cctx.Done():
			return cctx.Err()
		}
	}
	// Each checks galley by the name ca gives the control plane, so that
	// a refusal is galley's, not the client's.
	galleyName := "flotilla-galley.istio-system.svc"
	asWorkload := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: galleyName, Certificates: []tls.Certificate{*workload}})
	if err := subscribe(asWorkload); err == nil {
		t.Error("galley streamed its configuration to a workload's certificate")
	}
	noCert := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: galleyName})
	if err := subscribe(noCert); err == nil {
		t.Error("galley streamed its configuration without a client certificate")
	}
	// An operator's CLI, with a certificate of the system namespace
	// (flotilla analyze --live), is served.
	operator := certclient.New(certclient.Options{
		Address: c.addr, ServerName: "127.0.0.1", Roots: certclient.StaticRoots(roots), Log: slog.New(slog.DiscardHandler),
		Token: func() (string, error) { return s.Token(t, "istio-system", "default"), nil },
	})
	proc.Certificate(t, operator)
	asOperator := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: galleyName, Certificates: []tls.Certificate{*operator.Certificate()}})
	if err := subscribe(asOperator); err != nil {
		t.Errorf("galley refused a certificate of the system namespace (the CLI's): %v", err)
	}

	// discovery's secure port: workloads with ca certificates, or with
	// their tokens (Istio's agent), nobody else.
	dial := func(certs []tls.Certificate) error {
		conn, err := tls.Dial("tcp", secureXDS, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: "flotilla-discovery.istio-system.svc", Certificates: certs, NextProtos: []string{"h2"}})
		if err != nil {
			return err
		}
		defer conn.Close()
		// TLS 1.3 reports a refused client certificate on the first read.
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err = conn.Read(make([]byte, 1))
		if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
			return nil
		}
		return err
	}
	if err := dial([]tls.Certificate{*workload}); err != nil {
		t.Errorf("a workload on the secure xDS port: %v", err)
	}
	// Without a certificate the handshake completes, since Istio's agent
	// brings a token instead, but no stream is served without a valid
	// one (TestIstiosAgentAuthenticatesToDiscoveryWithItsTokenAndGetsCertificatesThroughIt
	// has the rest).
	if err := dial(nil); err != nil {
		t.Errorf("a client without a certificate could not even complete the handshake: %v", err)
	}
	_, err = clustersWithToken(t, istioAgentConn(t, c, secureXDS), "", "default", "app")
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("a stream with neither a certificate nor a token: %v, want Unauthenticated", err)
	}
}
