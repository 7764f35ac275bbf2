package authority

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/pemcerts"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func selfSigned(t *testing.T, kt KeyType) *Authority {
	t.Helper()
	cert, key, err := NewRoot(kt, "cluster.local", now)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cert, key, nil, cert, Options{MaxTTL: 48 * time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type csrOpts struct {
	uris   []string
	dns    []string
	ips    []net.IP
	emails []string
	key    crypto.Signer
}

func makeCSR(t *testing.T, o csrOpts) []byte {
	t.Helper()
	key := o.key
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := &x509.CertificateRequest{DNSNames: o.dns, IPAddresses: o.ips, EmailAddresses: o.emails}
	for _, u := range o.uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

var app = Identity{TrustDomain: "cluster.local", Namespace: "default", ServiceAccount: "app"}

func TestARootHasTheExtensionsOfACA(t *testing.T) {
	for _, kt := range []KeyType{ECDSAP256, RSA2048} {
		certPEM, _, err := NewRoot(kt, "cluster.local", now)
		if err != nil {
			t.Fatal(err)
		}
		certs, err := pemcerts.Parse(certPEM)
		if err != nil || len(certs) != 1 {
			t.Fatal(err)
		}
		c := certs[0]
		if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 || c.KeyUsage&x509.KeyUsageCRLSign == 0 {
			t.Errorf("%s: not a CA: IsCA %v, key usage %b", kt, c.IsCA, c.KeyUsage)
		}
		if len(c.SubjectKeyId) == 0 || string(c.SubjectKeyId) != string(c.AuthorityKeyId) {
			t.Errorf("%s: key identifiers %x / %x", kt, c.SubjectKeyId, c.AuthorityKeyId)
		}
		if got := c.NotAfter.Sub(now); got < 9*365*24*time.Hour {
			t.Errorf("%s: root valid for %s", kt, got)
		}
		if err := c.CheckSignatureFrom(c); err != nil {
			t.Errorf("%s: not self-signed: %v", kt, err)
		}
	}
}

func TestAWorkloadCertificateCarriesOnlyTheCallersIdentity(t *testing.T) {
	a := selfSigned(t, ECDSAP256)
	issued, err := a.Issue(Request{CSRPEM: makeCSR(t, csrOpts{}), Identity: app}, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf := issued.Chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/app" || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Fatalf("SANs: %v %v %v %v", leaf.URIs, leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	}
	if leaf.KeyUsage != x509.KeyUsageDigitalSignature|x509.KeyUsageKeyEncipherment || len(leaf.ExtKeyUsage) != 2 || leaf.IsCA {
		t.Fatalf("usage %b, ext %v, CA %v", leaf.KeyUsage, leaf.ExtKeyUsage, leaf.IsCA)
	}
	if got := leaf.NotAfter.Sub(now); got != DefaultTTL {
		t.Fatalf("TTL %s, want the default %s", got, DefaultTTL)
	}
	if len(issued.Chain) != 1 || !issued.Root.Equal(a.roots[0]) || len(issued.PEM()) != 2 {
		t.Fatalf("chain of %d, %d PEM", len(issued.Chain), len(issued.PEM()))
	}
	pool := x509.NewCertPool()
	pool.AddCert(issued.Root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("does not chain to the root: %v", err)
	}
	id, err := a.Verify(leaf, nil, now)
	if err != nil || id.SPIFFEID() != app.SPIFFEID() {
		t.Fatalf("verify for renewal: %v, %v", id, err)
	}
	// A CSR that names the caller's own SPIFFE ID is fine too.
	if _, err := a.Issue(Request{CSRPEM: makeCSR(t, csrOpts{uris: []string{app.SPIFFEID()}}), Identity: app, TTL: time.Hour}, now); err != nil {
		t.Fatal(err)
	}
}

func TestControlPlaneIdentitiesMayAlsoHaveTheirServiceNames(t *testing.T) {
	a := selfSigned(t, ECDSAP256)
	galley := Identity{
		TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "galley",
		DNSNames: []string{"flotilla-galley.istio-system.svc", "flotilla-galley.istio-system.svc.cluster.local"},
	}
	issued, err := a.Issue(Request{CSRPEM: makeCSR(t, csrOpts{dns: galley.DNSNames}), Identity: galley}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := issued.Chain[0].DNSNames; len(got) != 2 {
		t.Fatalf("DNS names %v", got)
	}
}

func TestRequestsForAnotherIdentityOrOutOfBoundsAreRefused(t *testing.T) {
	a := selfSigned(t, ECDSAP256)
	weak, err := rsa.GenerateKey(rand.Reader, 1024) // weak on purpose: it must be refused
	if err != nil {
		t.Fatal(err)
	}
	good := makeCSR(t, csrOpts{})
	tampered := []byte(strings.Replace(string(good), string(good[len(good)-40:len(good)-30]), "AAAAAAAAAA", 1))
	twoBlocks := append(append([]byte{}, good...), good...)
	tests := map[string]struct {
		req  Request
		kind error
		says string
	}{
		"another SPIFFE ID":      {Request{CSRPEM: makeCSR(t, csrOpts{uris: []string{"spiffe://cluster.local/ns/kube-system/sa/admin"}}), Identity: app}, ErrForbidden, "kube-system"},
		"an extra URI":           {Request{CSRPEM: makeCSR(t, csrOpts{uris: []string{app.SPIFFEID(), "spiffe://x/ns/a/sa/b"}}), Identity: app}, ErrForbidden, "spiffe://x"},
		"a DNS name":             {Request{CSRPEM: makeCSR(t, csrOpts{dns: []string{"bank.example.com"}}), Identity: app}, ErrForbidden, "bank.example.com"},
		"an IP address":          {Request{CSRPEM: makeCSR(t, csrOpts{ips: []net.IP{net.IPv4(10, 0, 0, 1)}}), Identity: app}, ErrForbidden, "IP"},
		"an e-mail address":      {Request{CSRPEM: makeCSR(t, csrOpts{emails: []string{"root@example.com"}}), Identity: app}, ErrForbidden, "e-mail"},
		"no identity":            {Request{CSRPEM: good}, ErrForbidden, "no authenticated identity"},
		"a TTL above the max":    {Request{CSRPEM: good, Identity: app, TTL: 72 * time.Hour}, ErrInvalidRequest, "maximum 48h0m0s"},
		"a negative TTL":         {Request{CSRPEM: good, Identity: app, TTL: -time.Second}, ErrInvalidRequest, "negative"},
		"an RSA 1024 key":        {Request{CSRPEM: makeCSR(t, csrOpts{key: weak}), Identity: app}, ErrInvalidRequest, "1024 bits"},
		"garbage":                {Request{CSRPEM: []byte("hello"), Identity: app}, ErrInvalidRequest, "not a PEM"},
		"no CSR":                 {Request{Identity: app}, ErrInvalidRequest, "no CSR"},
		"an oversized CSR":       {Request{CSRPEM: []byte(strings.Repeat("A", MaxCSRBytes+1)), Identity: app}, ErrInvalidRequest, "more than"},
		"two PEM blocks":         {Request{CSRPEM: twoBlocks, Identity: app}, ErrInvalidRequest, "more than one"},
		"a tampered CSR":         {Request{CSRPEM: tampered, Identity: app}, ErrInvalidRequest, "CSR"},
		"a certificate, not CSR": {Request{CSRPEM: a.RootsPEM(), Identity: app}, ErrInvalidRequest, "not a PEM CERTIFICATE REQUEST"},
	}
	for name, tt := range tests {
		_, err := a.Issue(tt.req, now)
		if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: error %v, want %v mentioning %q", name, err, tt.kind, tt.says)
		}
	}
}

// intermediate signs a CA certificate under root, as an organisation's
// PKI hands out a plugged-in cacerts.
func intermediate(t *testing.T, rootCert, rootKey []byte) (certPEM, keyPEM []byte) {
	t.Helper()
	roots, err := pemcerts.Parse(rootCert)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := parseKey(rootKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "cluster-1 intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, roots[0], key.Public(), rk)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
}

func TestAPluggedInIntermediateIssuesChainsToThePluggedRoot(t *testing.T) {
	rootCert, rootKey, err := NewRoot(RSA2048, "example.org", now)
	if err != nil {
		t.Fatal(err)
	}
	interCert, interKey := intermediate(t, rootCert, rootKey)
	a, err := New(interCert, interKey, interCert, rootCert, Options{}, now)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := a.Issue(Request{CSRPEM: makeCSR(t, csrOpts{}), Identity: app}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(issued.Chain) != 2 || len(issued.PEM()) != 3 {
		t.Fatalf("chain %d, PEM %d; want leaf+intermediate and leaf, intermediate, root", len(issued.Chain), len(issued.PEM()))
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rootCert)
	inter := x509.NewCertPool()
	inter.AddCert(issued.Chain[1])
	if _, err := issued.Chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now}); err != nil {
		t.Fatalf("does not verify against the plugged root: %v", err)
	}
	// A certificate from another authority does not renew here.
	other := selfSigned(t, ECDSAP256)
	foreign, err := other.Issue(Request{CSRPEM: makeCSR(t, csrOpts{}), Identity: app}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Verify(foreign.Chain[0], nil, now); err == nil {
		t.Fatal("a certificate of another root was accepted for renewal")
	}
	if _, err := a.Verify(issued.Chain[0], nil, now.Add(25*time.Hour)); err == nil {
		t.Fatal("an expired certificate was accepted for renewal")
	}
	// The chain's expiry (Citadel's cert chain metric) is the
	// intermediate's; a self-signed CA has no chain.
	ic, _ := pem.Decode(interCert)
	ix, err := x509.ParseCertificate(ic.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := a.ChainNotAfter(); !ok || !got.Equal(ix.NotAfter) {
		t.Errorf("chain expiry %s (%v), want the intermediate's %s", got, ok, ix.NotAfter)
	}
	if _, ok := other.ChainNotAfter(); ok {
		t.Error("a self-signed CA reports a chain")
	}
}

func TestABadSigningSetupIsRefused(t *testing.T) {
	rootCert, rootKey, err := NewRoot(ECDSAP256, "x", now)
	if err != nil {
		t.Fatal(err)
	}
	otherCert, otherKey, err := NewRoot(ECDSAP256, "y", now)
	if err != nil {
		t.Fatal(err)
	}
	interCert, interKey := intermediate(t, rootCert, rootKey)
	tests := map[string]struct {
		signer, key, chain, roots []byte
		at                        time.Time
		says                      string
	}{
		"key of another certificate": {rootCert, otherKey, nil, rootCert, now, "does not belong"},
		"chain to another root":      {interCert, interKey, interCert, otherCert, now, "does not chain"},
		"no trust bundle":            {rootCert, rootKey, nil, nil, now, "trust bundle"},
		"expired signer":             {interCert, interKey, interCert, rootCert, now.Add(2 * 365 * 24 * time.Hour), "expired"},
		"garbage key":                {rootCert, []byte("nope"), nil, rootCert, now, "CA key"},
	}
	for name, tt := range tests {
		if _, err := New(tt.signer, tt.key, tt.chain, tt.roots, Options{}, tt.at); err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tt.says)
		}
	}
	_ = otherKey
}

func TestSPIFFEIDs(t *testing.T) {
	good := map[string]Identity{
		"spiffe://cluster.local/ns/default/sa/app": app,
		"spiffe://example.org/ns/a-b/sa/c.d":       {TrustDomain: "example.org", Namespace: "a-b", ServiceAccount: "c.d"},
	}
	for s, want := range good {
		got, err := ParseSPIFFEID(s)
		if err != nil || got.SPIFFEID() != want.SPIFFEID() {
			t.Errorf("%s: %v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "spiffe://", "https://x/ns/a/sa/b", "spiffe://x/ns/a", "spiffe://x/ns//sa/b", "spiffe://x/ns/a/sa/b/c", "spiffe://x/ns/a/sa/b?q=1"} {
		if _, err := ParseSPIFFEID(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// FuzzParseCSR: arbitrary bytes are refused with ErrInvalidRequest or
// parsed into a CSR with a valid signature; never a panic.
func FuzzParseCSR(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"a"}}, key)
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add(der)
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ParseCSR(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if csr.CheckSignature() != nil {
			t.Fatal("accepted a CSR with a bad signature")
		}
	})
}

// TestOnlyThisCAsSignersProveARenewal: a sibling intermediate under the
// same root signs a certificate: it does not renew here (it would let
// another cluster's CA mint identities in this one). After a change of
// signing key, the previous signer's certificates still renew until they
// expire.
func TestOnlyThisCAsSignersProveARenewal(t *testing.T) {
	rootCert, rootKey, err := NewRoot(ECDSAP256, "example.org", now)
	if err != nil {
		t.Fatal(err)
	}
	mine, mineKey := intermediate(t, rootCert, rootKey)
	sibling, siblingKey := intermediate(t, rootCert, rootKey)
	a, err := New(mine, mineKey, mine, rootCert, Options{}, now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(sibling, siblingKey, sibling, rootCert, Options{}, now)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(x *Authority) *x509.Certificate {
		t.Helper()
		c, err := x.Issue(Request{CSRPEM: makeCSR(t, csrOpts{}), Identity: app}, now)
		if err != nil {
			t.Fatal(err)
		}
		return c.Chain[0]
	}
	own, fromSibling := issue(a), issue(b)
	if id, err := a.Verify(own, nil, now); err != nil || id.SPIFFEID() != app.SPIFFEID() {
		t.Fatalf("its own certificate: %v, %v", id, err)
	}
	if _, err := a.Verify(fromSibling, []*x509.Certificate{b.signer}, now); err == nil {
		t.Fatal("a sibling intermediate's certificate renewed")
	}

	// A new signing key (another intermediate of the same root) succeeds a.
	next, nextKey := intermediate(t, rootCert, rootKey)
	c, err := New(next, nextKey, next, rootCert, Options{}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(own, nil, now); err == nil {
		t.Fatal("a certificate of a signer not succeeded renewed")
	}
	c.Succeed(a, now)
	if _, err := c.Verify(own, nil, now); err != nil {
		t.Fatalf("after succeeding, the previous signer's certificate: %v", err)
	}
	if _, err := c.Verify(fromSibling, nil, now); err == nil {
		t.Fatal("succeeding a let the sibling's certificates renew")
	}
}
