package proc

import (
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
)

// Signer issues the service account tokens ca checks against its JWKS
// (ca's no-cluster mode, --jwks-file and --jwt-issuer Issuer), as the
// kubelet projects them into a pod.
type Signer struct {
	Issuer *devjwt.Issuer
	// JWKS is the file of the issuer's keys, for ca's --jwks-file.
	JWKS string
}

// SignerIssuer is the issuer of a Signer's tokens, for ca's --jwt-issuer.
const SignerIssuer = "https://flotilla.test"

// NewSigner returns a Signer with keys of its own.
func NewSigner(tb testing.TB) *Signer {
	tb.Helper()
	iss, err := devjwt.New(SignerIssuer)
	if err != nil {
		tb.Fatal(err)
	}
	d := &devjwt.Dir{Path: tb.TempDir(), Issuer: iss} // the JWKS only: tokens are minted as needed
	if err := d.Write(time.Now()); err != nil {
		tb.Fatal(err)
	}
	return &Signer{Issuer: iss, JWKS: d.JWKSFile()}
}

// Token is a service account token of namespace/account with Istio's CA
// audience (istio-ca), valid for an hour: what the istio-token projected
// volume holds.
func (s *Signer) Token(tb testing.TB, namespace, account string) string {
	tb.Helper()
	tok, err := s.Issuer.Token(namespace, account, "istio-ca", time.Now(), time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}
