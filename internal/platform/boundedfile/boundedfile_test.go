package boundedfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadReturnsAFileUpToTheLimitAndRefusesMore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(path, 5); err != nil || string(got) != "12345" {
		t.Fatalf("Read at the limit = %q, %v", got, err)
	}
	if _, err := Read(path, 4); err == nil || !strings.Contains(err.Error(), "larger than 4 bytes") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Read over the limit: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), 5); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := Read(dir, 5); err == nil {
		t.Fatal("a directory was read")
	}
}
