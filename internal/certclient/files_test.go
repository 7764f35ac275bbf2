package certclient

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func TestConfigValidateNeedsRootsAndTokenWithAnAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; empty: valid
	}{
		{name: "off", cfg: Config{}},
		{name: "off with stray files", cfg: Config{RootsFile: "r.pem"}},
		{name: "complete", cfg: Config{Address: "ca:15013", RootsFile: "r.pem", TokenFile: "t"}},
		{name: "no roots", cfg: Config{Address: "ca:15013", TokenFile: "t"}, want: "caAddress needs caRootsFile and tokenFile"},
		{name: "no token", cfg: Config{Address: "ca:15013", RootsFile: "r.pem"}, want: "caAddress needs caRootsFile and tokenFile"},
		{name: "no port", cfg: Config{Address: "ca", RootsFile: "r.pem", TokenFile: "t"}, want: `caAddress "ca"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestForServiceAsksForTheServiceNamesAndRereadsTheToken(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if c, err := (Config{}).ForService("flotilla-galley", "istio-system", "cluster.local", log); c != nil || err != nil {
		t.Fatalf("disabled ForService = %v, %v; want nil, nil", c, err)
	}
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	roots, token, junk := filepath.Join(dir, "roots.pem"), filepath.Join(dir, "token"), filepath.Join(dir, "junk.pem")
	for name, data := range map[string][]byte{roots: ca.CertPEM, token: []byte("first\n"), junk: []byte("not pem")} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := (Config{Address: "ca:1", RootsFile: junk, TokenFile: token}).ForService("s", "ns", "cluster.local", log); err == nil || !strings.Contains(err.Error(), "no PEM certificates") {
		t.Fatalf("roots without PEM: err = %v", err)
	}
	if _, err := (Config{Address: "ca:1", RootsFile: filepath.Join(dir, "missing"), TokenFile: token}).ForService("s", "ns", "cluster.local", log); err == nil {
		t.Fatal("missing roots file: no error")
	}
	c, err := (Config{Address: "flotilla-ca.istio-system.svc:15013", RootsFile: roots, TokenFile: token}).ForService("flotilla-galley", "istio-system", "cluster.local", log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(c.o.DNSNames, ","), "flotilla-galley.istio-system.svc,flotilla-galley.istio-system.svc.cluster.local"; got != want {
		t.Errorf("DNSNames = %s, want %s", got, want)
	}
	if c.o.ServerName != "flotilla-ca.istio-system.svc" {
		t.Errorf("ServerName = %q, want ca's host", c.o.ServerName)
	}
	for _, want := range []string{"first", "second"} {
		if err := os.WriteFile(token, []byte(want+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := c.o.Token(); err != nil || got != want {
			t.Fatalf("Token() = %q, %v; want %q (the projected token is re-read, whitespace trimmed)", got, err, want)
		}
	}
}
