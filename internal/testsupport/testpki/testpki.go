// Package testpki makes throwaway certificate authorities and certificates
// for tests and test harnesses: webhook servers on 127.0.0.1, mTLS between
// test processes, the kube-apiserver in internal/testsupport/kubeenv. It is not the
// mesh's CA (that is services/ca) and its keys are never meant to leave a
// test's temporary directory.
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// Leaf is an issued certificate with its key.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA creates a CA valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pemBlock("CERTIFICATE", der)}, nil
}

// Request describes a leaf certificate to issue.
type Request struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	URIs       []string
	// Usage defaults to both server and client authentication.
	Usage []x509.ExtKeyUsage
	// TTL defaults to one hour.
	TTL time.Duration
}

// Issue signs a leaf certificate for r.
func (ca *CA) Issue(r Request) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	usage := r.Usage
	if usage == nil {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	ttl := r.TTL
	if ttl == 0 {
		ttl = time.Hour
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: r.CommonName},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     r.DNSNames,
		IPAddresses:  r.IPs,
	}
	for _, u := range r.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("URI SAN %q: %w", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign %q: %w", r.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse leaf: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return &Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", kder)}, nil
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// TLSCertificate returns the leaf as a tls.Certificate.
func (l *Leaf) TLSCertificate() (tls.Certificate, error) {
	return tls.X509KeyPair(l.CertPEM, l.KeyPEM)
}

// WriteFiles writes the leaf's certificate and key as cert.pem and key.pem in
// dir (atomically, by rename) and returns their paths.
func (l *Leaf) WriteFiles(dir string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := atomicfile.Write(keyFile, l.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := atomicfile.Write(certFile, l.CertPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// Files are an issued certificate's and key's files.
type Files struct{ Cert, Key string }

// IssueFiles issues a leaf for 127.0.0.1 named name with the SPIFFE ID
// spiffeID, and writes its certificate and key into a new temporary
// directory of tb: a service's or proxy's identity in a process test.
func (ca *CA) IssueFiles(tb testing.TB, name, spiffeID string) Files {
	tb.Helper()
	leaf, err := ca.Issue(Request{CommonName: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []string{spiffeID}})
	if err != nil {
		tb.Fatal(err)
	}
	cert, key, err := leaf.WriteFiles(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return Files{Cert: cert, Key: key}
}

// IssueTLS issues a leaf for r as a tls.Certificate, failing tb on error:
// a server's or client's certificate in an in-process TLS test.
func (ca *CA) IssueTLS(tb testing.TB, r Request) tls.Certificate {
	tb.Helper()
	leaf, err := ca.Issue(r)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	return cert
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the OS has no entropy: nothing can work
	}
	return n
}
