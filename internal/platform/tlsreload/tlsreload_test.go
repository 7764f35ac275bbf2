package tlsreload

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

type fixture struct {
	ca     *testpki.CA
	dir    string
	files  Files
	client tls.Certificate
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := testpki.NewCA("root")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca, dir: t.TempDir()}
	f.files.CAFile = filepath.Join(f.dir, "ca.pem")
	if err := os.WriteFile(f.files.CAFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	f.rotate(t)
	cl, err := ca.Issue(testpki.Request{CommonName: "client"})
	if err != nil {
		t.Fatal(err)
	}
	if f.client, err = cl.TLSCertificate(); err != nil {
		t.Fatal(err)
	}
	return f
}

// rotate writes a fresh server certificate and returns its serial.
func (f *fixture) rotate(t *testing.T) string {
	t.Helper()
	leaf, err := f.ca.Issue(testpki.Request{CommonName: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if f.files.CertFile, f.files.KeyFile, err = leaf.WriteFiles(f.dir); err != nil {
		t.Fatal(err)
	}
	return leaf.Cert.SerialNumber.String()
}

// serve starts a TLS listener answering each connection's handshake.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Write([]byte("x"))
			}()
		}
	}()
	return lis.Addr().String()
}

// servedSerial connects as a client and returns the server's serial.
func (f *fixture) servedSerial(t *testing.T, addr string, withCert bool) (string, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: f.ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{f.client}
	}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// TLS 1.3 reports a rejected client certificate on the first read.
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func TestClientWithoutCertificateIsRejectedWhenCAFileIsSet(t *testing.T) {
	f := newFixture(t)
	r, err := New(f.files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.ServerConfig())
	if _, err := f.servedSerial(t, addr, false); err == nil {
		t.Fatal("handshake without a client certificate succeeded")
	}
	if _, err := f.servedSerial(t, addr, true); err != nil {
		t.Fatalf("handshake with a client certificate: %v", err)
	}
}

func TestRotatedFilesAreServedWithoutRestart(t *testing.T) {
	f := newFixture(t)
	r, err := New(f.files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	r.reloaded = make(chan error, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	addr := serve(t, r.ServerConfig())
	first, err := f.servedSerial(t, addr, true)
	if err != nil {
		t.Fatal(err)
	}

	time.Sleep(50 * time.Millisecond) // let the watcher start
	second := f.rotate(t)
	waitReload(t, r, false)
	got, err := f.servedSerial(t, addr, true)
	if err != nil {
		t.Fatal(err)
	}
	if got == first || got != second {
		t.Fatalf("served serial %s after rotation, want %s (was %s)", got, second, first)
	}

	// A broken update keeps the last good certificate.
	if err := atomicfile.Write(f.files.CertFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitReload(t, r, true)
	got, err = f.servedSerial(t, addr, true)
	if err != nil {
		t.Fatal(err)
	}
	if got != second {
		t.Fatalf("served serial %s after a broken update, want the last good %s", got, second)
	}
}

// waitReload waits for a reload attempt that failed (wantErr) or succeeded.
func waitReload(t *testing.T, r *Reloader, wantErr bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-r.reloaded:
			if (err != nil) == wantErr {
				return
			}
		case <-deadline:
			t.Fatal("no reload within 10s")
		}
	}
}

func TestNewFailsOnMissingOrMismatchedFiles(t *testing.T) {
	f := newFixture(t)
	for name, files := range map[string]Files{
		"cert without key": {CertFile: f.files.CertFile},
		"missing file":     {CertFile: filepath.Join(f.dir, "nope.pem"), KeyFile: f.files.KeyFile},
		"key for cert":     {CertFile: f.files.CAFile, KeyFile: f.files.KeyFile},
		"ca not pem":       {CertFile: f.files.CertFile, KeyFile: f.files.KeyFile, CAFile: f.files.KeyFile},
	} {
		if _, err := New(files, quiet()); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestClientConfigPresentsItsCertificateAndVerifiesTheServer(t *testing.T) {
	f := newFixture(t)
	server, err := New(f.files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, server.ServerConfig())
	// The client uses the same CA; its own identity is the server's files
	// here, which is enough to show it is presented (the server requires
	// one).
	client, err := New(f.files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	dial := func(name string) error {
		c, err := tls.Dial("tcp", addr, client.ClientConfig(name))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
		return err
	}
	if err := dial("127.0.0.1"); err != nil {
		t.Fatalf("mutual handshake: %v", err)
	}
	if err := dial("galley.example.com"); err == nil {
		t.Fatal("a server certificate for another name was accepted")
	}
	other, err := testpki.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.files.CAFile, other.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := client.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := dial("127.0.0.1"); err == nil {
		t.Fatal("after the roots rotated to another CA, the old server was still trusted")
	}
}

// TestWritesToOtherFilesInTheDirectoryReloadNothing: the certificate
// directory also holds files that are not ours (a log, a lock); writing
// them does not reload the certificate (galley was seen reloading 121
// times in 12 s).
func TestWritesToOtherFilesInTheDirectoryReloadNothing(t *testing.T) {
	f := newFixture(t)
	r, err := New(f.files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	r.reloaded = make(chan error, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	time.Sleep(50 * time.Millisecond) // let the watcher start
	other := filepath.Join(filepath.Dir(f.files.CertFile), "unrelated.log")
	for i := range 20 {
		if err := os.WriteFile(other, []byte(strings.Repeat("x", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-r.reloaded:
		t.Fatalf("a write to another file reloaded the certificate (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	f.rotate(t)
	waitReload(t, r, false)
}
