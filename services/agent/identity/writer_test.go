package identity

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func TestTheWriterKeepsTheFilesEqualToTheHeldIdentity(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	dir := filepath.Join(t.TempDir(), "certs")
	w := &Writer{Dir: dir, State: s, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	s.SetRoots(ca.CertPEM)
	time.Sleep(50 * time.Millisecond)
	if w.Written() {
		t.Fatal("files written with roots only")
	}
	holds := func(uri string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			pair, err := tls.LoadX509KeyPair(filepath.Join(dir, ChainFile), filepath.Join(dir, KeyFile))
			if err == nil && pair.Leaf.URIs[0].String() == uri && w.Written() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the files do not hold %s: %v", uri, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		roots, err := os.ReadFile(filepath.Join(dir, RootsFile))
		if err != nil || string(roots) != string(ca.CertPEM) {
			t.Fatalf("roots file: %v", err)
		}
		st, err := os.Stat(filepath.Join(dir, KeyFile))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file mode %v (%v), want 0600", st.Mode().Perm(), err)
		}
	}
	set := func(uri string) {
		t.Helper()
		cert, err := issue(t, ca, uri).TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SetCertificate(&cert); err != nil {
			t.Fatal(err)
		}
	}
	set("spiffe://cluster.local/ns/demo/sa/first")
	holds("spiffe://cluster.local/ns/demo/sa/first")
	set("spiffe://cluster.local/ns/demo/sa/second")
	holds("spiffe://cluster.local/ns/demo/sa/second")

	// The older version goes right after the new one is in place (the
	// files above may be read in between).
	var versions []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		versions = versions[:0]
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "..") {
				versions = append(versions, e.Name())
			}
		}
		if len(versions) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("version directories %v: want the current one only", versions)
		}
	}
}

func TestTheWriterRetriesWhereItCannotWrite(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	s.SetRoots(ca.CertPEM)
	cert, err := issue(t, ca, "spiffe://cluster.local/ns/demo/sa/app").TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetCertificate(&cert); err != nil {
		t.Fatal(err)
	}
	// A directory where the data link goes makes the swap fail (EISDIR),
	// for root too.
	dir := t.TempDir()
	blocker := filepath.Join(dir, dataLink)
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	w := &Writer{Dir: dir, State: s, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	if w.Written() {
		t.Fatal("written although the swap cannot be made")
	}
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !w.Written() {
		if time.Now().After(deadline) {
			t.Fatal("not written once the directory became writable")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestTheFilesAreTheirOwnersAloneUnlessShared: outside Kubernetes the
// key, chain and roots are readable by the agent's user alone (0600), as
// Istio's agent writes them there; Shared (in a pod, for the
// application's containers, which run as users of their own) all may
// read them (0644), as Istio's does in Kubernetes.
func TestTheFilesAreTheirOwnersAloneUnlessShared(t *testing.T) {
	for shared, want := range map[bool]os.FileMode{false: 0o600, true: 0o644} {
		dir := t.TempDir()
		w := &Writer{Dir: dir, Shared: shared, Log: slog.New(slog.DiscardHandler)}
		if err := w.write(Snapshot{Version: 1, ChainPEM: []byte("chain"), KeyPEM: []byte("key"), RootsPEM: []byte("roots")}); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{ChainFile, KeyFile, RootsFile} {
			st, err := os.Stat(filepath.Join(dir, f))
			if err != nil || st.Mode().Perm() != want {
				t.Errorf("shared %v: %s mode %v (%v), want %v", shared, f, st.Mode().Perm(), err, want)
			}
		}
	}
}
