// Package devjwt issues service account tokens where there is no cluster
// to do it: a signing key (new, or kept in a file across restarts), the
// JWKS that ca takes as --jwks-file, and tokens naming a Kubernetes service
// account (subject system:serviceaccount:<namespace>:<name>) for an
// audience, as a projected service account token would. `make run` and
// the docker compose stack (flotilla-demo identity) use it so that the
// control plane gets its certificates from ca, as it does in a cluster.
package devjwt

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
)

// keyID names the issuer's key in its JWKS and in every token's header.
const keyID = "flotilla-dev"

// Issuer signs tokens with one ES256 key.
type Issuer struct {
	// Name is the tokens' issuer (iss), which ca is told with --jwt-issuer.
	Name   string
	key    *ecdsa.PrivateKey
	signer jose.Signer
}

// New makes an issuer with a new key.
func New(name string) (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devjwt: generating the signing key: %w", err)
	}
	return withKey(name, key)
}

// LoadOrCreate makes an issuer with the key in keyFile (PKCS#8 PEM),
// creating the file with a new key when there is none, so that a restarted
// issuer signs as before and what trusts its JWKS keeps trusting it.
func LoadOrCreate(name, keyFile string) (*Issuer, error) {
	data, err := os.ReadFile(keyFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		iss, err := New(name)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalPKCS8PrivateKey(iss.key)
		if err != nil {
			return nil, fmt.Errorf("devjwt: encoding the signing key: %w", err)
		}
		if err := atomicfile.Write(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, fmt.Errorf("devjwt: %w", err)
		}
		return iss, nil
	case err != nil:
		return nil, fmt.Errorf("devjwt: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("devjwt: %s holds no PEM PRIVATE KEY", keyFile)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("devjwt: %s: %w", keyFile, err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("devjwt: %s: want an ECDSA P-256 key, got %T", keyFile, key)
	}
	return withKey(name, ec)
}

func withKey(name string, key *ecdsa.PrivateKey) (*Issuer, error) {
	if name == "" {
		return nil, errors.New("devjwt: an issuer needs a name")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", keyID))
	if err != nil {
		return nil, fmt.Errorf("devjwt: %w", err)
	}
	return &Issuer{Name: name, key: key, signer: signer}, nil
}

// JWKS is the key set that verifies the issuer's tokens.
func (i *Issuer) JWKS() ([]byte, error) {
	data, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: i.key.Public(), KeyID: keyID, Algorithm: string(jose.ES256), Use: "sig"}}})
	if err != nil {
		return nil, fmt.Errorf("devjwt: encoding the JWKS: %w", err)
	}
	return data, nil
}

// Token is a token for the service account namespace/name, valid for ttl
// from now for the audience.
func (i *Issuer) Token(namespace, name, audience string, now time.Time, ttl time.Duration) (string, error) {
	if namespace == "" || name == "" || audience == "" || ttl <= 0 {
		return "", fmt.Errorf("devjwt: a token needs a namespace, a name, an audience and a positive lifetime (got %q, %q, %q, %s)", namespace, name, audience, ttl)
	}
	tok, err := jwt.Signed(i.signer).Claims(jwt.Claims{
		Issuer:    i.Name,
		Subject:   "system:serviceaccount:" + namespace + ":" + name,
		Audience:  jwt.Audience{audience},
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(ttl)),
	}).Serialize()
	if err != nil {
		return "", fmt.Errorf("devjwt: signing a token for %s/%s: %w", namespace, name, err)
	}
	return tok, nil
}
