// Package authority is ca's signing core: it creates a self-signed root,
// or takes a plugged-in intermediate, and issues workload certificates
// whose identity comes only from the authenticated caller. It does no I/O
// beyond what its callers hand it.
package authority

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // RFC 5280 key identifiers are SHA-1 by definition, not a security use
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/pemcerts"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
)

// Errors are one of these kinds, for the server to map to gRPC codes.
var (
	// ErrInvalidRequest: the CSR or TTL is malformed or out of bounds.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrForbidden: the CSR asks for an identity the caller does not have.
	ErrForbidden = errors.New("identity not allowed")
	// ErrInvalidTTL is an invalid request for a lifetime out of range.
	ErrInvalidTTL = errors.New("TTL out of range")
)

// KeyType is the algorithm of a CA key.
type KeyType string

// Supported CA key types.
const (
	ECDSAP256 KeyType = "ECDSA_P256"
	RSA2048   KeyType = "RSA_2048"
	RSA4096   KeyType = "RSA_4096"
)

// Limits on what a caller may send.
const (
	MaxCSRBytes   = 16 << 10
	minRSABits    = 2048
	maxRSABits    = 8192
	clockSkew     = time.Minute
	rootValidity  = 10 * 365 * 24 * time.Hour
	DefaultTTL    = 24 * time.Hour
	DefaultMaxTTL = 90 * 24 * time.Hour
)

// GenerateKey makes a private key of a type.
func GenerateKey(kt KeyType) (crypto.Signer, error) {
	switch kt {
	case ECDSAP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	default:
		return nil, fmt.Errorf("key type %q: want %s, %s or %s", kt, ECDSAP256, RSA2048, RSA4096)
	}
}

// CheckKeyType reports whether a key type is supported.
func CheckKeyType(kt KeyType) error {
	switch kt {
	case ECDSAP256, RSA2048, RSA4096:
		return nil
	}
	return fmt.Errorf("key type %q: want %s, %s or %s", kt, ECDSAP256, RSA2048, RSA4096)
}

// NewRoot creates a self-signed root certificate (10 years, CA basic
// constraints, certificate and CRL signing, subject and authority key
// identifiers) for org, and returns it and its key as PEM.
func NewRoot(kt KeyType, org string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := GenerateKey(kt)
	if err != nil {
		return nil, nil, err
	}
	ski, err := keyID(key.Public())
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{org}, CommonName: "Flotilla root CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(rootValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ski,
		AuthorityKeyId:        ski,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign root: %w", err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode root key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}

// keyID is the RFC 5280 (method 1) key identifier of a public key.
func keyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode public key: %w", err)
	}
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &spki); err != nil {
		return nil, fmt.Errorf("parse public key: %w", err)
	}
	sum := sha1.Sum(spki.PublicKey.Bytes) //nolint:gosec // see the import
	return sum[:], nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // the system's randomness is gone: nothing is safe to issue
	}
	return n.Add(n, big.NewInt(1))
}

// Options bound what an Authority issues.
type Options struct {
	// DefaultTTL is used when a request names none; MaxTTL is the most a
	// request may ask for.
	DefaultTTL, MaxTTL time.Duration
}

// Authority signs with one CA certificate and key.
type Authority struct {
	signer *x509.Certificate
	key    crypto.Signer
	// chain is the signer and the intermediates above it, up to (not
	// including) a root; roots is the trust bundle (several during a root
	// rotation).
	chain []*x509.Certificate
	roots []*x509.Certificate
	o     Options
	// previous are signers this authority replaced (Succeed) whose
	// certificates still prove their holders' identity until they expire.
	previous []*x509.Certificate
}

// Succeed makes a accept, besides its own, the certificates old (and the
// authorities old succeeded) signed, while those signers are valid and
// chain to a's trust bundle: workloads renew with the certificate they
// hold across a change of signing key.
func (a *Authority) Succeed(old *Authority, now time.Time) {
	if old == nil {
		return
	}
	roots := x509.NewCertPool()
	for _, r := range a.roots {
		roots.AddCert(r)
	}
	for _, s := range append([]*x509.Certificate{old.signer}, old.previous...) {
		if s.Equal(a.signer) || !now.Before(s.NotAfter) || slices.ContainsFunc(a.previous, s.Equal) {
			continue
		}
		inter := x509.NewCertPool()
		for _, c := range old.chain {
			inter.AddCert(c)
		}
		if _, err := s.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			continue // no longer trusted
		}
		a.previous = append(a.previous, s)
	}
}

