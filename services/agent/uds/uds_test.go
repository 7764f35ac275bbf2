package uds

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestListenReplacesAStaleSocketAndKeepsItPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "socket")
	if err := os.WriteFile(path, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := Listen(path, Private)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", st.Mode())
	}
	if _, err := net.Dial("unix", path); err != nil {
		t.Fatal(err)
	}
}

func TestASharedSocketIsUsableByThePodsOtherUsers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir", "socket")
	lis, err := Listen(path, Shared)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("shared socket mode %v (%v), want 0666", st.Mode(), err)
	}
	dir, err := os.Stat(filepath.Dir(path))
	if err != nil || dir.Mode().Perm() != 0o755 {
		t.Fatalf("its directory %v (%v), want 0755", dir.Mode(), err)
	}
}
