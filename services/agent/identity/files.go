package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/boundedfile"
)

// The files of Istio's certificate directories: read from CertsDir in
// file-mounted mode, written by Writer for proxyless applications.
const (
	CertsDir      = "/etc/certs"
	ChainFile     = "cert-chain.pem"
	KeyFile       = "key.pem"
	RootsFile     = "root-cert.pem"
	maxFileBytes  = 1 << 20
	defaultPeriod = 5 * time.Second
)

// Mounted reports whether dir holds the three files of Istio's
// file-mounted mode, none empty; the agent then serves them instead of
// asking ca.
func Mounted(dir string) bool {
	for _, f := range []string{ChainFile, KeyFile, RootsFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			return false
		}
	}
	return true
}

// WatchRoots keeps s's roots equal to the PEM bundle at path (the
// istio-ca-root-cert ConfigMap, mounted: the kubelet replaces it in place
// when the ConfigMap changes), reading it now and every period (default
// 5 s). A file that holds no certificate is refused, logged once, and the
// last good bundle kept. It returns when ctx ends.
func WatchRoots(ctx context.Context, s *State, path string, period time.Duration, log *slog.Logger) error {
	var last []byte
	var lastErr string
	return poll(ctx, period, func() {
		data, err := readPEMBundle(path)
		if err != nil {
			if err.Error() != lastErr {
				log.Warn("the trust bundle cannot be read; keeping the last good one", "path", path, "error", err)
				lastErr = err.Error()
			}
			return
		}
		lastErr = ""
		if !bytes.Equal(data, last) {
			last = data
			s.SetRoots(data)
			log.Info("trust bundle loaded", "path", path)
		}
	})
}

// WatchMounted serves Istio's file-mounted certificates from dir: the
// chain, key and roots are read now and every period (default 5 s), and a
// change is held once the chain and key make a valid pair; a broken or
// half-written set is logged and the last good one kept.
func WatchMounted(ctx context.Context, s *State, dir string, period time.Duration, log *slog.Logger) error {
	var lastChain, lastKey []byte
	var lastErr string
	rootsPath := filepath.Join(dir, RootsFile)
	return poll(ctx, period, func() {
		chain, errC := boundedfile.Read(filepath.Join(dir, ChainFile), maxFileBytes)
		key, errK := boundedfile.Read(filepath.Join(dir, KeyFile), maxFileBytes)
		roots, errR := readPEMBundle(rootsPath)
		err := errors.Join(errC, errK, errR)
		var cert tls.Certificate
		if err == nil {
			cert, err = tls.X509KeyPair(chain, key)
		}
		if err != nil {
			if err.Error() != lastErr {
				log.Warn("the mounted certificates cannot be used; keeping the last good ones", "dir", dir, "error", err)
				lastErr = err.Error()
			}
			return
		}
		lastErr = ""
		s.SetRoots(roots)
		if bytes.Equal(chain, lastChain) && bytes.Equal(key, lastKey) {
			return
		}
		if err := s.SetCertificate(&cert); err != nil {
			log.Warn("the mounted certificate cannot be used", "dir", dir, "error", err)
			return
		}
		lastChain, lastKey = chain, key
		log.Info("mounted certificate loaded", "dir", dir, "not_after", cert.Leaf.NotAfter)
	})
}

func poll(ctx context.Context, period time.Duration, f func()) error {
	if period <= 0 {
		period = defaultPeriod
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// readPEMBundle reads a PEM file that must hold at least one certificate.
func readPEMBundle(path string) ([]byte, error) {
	data, err := boundedfile.Read(path, maxFileBytes)
	if err != nil {
		return nil, err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return data, nil
}