// New builds an Authority from PEM: the signing certificate and its key,
// the certificates between it and a root (empty for a self-signed root
// that signs itself), and the trust bundle. It checks that the key matches,
// that the signer is a CA and that the chain verifies to the bundle.
func New(signerPEM, keyPEM, chainPEM, rootsPEM []byte, o Options, now time.Time) (*Authority, error) {
	if o.DefaultTTL <= 0 {
		o.DefaultTTL = DefaultTTL
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = DefaultMaxTTL
	}
	if o.DefaultTTL > o.MaxTTL {
		return nil, fmt.Errorf("default TTL %s is above the maximum %s", o.DefaultTTL, o.MaxTTL)
	}
	signers, err := pemcerts.Parse(signerPEM)
	if err != nil || len(signers) != 1 {
		return nil, fmt.Errorf("signing certificate: want one PEM certificate (%w)", errOr(err, "found "+fmt.Sprint(len(signers))))
	}
	signer := signers[0]
	if !signer.IsCA || signer.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("signing certificate is not a CA allowed to sign certificates")
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(key.Public(), signer.PublicKey) {
		return nil, errors.New("the key does not belong to the signing certificate")
	}
	intermediates, err := pemcerts.Parse(chainPEM)
	if err != nil && !errors.Is(err, pemcerts.ErrNone) { // a chain may be the signer alone
		return nil, fmt.Errorf("certificate chain: %w", err)
	}
	roots, err := pemcerts.Parse(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("trust bundle: want at least one PEM certificate (%w)", errOr(err, "found none"))
	}
	a := &Authority{signer: signer, key: key, roots: roots, o: o}
	a.chain = append([]*x509.Certificate{signer}, slices.DeleteFunc(intermediates, func(c *x509.Certificate) bool { return c.Equal(signer) })...)
	if _, err := a.verify(signer, now); err != nil {
		return nil, fmt.Errorf("signing certificate does not chain to the trust bundle: %w", err)
	}
	if now.After(signer.NotAfter) {
		return nil, fmt.Errorf("signing certificate expired at %s", signer.NotAfter.UTC().Format(time.RFC3339))
	}
	return a, nil
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

func (a *Authority) verify(c *x509.Certificate, now time.Time) ([][]*x509.Certificate, error) {
	rootPool := x509.NewCertPool()
	for _, r := range a.roots {
		rootPool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range a.chain {
		inter.AddCert(c)
	}
	chains, err := c.Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return chains, nil
}

// SignerNotAfter and RootsNotAfter report expiry times (for metrics).
func (a *Authority) SignerNotAfter() time.Time { return a.signer.NotAfter }

// ChainNotAfter is the earliest expiry of the signer's chain below the
// roots (the signer and its intermediates); ok is false when the signer
// is a root itself (a self-signed CA has no chain).
func (a *Authority) ChainNotAfter() (t time.Time, ok bool) {
	if slices.ContainsFunc(a.roots, a.signer.Equal) {
		return time.Time{}, false
	}
	for _, c := range a.chain {
		if !ok || c.NotAfter.Before(t) {
			t, ok = c.NotAfter, true
		}
	}
	return t, ok
}

// RootsNotAfter is the earliest expiry in the trust bundle.
func (a *Authority) RootsNotAfter() time.Time {
	t := a.roots[0].NotAfter
	for _, r := range a.roots[1:] {
		if r.NotAfter.Before(t) {
			t = r.NotAfter
		}
	}
	return t
}

// RootsPEM is the trust bundle.
func (a *Authority) RootsPEM() []byte {
	var out []byte
	for _, r := range a.roots {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Raw})...)
	}
	return out
}

// Verify checks that a certificate this authority signed (with its
// signing key, or one it succeeded) is valid now, and returns its SPIFFE
// identity. A certificate from another authority under the same root (a
// sibling intermediate, another cluster's) proves nothing here: only the
// signers themselves are trusted, not the roots above them.
func (a *Authority) Verify(leaf *x509.Certificate, _ []*x509.Certificate, now time.Time) (Identity, error) {
	signers := x509.NewCertPool()
	signers.AddCert(a.signer)
	for _, s := range a.previous {
		if now.Before(s.NotAfter) {
			signers.AddCert(s)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: signers, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return Identity{}, fmt.Errorf("client certificate (not one this CA signed): %w", err)
	}
	if len(leaf.URIs) != 1 {
		return Identity{}, errors.New("client certificate: want exactly one URI SAN")
	}
	return ParseSPIFFEID(leaf.URIs[0].String())
}

// Identity is who a certificate is for, from authentication.
type Identity struct {
	TrustDomain, Namespace, ServiceAccount string
	// DNSNames the identity may also have (control-plane services' own
	// Service names).
	DNSNames []string
}

// SPIFFEID is spiffe://<trust-domain>/ns/<namespace>/sa/<service account>.
func (id Identity) SPIFFEID() string {
	return spiffe.ID{TrustDomain: id.TrustDomain, Namespace: id.Namespace, ServiceAccount: id.ServiceAccount}.String()
}

// ParseSPIFFEID parses an Istio workload SPIFFE ID (spiffe.Parse).
func ParseSPIFFEID(s string) (Identity, error) {
	id, err := spiffe.Parse(s)
	if err != nil {
		return Identity{}, err
	}
	return Identity{TrustDomain: id.TrustDomain, Namespace: id.Namespace, ServiceAccount: id.ServiceAccount}, nil
}
