package atomicfile_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
)

func TestWriteReplacesTheContentWithThePermissions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content %q, %v", got, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

// Concurrent writers and a reader: every read is one writer's whole content.
func TestConcurrentWritersNeverShowAPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	contents := []string{strings.Repeat("a", 64<<10), strings.Repeat("b", 64<<10)}
	if err := atomicfile.Write(path, []byte(contents[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, c := range contents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if err := atomicfile.Write(path, []byte(c), 0o600); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 200 {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != contents[0] && string(got) != contents[1] {
			t.Fatalf("read %d bytes that are neither writer's content", len(got))
		}
	}
	wg.Wait()
}

func TestWriteIntoAMissingDirectoryFails(t *testing.T) {
	err := atomicfile.Write(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("got %v, want an error naming the path", err)
	}
}
