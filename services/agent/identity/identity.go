// Package identity is the workload's identity as the agent holds it: the
// certificate chain and private key (from ca, or from files mounted at
// /etc/certs), and the mesh's trust bundle, with a version that changes
// whenever any of them does. Readers (the SDS server's streams, the
// proxyless bootstrap's files) take a Snapshot and wait on Changed for
// the next one; the private key never leaves the process except to the
// pod's own proxy.
package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
)

// Snapshot is the identity at one moment. Its slices are never changed.
type Snapshot struct {
	// Version increases with every change.
	Version uint64
	// ChainPEM is the certificate chain, leaf first, without the root;
	// KeyPEM its private key (PKCS#8). Both are nil until a certificate is
	// held.
	ChainPEM, KeyPEM []byte
	// RootsPEM is the trust bundle; nil until known.
	RootsPEM []byte
	// Leaf is the parsed leaf certificate, nil until one is held; Cert the
	// certificate with its key, for TLS.
	Leaf *x509.Certificate
	Cert *tls.Certificate
	// Roots is RootsPEM parsed.
	Roots *x509.CertPool
}

// Wait blocks until both a certificate and roots are held (true) or ctx
// ends (false).
func (s *State) Wait(ctx context.Context) (Snapshot, bool) {
	for {
		changed := s.Changed()
		if snap := s.Snapshot(); snap.Ready() {
			return snap, true
		}
		select {
		case <-ctx.Done():
			return Snapshot{}, false
		case <-changed:
		}
	}
}

// ClientTLS is a TLS client configuration that presents the current
// certificate and checks the server's against the current roots and
// serverName (a DNS name of its certificate), both read at each
// handshake, so rotations need no new configuration.
func (s *State) ClientTLS(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, against the roots held at the handshake.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection checks the chain and the name
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			roots := s.Snapshot().Roots
			if roots == nil {
				return errors.New("no trust bundle yet")
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: serverName, Roots: roots, Intermediates: inter})
			return err
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := s.Snapshot().Cert; c != nil {
				return c, nil
			}
			return nil, errors.New("no workload certificate yet")
		},
	}
}

// Ready reports whether both a certificate and roots are held.
func (s Snapshot) Ready() bool { return s.Leaf != nil && len(s.RootsPEM) > 0 }

// State holds the current snapshot. The zero value is not usable; use New.
type State struct {
	mu      sync.Mutex
	cur     Snapshot
	changed chan struct{}
}

// New returns an empty state.
func New() *State { return &State{changed: make(chan struct{})} }

// Snapshot returns the current identity.
func (s *State) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Changed is closed at the next change after it is called; take a
// Snapshot after it fires.
func (s *State) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// SetCertificate holds a new certificate (its chain and key encoded once
// here), as certclient's OnCertificate hands it over.
func (s *State) SetCertificate(cert *tls.Certificate) error {
	if cert == nil || len(cert.Certificate) == 0 {
		return errors.New("no certificate")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("leaf: %w", err)
		}
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return fmt.Errorf("private key: %w", err)
	}
	var chain bytes.Buffer
	for _, c := range cert.Certificate {
		_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	key := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	s.update(func(cur *Snapshot) bool {
		c := *cert
		c.Leaf = leaf
		cur.ChainPEM, cur.KeyPEM, cur.Leaf, cur.Cert = chain.Bytes(), key, leaf, &c
		return true
	})
	return nil
}

// SetRoots holds a trust bundle; the same bytes again change nothing.
func (s *State) SetRoots(pemRoots []byte) {
	s.update(func(cur *Snapshot) bool {
		if bytes.Equal(cur.RootsPEM, pemRoots) {
			return false
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pemRoots)
		cur.RootsPEM, cur.Roots = bytes.Clone(pemRoots), pool
		return true
	})
}

func (s *State) update(f func(*Snapshot) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.cur
	if !f(&next) {
		return
	}
	next.Version++
	s.cur = next
	close(s.changed)
	s.changed = make(chan struct{})
}
