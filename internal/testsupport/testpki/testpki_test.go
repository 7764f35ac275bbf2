package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"
)

func TestIssuedLeafVerifiesAgainstItsCAForItsNames(t *testing.T) {
	ca, err := NewCA("test root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(Request{
		CommonName: "webhook",
		DNSNames:   []string{"webhook.default.svc"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs:       []string{"spiffe://cluster.local/ns/default/sa/webhook"},
		TTL:        time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"webhook.default.svc", "127.0.0.1"} {
		_, err := leaf.Cert.Verify(x509.VerifyOptions{DNSName: name, Roots: ca.Pool()})
		if err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{DNSName: "other.svc", Roots: ca.Pool()}); err == nil {
		t.Error("leaf verified for a name it does not carry")
	}
	if got := leaf.Cert.URIs[0].String(); got != "spiffe://cluster.local/ns/default/sa/webhook" {
		t.Errorf("URI SAN = %s", got)
	}
	if _, err := leaf.TLSCertificate(); err != nil {
		t.Errorf("key pair does not load: %v", err)
	}
}

func TestWriteFilesProducesALoadableKeyPair(t *testing.T) {
	ca, err := NewCA("root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(Request{CommonName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	cf, kf, err := leaf.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.LoadX509KeyPair(cf, kf); err != nil {
		t.Fatal(err)
	}
}
