package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// identity writes the JWKS and the tokens, keeps its key across runs, and
// --check tells a complete directory from an incomplete one.
func TestIdentityWritesTokensAndChecksThem(t *testing.T) {
	dir, keyDir := t.TempDir(), t.TempDir()
	args := []string{"identity", "--dir", dir, "--key-file", filepath.Join(keyDir, "key.pem"), "--accounts", "a,b"}
	check := func() error {
		cmd := NewCommand(&bytes.Buffer{}, &bytes.Buffer{})
		cmd.SetArgs([]string{"identity", "--check", "--dir", dir, "--accounts", "a,b"})
		return cmd.Execute()
	}
	if err := check(); err == nil {
		t.Fatal("--check passed on an empty directory")
	}
	runFor := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		var stderr bytes.Buffer
		cmd := NewCommand(&bytes.Buffer{}, &stderr)
		cmd.SetArgs(args)
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Fatalf("identity: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stderr.String(), "service account tokens written") {
			t.Fatalf("identity logged %q", stderr.String())
		}
	}
	runFor()
	if err := check(); err != nil {
		t.Fatalf("--check after a run: %v", err)
	}
	jwks, err := os.ReadFile(filepath.Join(dir, "jwks.json"))
	if err != nil {
		t.Fatal(err)
	}
	runFor() // a restart: the same key, so the JWKS ca read stays right
	again, err := os.ReadFile(filepath.Join(dir, "jwks.json"))
	if err != nil || string(again) != string(jwks) {
		t.Fatalf("the JWKS changed across a restart: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "b.token")); err != nil {
		t.Fatal(err)
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "b.token") {
		t.Fatalf("--check with b's token missing: %v", err)
	}
}

func TestIdentityRefusesANonPositiveLifetime(t *testing.T) {
	cmd := NewCommand(&bytes.Buffer{}, &bytes.Buffer{})
	cmd.SetArgs([]string{"identity", "--dir", t.TempDir(), "--key-file", filepath.Join(t.TempDir(), "k.pem"), "--lifetime", "0s"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "positive lifetime") {
		t.Fatalf("got %v", err)
	}
}
