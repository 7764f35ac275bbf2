package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

// ServingTLS is ca's own server configuration: a certificate it issues to
// itself (id, with id's DNS names and ips), renewed on the first handshake
// after half its life, so it never needs a restart. Client certificates
// are requested, not required: a caller renewing with one is verified by
// the ClientCert authenticator against the current trust bundle.
func ServingTLS(ca func() *authority.Authority, id authority.Identity, ips []net.IP, ttl time.Duration, now func() time.Time) (*tls.Config, error) {
	s := &servingCert{ca: ca, id: id, ips: ips, ttl: ttl, now: now}
	if _, err := s.get(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequestClientCert,
		NextProtos:     []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.get() },
	}, nil
}

type servingCert struct {
	ca  func() *authority.Authority
	id  authority.Identity
	ips []net.IP
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
}

func (s *servingCert) get() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.cert != nil && now.Before(s.renewAt) {
		return s.cert, nil
	}
	ca := s.ca()
	if ca == nil {
		if s.cert != nil {
			return s.cert, nil
		}
		return nil, errUnavailable
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	issued, err := ca.IssueServing(key.Public(), s.id, s.ips, s.ttl, now)
	if err != nil {
		if s.cert != nil {
			return s.cert, nil // keep serving the current one; try again on the next handshake
		}
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	cert := &tls.Certificate{PrivateKey: key, Leaf: issued.Chain[0]}
	for _, c := range issued.Chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	leaf := issued.Chain[0]
	s.cert, s.renewAt = cert, leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore)/2)
	return cert, nil
}
