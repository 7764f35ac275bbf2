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
	// Leaf is the parsed leaf certificate, nil until one is held.
	Leaf *x509.Certificate
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
		cur.ChainPEM, cur.KeyPEM, cur.Leaf = chain.Bytes(), key, leaf
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
		cur.RootsPEM = bytes.Clone(pemRoots)
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
