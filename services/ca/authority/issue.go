package authority

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"
)

// Request is a certificate signing request from an authenticated caller.
type Request struct {
	// CSRPEM is the PEM certificate request.
	CSRPEM []byte
	// TTL is the validity asked for; zero means the default.
	TTL time.Duration
	// Identity is the authenticated caller's, never the CSR's.
	Identity Identity
}

// Issued is a signed certificate and what it chains through.
type Issued struct {
	// Chain is the leaf first, then the intermediates; Root is the root it
	// chains to.
	Chain []*x509.Certificate
	Root  *x509.Certificate
}

// PEM returns the leaf, each intermediate and the root, each as PEM: the
// IstioCertificateResponse cert_chain.
func (i *Issued) PEM() []string {
	out := make([]string, 0, len(i.Chain)+1)
	for _, c := range append(slices.Clone(i.Chain), i.Root) {
		out = append(out, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})))
	}
	return out
}

// Issue signs a workload certificate. The SPIFFE ID, the one URI SAN, is
// the authenticated identity's; a CSR that asks for any other identity (a
// different URI, a DNS name not allowed to the identity, an IP or an
// e-mail address) is refused (ErrForbidden); a malformed CSR, a weak key
// or a TTL above the maximum is refused (ErrInvalidRequest) with what is
// allowed.
func (a *Authority) Issue(r Request, now time.Time) (*Issued, error) {
	csr, err := ParseCSR(r.CSRPEM)
	if err != nil {
		return nil, err
	}
	ttl := r.TTL
	switch {
	case ttl < 0:
		return nil, fmt.Errorf("%w: %w: negative TTL %s", ErrInvalidRequest, ErrInvalidTTL, ttl)
	case ttl == 0:
		ttl = a.o.DefaultTTL
	case ttl > a.o.MaxTTL:
		return nil, fmt.Errorf("%w: %w: TTL %s is above the maximum %s", ErrInvalidRequest, ErrInvalidTTL, ttl, a.o.MaxTTL)
	}
	id := r.Identity
	if id.TrustDomain == "" || id.Namespace == "" || id.ServiceAccount == "" {
		return nil, fmt.Errorf("%w: no authenticated identity", ErrForbidden)
	}
	spiffe := id.SPIFFEID()
	for _, u := range csr.URIs {
		if u.String() != spiffe {
			return nil, fmt.Errorf("%w: the CSR asks for %s but the caller is %s", ErrForbidden, u, spiffe)
		}
	}
	for _, d := range csr.DNSNames {
		if !slices.Contains(id.DNSNames, d) {
			return nil, fmt.Errorf("%w: the CSR asks for DNS name %q, which %s may not have", ErrForbidden, d, spiffe)
		}
	}
	if len(csr.IPAddresses) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, fmt.Errorf("%w: the CSR asks for IP addresses or e-mail addresses; only %s is issued", ErrForbidden, spiffe)
	}
	return a.sign(csr.PublicKey, id, csr.DNSNames, nil, ttl, now)
}

// IssueServing signs a certificate for a key ca holds itself (its own
// serving certificate), with DNS names and IP addresses as given: no CSR
// policy applies, so it is not reachable from callers.
func (a *Authority) IssueServing(pub crypto.PublicKey, id Identity, ips []net.IP, ttl time.Duration, now time.Time) (*Issued, error) {
	return a.sign(pub, id, id.DNSNames, ips, ttl, now)
}

func (a *Authority) sign(pub crypto.PublicKey, id Identity, dnsNames []string, ips []net.IP, ttl time.Duration, now time.Time) (*Issued, error) {
	spiffe := id.SPIFFEID()
	u, err := url.Parse(spiffe)
	if err != nil {
		return nil, fmt.Errorf("%w: identity %s: %w", ErrForbidden, spiffe, err)
	}
	notAfter := now.Add(ttl)
	if notAfter.After(a.signer.NotAfter) {
		notAfter = a.signer.NotAfter // never outlive the signer
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{u},
		DNSNames:              slices.Clone(dnsNames),
		IPAddresses:           slices.Clone(ips),
		AuthorityKeyId:        a.signer.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.signer, pub, a.key)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	issued := &Issued{Chain: append([]*x509.Certificate{leaf}, a.chain...)}
	issued.Root = a.rootOf(issued.Chain[len(issued.Chain)-1])
	if issued.Root == nil {
		return nil, errors.New("no root in the trust bundle signed the chain")
	}
	// A self-signed root signs leaves directly: the chain is the leaf and
	// the root, which is not repeated as an intermediate.
	if issued.Chain[len(issued.Chain)-1].Equal(issued.Root) {
		issued.Chain = issued.Chain[:len(issued.Chain)-1]
	}
	return issued, nil
}

func (a *Authority) rootOf(c *x509.Certificate) *x509.Certificate {
	for _, r := range a.roots {
		if c.Equal(r) || c.CheckSignatureFrom(r) == nil {
			return r
		}
	}
	return nil
}

// ParseCSR decodes and checks a PEM certificate request: one request, at
// most MaxCSRBytes, a valid signature, and an ECDSA (P-256 or P-384) or
// RSA (2048 to 8192 bits) key.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: no CSR", ErrInvalidRequest)
	}
	if len(data) > MaxCSRBytes {
		return nil, fmt.Errorf("%w: CSR is %d bytes, more than %d", ErrInvalidRequest, len(data), MaxCSRBytes)
	}
	block, rest := pem.Decode(data)
	if block == nil || (block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST") {
		return nil, fmt.Errorf("%w: the CSR is not a PEM CERTIFICATE REQUEST", ErrInvalidRequest)
	}
	if more, _ := pem.Decode(rest); more != nil {
		return nil, fmt.Errorf("%w: more than one PEM block", ErrInvalidRequest)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: CSR: %w", ErrInvalidRequest, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: CSR signature: %w", ErrInvalidRequest, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s; want P-256 or P-384", ErrInvalidRequest, k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if bits := k.N.BitLen(); bits < minRSABits || bits > maxRSABits {
			return nil, fmt.Errorf("%w: RSA key of %d bits; want %d to %d", ErrInvalidRequest, bits, minRSABits, maxRSABits)
		}
	case ed25519.PublicKey:
		return nil, fmt.Errorf("%w: Ed25519 keys are not issued; use ECDSA P-256 or RSA", ErrInvalidRequest)
	default:
		return nil, fmt.Errorf("%w: unsupported key type %T", ErrInvalidRequest, k)
	}
	return csr, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("CA key: no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("CA key: unexpected PEM block %q", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key: %T cannot sign", key)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}
