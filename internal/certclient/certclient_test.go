package certclient

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// TestRequirePeersAcceptsOnlyTheNamedServiceAccounts: a real TLS
// handshake on loopback with client certificates from the same CA.
func TestRequirePeersAcceptsOnlyTheNamedServiceAccounts(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(uri string) tls.Certificate {
		t.Helper()
		l, err := ca.Issue(testpki.Request{CommonName: "x", URIs: []string{uri}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	server := leaf("spiffe://cluster.local/ns/istio-system/sa/flotilla-galley")
	serve := func(accounts ...string) string {
		cfg := RequirePeers(&tls.Config{
			MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{server},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
		}, accounts...)
		lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					if c.(*tls.Conn).Handshake() == nil {
						_, _ = c.Write([]byte("ok"))
					}
				}()
			}
		}()
		return lis.Addr().String()
	}
	named := serve("istio-system/flotilla-discovery", "istio-system/flotilla-injector")
	wholeNamespace := serve("istio-system/*")
	accepted := func(addr, uri string) bool {
		conn, err := tls.Dial("tcp", addr, &tls.Config{
			MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{leaf(uri)},
		})
		if err != nil {
			return false
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn)
		return strings.Contains(string(b), "ok")
	}
	for uri, ok := range map[string][2]bool{ // named, whole namespace
		"spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery":   {true, true},
		"spiffe://cluster.local/ns/istio-system/sa/flotilla-injector":    {true, true},
		"spiffe://cluster.local/ns/default/sa/flotilla-discovery":        {false, false}, // another namespace
		"spiffe://cluster.local/ns/istio-system/sa/app":                  {false, true},
		"spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery/x": {false, false},
		"spiffe://cluster.local/ns/istio-system/sa/":                     {false, false},
		"spiffe://cluster.local/ns/istio-system-2/sa/app":                {false, false},
	} {
		if got := accepted(named, uri); got != ok[0] {
			t.Errorf("%s by the named accounts: accepted %v, want %v", uri, got, ok[0])
		}
		if got := accepted(wholeNamespace, uri); got != ok[1] {
			t.Errorf("%s by istio-system/*: accepted %v, want %v", uri, got, ok[1])
		}
	}
}

// TestClientConfigChecksTheServersIdentityNotItsName: the server is
// reached at 127.0.0.1 but named by its SPIFFE ID; another identity, or
// the right one from another CA, is refused.
func TestClientConfigChecksTheServersIdentityNotItsName(t *testing.T) {
	mesh, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	cert := func(ca *testpki.CA, uri string) tls.Certificate {
		t.Helper()
		l, err := ca.Issue(testpki.Request{CommonName: "x", URIs: []string{uri}, DNSNames: []string{"somewhere.example"}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := New(Options{Roots: StaticRoots(mesh.Pool()), Log: slog.New(slog.DiscardHandler)})
	mine := cert(mesh, "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery")
	c.current.Store(&mine)
	for name, tc := range map[string]struct {
		server tls.Certificate
		ok     bool
	}{
		"galley":               {cert(mesh, "spiffe://cluster.local/ns/istio-system/sa/flotilla-galley"), true},
		"a workload":           {cert(mesh, "spiffe://cluster.local/ns/default/sa/app"), false},
		"galley of another CA": {cert(other, "spiffe://cluster.local/ns/istio-system/sa/flotilla-galley"), false},
	} {
		lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
			MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{tc.server},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: mesh.Pool(),
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			conn, err := lis.Accept()
			if err == nil {
				_ = conn.(*tls.Conn).Handshake()
				conn.Close()
			}
		}()
		conn, err := tls.Dial("tcp", lis.Addr().String(), c.ClientConfig("istio-system/flotilla-galley"))
		if err == nil {
			conn.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", name, err, tc.ok)
		}
		lis.Close()
	}
}

// Wait holds what needs a certificate until the first one arrives, and
// lets go when the context ends without one.
func TestWaitReturnsWithTheFirstCertificateOrWhenTheContextEnds(t *testing.T) {
	c := New(Options{Address: "127.0.0.1:1", Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c.Wait(ctx) {
		t.Fatal("Wait reported a certificate that never came")
	}
	done := make(chan bool)
	go func() { done <- c.Wait(context.Background()) }()
	select {
	case <-done:
		t.Fatal("Wait returned before a certificate was held")
	case <-time.After(50 * time.Millisecond):
	}
	close(c.ready) // as Run does when it stores the first certificate
	if !<-done {
		t.Fatal("Wait did not report the certificate")
	}
}
