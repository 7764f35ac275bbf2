// Package spiffe is Istio's workload identity, the SPIFFE ID
// spiffe://<trust-domain>/ns/<namespace>/sa/<service account> that ca
// puts in a workload certificate's URI SAN and that peers check.
package spiffe

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ID is a workload identity.
type ID struct {
	TrustDomain, Namespace, ServiceAccount string
}

// String is the SPIFFE ID.
func (id ID) String() string {
	return "spiffe://" + id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}

// Parse parses an Istio workload SPIFFE ID.
func Parse(s string) (ID, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "spiffe" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return ID{}, fmt.Errorf("%q is not a SPIFFE ID", s)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return ID{}, fmt.Errorf("%q: want spiffe://<trust-domain>/ns/<namespace>/sa/<service account>", s)
	}
	return ID{TrustDomain: u.Host, Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// FromCertificate is the identity of a workload certificate: its one URI
// SAN, which must be a SPIFFE ID. The certificate's chain is not checked
// here: the TLS handshake or the caller does that.
func FromCertificate(c *x509.Certificate) (ID, error) {
	if c == nil {
		return ID{}, errors.New("no certificate")
	}
	if len(c.URIs) != 1 {
		return ID{}, fmt.Errorf("certificate has %d URI SANs, want one SPIFFE ID", len(c.URIs))
	}
	return Parse(c.URIs[0].String())
}

// FromPeer is the identity of a gRPC call's peer: the SPIFFE ID of the
// client certificate its TLS handshake verified. ok is false when the
// peer showed no verified certificate (a plain-text port); err says why
// a verified certificate carries no SPIFFE ID.
func FromPeer(ctx context.Context) (id ID, ok bool, err error) {
	p, found := peer.FromContext(ctx)
	if !found {
		return ID{}, false, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ID{}, false, nil
	}
	id, err = FromCertificate(info.State.VerifiedChains[0][0])
	return id, true, err
}
