package connect

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

func resolveWith(t *testing.T, contextFile string, args ...string) (Context, error) {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(append([]string{"--context-file", contextFile}, args...)); err != nil {
		t.Fatal(err)
	}
	return o.resolve()
}

func TestFlagsOverrideTheContextFileWhichOverridesTheDefaults(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(dir, "local.yaml")
	if err := debugapi.WriteContext(local, debugapi.Context{DiscoveryAddresses: []string{"127.0.0.1:16010", "127.0.0.1:16110"}, Plaintext: true}); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		file  string
		args  []string
		addrs []string
		plain bool
	}{
		"nothing said: make run's first replica": {file: empty, addrs: []string{debugapi.DefaultDiscoveryAddress}, plain: true},
		"the context file":                       {file: local, addrs: []string{"127.0.0.1:16010", "127.0.0.1:16110"}, plain: true},
		"addresses from the flags":               {file: local, args: []string{"--discovery-address", "10.0.0.1:15010,10.0.0.2:15010"}, addrs: []string{"10.0.0.1:15010", "10.0.0.2:15010"}, plain: true},
		"mTLS from the flags": {
			file: local, args: []string{"--plaintext=false", "--cert", "c", "--key", "k", "--cacert", "r"},
			addrs: []string{"127.0.0.1:16010", "127.0.0.1:16110"},
		},
	} {
		c, err := resolveWith(t, tc.file, tc.args...)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !slices.Equal(c.DiscoveryAddresses, tc.addrs) || c.Plaintext != tc.plain || c.SystemNamespace != "istio-system" {
			t.Errorf("%s: %+v", name, c)
		}
	}
}

func TestIncompleteCredentialsAreRefusedWithTheFlagsToGive(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("discoveryAdresses: [x]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		file string
		args []string
		want string
	}{
		"a misspelt context field": {file: bad, want: "field discoveryAdresses not found"},
		"no context file":          {file: filepath.Join(dir, "absent.yaml"), want: "context file"},
		"mTLS without credentials": {args: []string{"--discovery-address", "10.0.0.1:15012"}, want: "wants a client certificate"},
		"a certificate alone":      {args: []string{"--discovery-address", "a:1", "--cert", "c"}, want: "--cert needs --key and --cacert"},
		"ca without a token":       {args: []string{"--discovery-address", "a:1", "--ca-address", "ca:1", "--cacert", "r"}, want: "--ca-address needs --token-file"},
		"two certificates":         {args: []string{"--discovery-address", "a:1", "--cert", "c", "--ca-address", "ca:1"}, want: "choose one"},
	} {
		file := tc.file
		if file == "" {
			file = filepath.Join(dir, "empty.yaml")
			_ = os.WriteFile(file, nil, 0o600)
		}
		if _, err := resolveWith(t, file, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

func TestAnAddressIsKeptUnlessItsNameResolvesToSeveralReplicas(t *testing.T) {
	// A name resolving to several non-loopback addresses (compose's
	// replicas) is expanded; the compose test shows it.
	in := []string{"127.0.0.1:15010", "localhost:15010", "replica.invalid:15012", "not an address"}
	if got := everyAddress(t.Context(), in); !slices.Equal(got, in) {
		t.Fatalf("everyAddress(%q) = %q, want them kept", in, got)
	}
}
