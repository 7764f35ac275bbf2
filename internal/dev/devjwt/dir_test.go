package devjwt_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
)

// The key survives a restart: the issuer loaded again signs with it, so
// the JWKS ca read before still verifies new tokens.
func TestLoadOrCreateKeepsTheKey(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "issuer-key.pem")
	first, err := devjwt.LoadOrCreate("iss", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(keyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v, %v: want 0600", st, err)
	}
	again, err := devjwt.LoadOrCreate("iss", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := first.JWKS()
	b, _ := again.JWKS()
	if string(a) != string(b) {
		t.Fatalf("the reloaded issuer has another key:\n%s\n%s", a, b)
	}
	other, _ := devjwt.New("iss")
	c, _ := other.JWKS()
	if string(a) == string(c) {
		t.Fatal("two new issuers share a key")
	}
}

func TestLoadOrCreateRefusesWhatIsNotItsKey(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"garbage": "not a key",
		"cert":    "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
		"bad-der": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"empty":   "",
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := devjwt.LoadOrCreate("iss", path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: got %v, want an error naming the file", name, err)
		}
	}
	if _, err := devjwt.LoadOrCreate("iss", filepath.Join(dir, "missing", "key.pem")); err == nil {
		t.Error("a key file in a missing directory")
	}
}

// Write puts the JWKS and a token per account; Refresh replaces the tokens
// before they end.
func TestDirWritesAndRefreshesTokens(t *testing.T) {
	iss, err := devjwt.New("iss")
	if err != nil {
		t.Fatal(err)
	}
	d := &devjwt.Dir{
		Path: filepath.Join(t.TempDir(), "identity"), Issuer: iss, Namespace: "istio-system", Audience: "istio-ca",
		Accounts: []string{"flotilla-galley", "flotilla-discovery"}, Lifetime: 90 * time.Millisecond,
	}
	if err := d.Write(time.Now()); err != nil {
		t.Fatal(err)
	}
	jwks, err := os.ReadFile(d.JWKSFile())
	if want, _ := iss.JWKS(); err != nil || string(jwks) != string(want) {
		t.Fatalf("jwks.json %q, %v", jwks, err)
	}
	first := map[string]string{}
	for _, a := range d.Accounts {
		tok, err := os.ReadFile(d.TokenFile(a))
		if err != nil || strings.Count(string(tok), ".") != 2 {
			t.Fatalf("%s: %q, %v", a, tok, err)
		}
		if st, _ := os.Stat(d.TokenFile(a)); st.Mode().Perm() != 0o600 {
			t.Errorf("%s token mode %v, want 0600", a, st.Mode())
		}
		first[a] = string(tok)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Refresh(ctx, slog.New(slog.DiscardHandler)); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range d.Accounts {
		for {
			tok, err := os.ReadFile(d.TokenFile(a))
			if err == nil && string(tok) != first[a] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's token was never replaced", a)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cancel()
	<-done
}

func TestDirWriteFailsWithABadAccount(t *testing.T) {
	iss, _ := devjwt.New("iss")
	d := &devjwt.Dir{Path: t.TempDir(), Issuer: iss, Namespace: "ns", Audience: "aud", Accounts: []string{""}, Lifetime: time.Hour}
	if err := d.Write(time.Now()); err == nil {
		t.Fatal("a token for an account without a name")
	}
}

// A Dir without a lifetime (the JWKS only) has nothing to refresh: Refresh
// waits for the end instead of ticking.
func TestRefreshWithoutALifetimeWaitsForTheEnd(t *testing.T) {
	iss, _ := devjwt.New("iss")
	d := &devjwt.Dir{Path: t.TempDir(), Issuer: iss}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Refresh(ctx, slog.New(slog.DiscardHandler)); close(done) }()
	select {
	case <-done:
		t.Fatal("Refresh returned before its context ended")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}
