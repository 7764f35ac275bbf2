// Package pemcerts reads PEM certificate bundles: the mesh's roots, a
// certificate chain, a proxy's trust bundle.
package pemcerts

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ErrNone says a bundle held no PEM certificate.
var ErrNone = errors.New("no PEM certificate")

// Parse reads every CERTIFICATE block of b, in order, skipping blocks of
// other types; a bundle without one is ErrNone, a certificate that does
// not parse an error.
func Parse(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, ErrNone
	}
	return out, nil
}
