package capture

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netns creates a network namespace of the test's own and removes it when
// the test ends.
func netns(t *testing.T, tools ...string) string {
	t.Helper()
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (Debian packages iproute2, iptables and nftables; make test installs them): %v", tool, err)
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
	return ns
}

// listed is what nft (a client we did not write) reads back of the
// capture's tables in ns: the nat table, and the raw table when there.
func listed(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", NFTablesTable).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	raw, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", NFTablesRawTable).CombinedOutput()
	if err != nil {
		if !strings.Contains(string(raw), "No such file or directory") {
			t.Fatalf("nft list table: %v: %s", err, raw)
		}
		raw = nil
	}
	return string(out) + string(raw)
}

// TestIPTablesRulesApplyInANetworkNamespace installs every case with
// iptables-restore in a network namespace of its own and reads it back:
// iptables accepts the rules and keeps them exactly as generated.
func TestIPTablesRulesApplyInANetworkNamespace(t *testing.T) {
	ns := netns(t, "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save")
	ctx := context.Background()
	for name, s := range cases {
		p, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := ApplyIPTables(ctx, p.IPTables(), ns); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		checkSaved(t, name, p.IPTables(), func(table string) (string, error) { return SavedIPTables(ctx, ns, table) })
		if v6 := p.IP6Tables(); v6 != "" {
			if err := ApplyIP6Tables(ctx, v6, ns); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkSaved(t, name+" (IPv6)", v6, func(table string) (string, error) { return SavedIP6Tables(ctx, ns, table) })
		}
	}
	// A bad rule set fails and leaves the table as it was.
	before, err := SavedIPTables(ctx, ns, "nat")
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyIPTables(ctx, "*nat\n-A NO_SUCH_CHAIN -j RETURN\nCOMMIT\n", ns); err == nil {
		t.Fatal("a bad rule set was accepted")
	}
	if after, _ := SavedIPTables(ctx, ns, "nat"); after != before {
		t.Fatal("a failed restore changed the table")
	}
}

// checkSaved compares each table of restored (iptables-restore input)
// with what save reads back of it: iptables keeps the rules exactly as
// generated.
func checkSaved(t *testing.T, name, restored string, save func(table string) (string, error)) {
	t.Helper()
	// iptables-save adds the built-in chains' policies.
	builtin := map[string]string{
		"nat": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
		"raw": ":PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
	}
	for _, section := range strings.SplitAfter(restored, "COMMIT\n") {
		if section == "" {
			continue
		}
		table, _, _ := strings.Cut(strings.TrimPrefix(section, "*"), "\n")
		got, err := save(table)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Replace(section, "*"+table+"\n", "*"+table+"\n"+builtin[table], 1)
		if got != want {
			t.Fatalf("%s: table %s read back:\n%s\nwant:\n%s", name, table, got, want)
		}
	}
}

// TestNFTablesRulesApplyOverNetlinkInANetworkNamespace installs every
// case over netlink in a network namespace of its own, twice (the table
// is replaced, not added to), and compares what nft lists with the case's
// golden; each golden has the iptables golden's rules in the same order.
func TestNFTablesRulesApplyOverNetlinkInANetworkNamespace(t *testing.T) {
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			ns := netns(t, "nft")
			p, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := ApplyNFTables(p, ns); err != nil {
					t.Fatal(err)
				}
			}
			got := listed(t, ns)
			checkGolden(t, name+".nft", got)
			if n, want := strings.Count(got, "counter packets 0 bytes 0"), len(p.Rules); n != want {
				t.Fatalf("%d rules listed, want the plan's %d", n, want)
			}
		})
	}
}

// TestAFailedNFTablesTransactionLeavesTheTableAsItWas: the kernel refuses
// a batch with a jump to a chain that does not exist, and the capture
// installed before is untouched.
func TestAFailedNFTablesTransactionLeavesTheTableAsItWas(t *testing.T) {
	ns := netns(t, "nft")
	p, err := Build(cases["defaults"])
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyNFTables(p, ns); err != nil {
		t.Fatal(err)
	}
	before := listed(t, ns)
	bad := Plan{Rules: append(p.Rules, Rule{Chain: ChainOutbound, Target: Target{Action: Jump, To: Chain(99)}})}
	if err := ApplyNFTables(bad, ns); err == nil {
		t.Fatal("a jump to a chain that does not exist was accepted")
	}
	if after := listed(t, ns); after != before {
		t.Fatalf("a failed transaction changed the table:\n%s", after)
	}
	if err := ApplyNFTables(Plan{Rules: []Rule{{Chain: Chain(99)}}}, ns); err == nil || !strings.Contains(err.Error(), "unknown chain") {
		t.Fatalf("a rule in an unknown chain: %v", err)
	}
}

// TestTheNFTScriptInstallsWhatNetlinkInstalls: the dry run's script, given
// to nft -f in one namespace, and the plan programmed over netlink in
// another, list the same table.
func TestTheNFTScriptInstallsWhatNetlinkInstalls(t *testing.T) {
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			viaNetlink, viaNFT := netns(t, "nft"), netns(t, "nft")
			if err := ApplyNFTables(p, viaNetlink); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("ip", "netns", "exec", viaNFT, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(p.NFTables())
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft -f: %v: %s\nscript:\n%s", err, out, p.NFTables())
			}
			if a, b := listed(t, viaNetlink), listed(t, viaNFT); a != b {
				t.Fatalf("over netlink:\n%s\nwith nft -f:\n%s", a, b)
			}
		})
	}
}
