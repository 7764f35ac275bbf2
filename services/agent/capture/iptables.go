package capture

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
)

// IPTables renders the plan's IPv4 rules as iptables-restore input for
// the nat table (and the raw table, with DNS's conntrack zones), in the
// canonical form iptables-save prints it back in.
func (p Plan) IPTables() string {
	var b strings.Builder
	keep := func(r Rule) bool { return r.family() != 6 }
	table(&b, "nat", p.Chains(), []Chain{ChainPrerouting, ChainOutput}, p.Rules, keep)
	if raw := p.RawChains(); raw != nil {
		table(&b, "raw", raw, []Chain{ChainRawPrerouting, ChainRawOutput}, p.Rules, keep)
	}
	return b.String()
}

// IP6Tables renders ip6tables-restore input when the plan captures DNS
// to IPv6 resolvers or to any address, else "": IPv6 traffic is
// otherwise not captured in iptables mode, so here the proxy's own
// traffic passes, UDP and TCP to port 53 go to ISTIO_OUTPUT_DNS, which
// holds the IPv6 resolvers' rules (or capture-all's), and the raw table
// has the zones' rules for IPv6.
func (p Plan) IP6Tables() string {
	var nat []Rule
	for _, r := range p.Rules {
		if r.Chain == ChainOutbound && r.Owner != nil && !r.Owner.Not && !r.OutLoopback && r.Action == Return {
			nat = append(nat, Rule{Chain: ChainOutput, Owner: r.Owner, Target: r.Target})
		}
	}
	for _, proto := range []Rule{{TCP: true}, {UDP: true}} {
		proto.Chain, proto.DPort, proto.Target = ChainOutput, portDNS, Target{Action: Jump, To: ChainOutputDNS}
		nat = append(nat, proto)
	}
	dns := false
	for _, r := range p.Rules {
		if r.Chain == ChainOutputDNS && r.family() != 4 {
			nat, dns = append(nat, r), true
		}
	}
	if !dns {
		return ""
	}
	var b strings.Builder
	keep := func(r Rule) bool { return r.family() != 4 }
	table(&b, "nat", []Chain{ChainOutputDNS}, []Chain{ChainOutput}, nat, keep)
	if raw := p.RawChains(); raw != nil {
		table(&b, "raw", raw, []Chain{ChainRawPrerouting, ChainRawOutput}, p.Rules, keep)
	}
	return b.String()
}

// table writes one table's section: its own chains declared, then the
// rules kept of each chain, hooks first, chain by chain as iptables-save
// lists them.
func table(b *strings.Builder, name string, own, hooks []Chain, rules []Rule, keep func(Rule) bool) {
	b.WriteString("*" + name + "\n")
	for _, c := range own {
		b.WriteString(":" + c.IPTables() + " - [0:0]\n")
	}
	for _, c := range append(hooks, own...) {
		for _, r := range rules {
			if r.Chain == c && keep(r) {
				b.WriteString(r.iptables() + "\n")
			}
		}
	}
	b.WriteString("COMMIT\n")
}

// family is the address family the rule's addresses restrict it to: 4,
// 6, or 0 for either.
func (r Rule) family() int {
	for _, p := range []netip.Prefix{r.Src, r.Dst} {
		if p.IsValid() {
			if p.Addr().Is6() {
				return 6
			}
			return 4
		}
	}
	return 0
}

// iptables is the rule as iptables-save prints it.
func (r Rule) iptables() string {
	parts := []string{"-A", r.Chain.IPTables()}
	if r.Src.IsValid() {
		parts = append(parts, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		if r.NotDst {
			parts = append(parts, "!")
		}
		parts = append(parts, "-d", r.Dst.String())
	}
	if r.InIface != "" {
		parts = append(parts, "-i", r.InIface)
	}
	if r.OutIface != "" {
		parts = append(parts, "-o", r.OutIface)
	}
	if r.OutLoopback {
		parts = append(parts, "-o", "lo")
	}
	if proto := r.proto(); proto != "" {
		parts = append(parts, "-p", proto)
		if r.DPort != 0 {
			parts = append(parts, "-m", proto)
			if r.NotDPort {
				parts = append(parts, "!")
			}
			parts = append(parts, "--dport", strconv.Itoa(int(r.DPort)))
		}
		if r.SPort != 0 {
			parts = append(parts, "-m", proto, "--sport", strconv.Itoa(int(r.SPort)))
		}
	}
	if o := r.Owner; o != nil {
		parts = append(parts, "-m", "owner")
		if o.Not {
			parts = append(parts, "!")
		}
		flag := "--uid-owner"
		if o.Group {
			flag = "--gid-owner"
		}
		parts = append(parts, flag, strconv.FormatUint(uint64(o.ID), 10))
	}
	switch r.Action {
	case Return:
		parts = append(parts, "-j", "RETURN")
	case Jump:
		parts = append(parts, "-j", r.To.IPTables())
	case RedirectTo:
		parts = append(parts, "-j", "REDIRECT", "--to-ports", strconv.Itoa(int(r.Port)))
	case SetZone:
		parts = append(parts, "-j", "CT", "--zone", strconv.Itoa(int(r.Zone)))
	}
	return strings.Join(parts, " ")
}

// proto is the rule's protocol's name, "" for any.
func (r Rule) proto() string {
	switch {
	case r.TCP:
		return "tcp"
	case r.UDP:
		return "udp"
	}
	return ""
}

// ApplyIPTables installs rules (iptables-restore input) with one
// iptables-restore: the nat table is replaced atomically, so a failure
// leaves it as it was. netns, when set, runs it in that named network
// namespace (ip netns exec), for tests.
func ApplyIPTables(ctx context.Context, rules, netns string) error {
	return restore(ctx, "iptables-restore", rules, netns)
}

// ApplyIP6Tables is ApplyIPTables for IP6Tables, with ip6tables-restore.
func ApplyIP6Tables(ctx context.Context, rules, netns string) error {
	return restore(ctx, "ip6tables-restore", rules, netns)
}

func restore(ctx context.Context, tool, rules, netns string) error {
	args := []string{tool}
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(rules)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", tool, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// SavedIPTables reads a table back (iptables-save -t table), without
// comments and counters, for checks.
func SavedIPTables(ctx context.Context, netns, table string) (string, error) {
	return saved(ctx, "iptables-save", netns, table)
}

// SavedIP6Tables is SavedIPTables with ip6tables-save.
func SavedIP6Tables(ctx context.Context, netns, table string) (string, error) {
	return saved(ctx, "ip6tables-save", netns, table)
}

func saved(ctx context.Context, tool, netns, table string) (string, error) {
	args := []string{tool, "-t", table}
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", tool, err)
	}
	var keep []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n") + "\n", nil
}
