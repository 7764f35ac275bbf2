package connect

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// handshake runs a real TLS handshake between a server presenting leaf
// (chained to its CA) and a client with cfg, and returns the client's
// error.
func handshake(t *testing.T, leaf *testpki.Leaf, cfg *tls.Config) error {
	t.Helper()
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		c.Close()
	}()
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return tls.Client(conn, cfg).Handshake()
}

func TestAReplicaIsCheckedForItsServiceOfAnyRevisionAndTheMeshsRoots(t *testing.T) {
	mesh, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("another mesh")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(mesh.Cert)
	issue := func(ca *testpki.CA, dns string, usage ...x509.ExtKeyUsage) *testpki.Leaf {
		l, err := ca.Issue(testpki.Request{CommonName: dns, DNSNames: []string{dns}, Usage: usage})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, c := range []struct {
		name    string
		service string
		leaf    *testpki.Leaf
		err     string // "" accepts
	}{
		{"the default revision's discovery", "flotilla-discovery", issue(mesh, "flotilla-discovery.istio-system.svc"), ""},
		{"revision canary's discovery", "flotilla-discovery", issue(mesh, "flotilla-discovery-canary.istio-system.svc"), ""},
		{"galley, asked as discovery", "flotilla-discovery", issue(mesh, "flotilla-galley.istio-system.svc"), "no flotilla-discovery Service"},
		{"discovery of another namespace", "flotilla-discovery", issue(mesh, "flotilla-discovery.other.svc"), "no flotilla-discovery Service"},
		{"a name shaped like a revision that is none", "flotilla-discovery", issue(mesh, "flotilla-discovery-default.istio-system.svc"), "no flotilla-discovery Service"},
		{"another mesh's discovery", "flotilla-discovery", issue(other, "flotilla-discovery.istio-system.svc"), "unknown authority"},
		{"a client-only certificate", "flotilla-discovery", issue(mesh, "flotilla-discovery.istio-system.svc", x509.ExtKeyUsageClientAuth), "usage"},
		// galley has no revisions: its one name.
		{"galley", "flotilla-galley", issue(mesh, "flotilla-galley.istio-system.svc"), ""},
		{"a discovery revision, asked as galley", "flotilla-galley", issue(mesh, "flotilla-discovery-canary.istio-system.svc"), "flotilla-galley.istio-system.svc"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := handshake(t, c.leaf, serverCheck(c.service, "istio-system", roots))
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("got %v, want an error saying %q", err, c.err)
			}
		})
	}
}
