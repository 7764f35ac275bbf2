// Package tlsreload serves TLS from certificate files that change under a
// running process: Kubernetes Secret volumes and cert rotators replace them in
// place. New handshakes use the new files as soon as they are complete and
// valid; a bad or half-written update is logged and the last good material
// stays in use.
package tlsreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/fswatch"
)

// Files names the PEM files of a TLS identity.
type Files struct {
	// CertFile is the certificate chain, leaf first.
	CertFile string `yaml:"certFile" usage:"PEM certificate chain, leaf first"`
	// KeyFile is the private key of the leaf.
	KeyFile string `yaml:"keyFile" usage:"PEM private key"`
	// CAFile holds the roots that peer certificates must chain to. For a
	// server it turns on mutual TLS: clients must present a certificate.
	CAFile string `yaml:"caFile" usage:"PEM roots the peer's certificate must chain to (a server then requires client certificates: mTLS)"`
}

// Enabled reports whether any file is set.
func (f Files) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" || f.CAFile != "" }

// Validate checks that cert and key come together.
func (f Files) Validate() error {
	if !f.Enabled() {
		return nil
	}
	if f.CertFile == "" || f.KeyFile == "" {
		return errors.New("tls: certFile and keyFile must both be set")
	}
	return nil
}

type material struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

// Reloader holds the current TLS material and replaces it when the files
// change. It is safe for concurrent use.
type Reloader struct {
	files   Files
	log     *slog.Logger
	current atomic.Pointer[material]
	// reloaded is signalled after every reload attempt, for tests.
	reloaded chan error
}

// New loads the files once; an error here means the service cannot start.
func New(files Files, log *slog.Logger) (*Reloader, error) {
	if err := files.Validate(); err != nil {
		return nil, err
	}
	r := &Reloader{files: files, log: log}
	m, err := load(files)
	if err != nil {
		return nil, err
	}
	r.current.Store(m)
	return r, nil
}

func load(f Files) (*material, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load key pair %s, %s: %w", f.CertFile, f.KeyFile, err)
	}
	m := &material{cert: &cert}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificates", f.CAFile)
		}
		m.roots = pool
	}
	return m, nil
}

// Reload reads the files again. On error the previous material is kept.
func (r *Reloader) Reload() error {
	m, err := load(r.files)
	if err != nil {
		r.log.Error("tls reload failed; keeping the previous certificate", "error", err)
		return err
	}
	r.current.Store(m)
	if leaf, perr := x509.ParseCertificate(m.cert.Certificate[0]); perr == nil {
		r.log.Info("tls certificate loaded", "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	}
	return nil
}

// ServerConfig returns a server TLS configuration that always uses the
// current material. With a CA file, clients must present a certificate that
// chains to it.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := r.current.Load()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				NextProtos:   []string{"h2", "http/1.1"},
			}
			if m.roots != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = m.roots
			}
			return c, nil
		},
	}
}

// ClientConfig returns a client TLS configuration that presents the
// current certificate and verifies the server (named serverName, a DNS
// name or IP) against the current roots, so both rotate without a
// restart. The CA file is required.
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.current.Load().cert, nil
		},
		// Verified in VerifyConnection against the roots current at the
		// time of the handshake; the static RootCAs could not rotate.
		InsecureSkipVerify: true, //nolint:gosec // see VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			m := r.current.Load()
			if m.roots == nil {
				return errors.New("tls: no caFile to verify the server against")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("tls: the server presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: m.roots, DNSName: serverName, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("tls: server certificate: %w", err)
			}
			return nil
		},
	}
}

// Run watches the files' directories and reloads on any change until ctx is
// cancelled. Directories, not files, are watched: Secret volumes swap a
// symlinked directory, which a watch on the file itself would miss. Bursts of
// events are coalesced.
func (r *Reloader) Run(ctx context.Context) error {
	dirs := map[string]bool{}
	names := map[string]bool{}
	for _, f := range []string{r.files.CertFile, r.files.KeyFile, r.files.CAFile} {
		if f != "" {
			dirs[filepath.Dir(f)] = true
			names[filepath.Base(f)] = true
		}
	}
	return fswatch.Run(ctx, fswatch.Options{
		Dirs:     slices.Collect(maps.Keys(dirs)),
		Debounce: 100 * time.Millisecond,
		Log:      r.log,
		// The files themselves, and the "..data" link (and the
		// timestamped directories behind it) a Secret volume swaps;
		// other files in the directory are not ours.
		Relevant: func(path string) bool {
			base := filepath.Base(path)
			return names[base] || strings.HasPrefix(base, "..")
		},
		OnChange: func() error {
			err := r.Reload() // a failed reload keeps the old material and is logged
			if r.reloaded != nil {
				r.reloaded <- err
			}
			return nil
		},
	})
}
