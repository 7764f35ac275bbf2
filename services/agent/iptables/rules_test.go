package iptables

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

var cases = map[string]Settings{
	"defaults": {IncludeOutboundIPRanges: []string{"*"}},
	// Istio's includeOutboundIPRanges: "" — inbound only.
	"no-outbound-capture": {},
	"include-and-exclude": {
		IncludeOutboundIPRanges: []string{"10.96.0.0/12, 10.0.0.0/8"},
		ExcludeOutboundIPRanges: []string{"10.96.0.1", "169.254.169.254/32"},
		ExcludeOutboundPorts:    []uint16{3306, 5432, 3306},
		ExcludeInboundPorts:     []uint16{9999},
	},
	"listed-inbound-ports": {
		InboundPorts:            []uint16{8080, 9090, 15090},
		IncludeOutboundIPRanges: []string{"*"},
		ExcludeOutboundPorts:    []uint16{53},
		ProxyUID:                1000, ProxyGID: 1001,
		InboundPort: 16006, OutboundPort: 16001,
	},
	"no-outbound-capture-of-a-range": {
		IncludeOutboundIPRanges: []string{"*"},
		ExcludeOutboundIPRanges: []string{"192.168.0.0/16"},
	},
}

func TestRulesGoldens(t *testing.T) {
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Rules(s)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Rules(s)
			if again != got {
				t.Fatal("two runs differ")
			}
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if got != string(want) {
				t.Fatalf("rules differ from %s; got:\n%s", path, got)
			}
		})
	}
}

func TestBadRangesAreRefused(t *testing.T) {
	for _, s := range []Settings{
		{IncludeOutboundIPRanges: []string{"10.0.0.0/33"}},
		{ExcludeOutboundIPRanges: []string{"not-an-ip"}},
		{ExcludeOutboundIPRanges: []string{"*"}},
		{IncludeOutboundIPRanges: []string{"fd00::/8"}},
	} {
		if _, err := Rules(s); err == nil {
			t.Errorf("%+v: accepted", s)
		}
	}
}

// TestRulesApplyInANetworkNamespace installs every golden's rules in a
// network namespace of its own and reads them back: iptables accepts them
// and keeps them exactly as generated.
func TestRulesApplyInANetworkNamespace(t *testing.T) {
	for _, tool := range []string{"ip", "iptables-restore", "iptables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (Debian packages iproute2 and iptables; make test installs them): %v", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root (the tests run as root here and in CI)")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "flotilla-test-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ctx := context.Background()
	for name, s := range cases {
		rules, err := Rules(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(ctx, rules, ns); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		saved, err := Saved(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		// iptables-save adds the built-in chains' policies.
		want := strings.Replace(rules, "*nat\n", "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n", 1)
		if saved != want {
			t.Fatalf("%s: read back:\n%s\nwant:\n%s", name, saved, want)
		}
	}
	// A bad rule set fails and leaves the table as it was.
	before, err := Saved(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, "*nat\n-A NO_SUCH_CHAIN -j RETURN\nCOMMIT\n", ns); err == nil {
		t.Fatal("a bad rule set was accepted")
	}
	if after, _ := Saved(ctx, ns); after != before {
		t.Fatal("a failed restore changed the table")
	}
}
