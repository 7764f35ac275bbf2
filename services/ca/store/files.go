// Package store keeps ca's signing material: in a directory when there is
// no cluster (this file), in a Kubernetes Secret otherwise. A plugged-in CA
// (the cacerts files an organisation's PKI hands out) wins over a
// self-signed root; a self-signed root is created once, and replicas that
// start together converge on the first one written.
package store

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

// File names of a plugged-in CA, as Istio's cacerts Secret has them.
const (
	PluggedCert  = "ca-cert.pem"
	PluggedKey   = "ca-key.pem"
	PluggedChain = "cert-chain.pem"
	PluggedRoot  = "root-cert.pem"
	// SelfSigned holds a self-signed root's certificate and key together,
	// so that it is created in one step.
	SelfSigned = "self-signed-root.pem"
	// ExtraRoots are more roots to trust, during a root rotation.
	ExtraRoots = "trust-bundle.pem"
)

// Material is what an Authority is built from.
type Material struct {
	Signer, Key, Chain, Roots []byte
	// Plugged is set when the material is a plugged-in CA.
	Plugged bool
}

// Dir loads the material in dir, creating a self-signed root of keyType
// for org when the directory has neither a plugged-in CA nor a root yet.
func Dir(dir string, keyType authority.KeyType, org string, now time.Time) (*Material, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ca state dir: %w", err)
	}
	extra, err := readOptional(filepath.Join(dir, ExtraRoots))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, PluggedCert)); err == nil {
		m := &Material{Plugged: true}
		for _, f := range []struct {
			name string
			dst  *[]byte
		}{{PluggedCert, &m.Signer}, {PluggedKey, &m.Key}, {PluggedChain, &m.Chain}, {PluggedRoot, &m.Roots}} {
			if *f.dst, err = os.ReadFile(filepath.Join(dir, f.name)); err != nil {
				return nil, fmt.Errorf("plugged-in CA: %w", err)
			}
		}
		m.Roots = append(m.Roots, extra...)
		return m, nil
	}
	path := filepath.Join(dir, SelfSigned)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if data, err = createRoot(path, keyType, org, now); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	cert, key := splitPEM(data)
	if len(cert) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("%s: want a CERTIFICATE and a PRIVATE KEY block", path)
	}
	return &Material{Signer: cert, Key: key, Roots: append(cert, extra...)}, nil
}

// createRoot writes a new root unless another replica got there first, in
// which case that one is returned: the file appears whole, by hard link,
// and only once.
func createRoot(path string, keyType authority.KeyType, org string, now time.Time) ([]byte, error) {
	cert, key, err := authority.NewRoot(keyType, org, now)
	if err != nil {
		return nil, err
	}
	data := append(cert, key...)
	tmp, err := os.CreateTemp(filepath.Dir(path), ".root-*")
	if err != nil {
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return os.ReadFile(path) // another replica's root: use it
		}
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	return data, nil
}

func readOptional(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// splitPEM separates the certificate blocks from the key block.
func splitPEM(data []byte) (certs, key []byte) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return certs, key
		}
		switch block.Type {
		case "CERTIFICATE":
			certs = append(certs, pem.EncodeToMemory(block)...)
		case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY":
			key = pem.EncodeToMemory(block)
		}
	}
}
