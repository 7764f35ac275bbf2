package capture

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// IPTables renders the plan's IPv4 rules as iptables-restore input for
// the nat table, in the canonical form iptables-save prints it back in.
func (p Plan) IPTables() string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range p.Chains() {
		b.WriteString(":" + c.IPTables() + " - [0:0]\n")
	}
	// Chain by chain, as iptables-save lists them.
	for _, c := range append([]Chain{ChainPrerouting, ChainOutput}, p.Chains()...) {
		for _, r := range p.Rules {
			if r.Chain == c && !r.ipv6() {
				b.WriteString(r.iptables() + "\n")
			}
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// IP6Tables renders ip6tables-restore input for the nat table when the
// plan captures DNS to IPv6 resolvers, else "": IPv6 traffic is
// otherwise not captured in iptables mode, so the proxy's own traffic
// passes and UDP and TCP to port 53 go to ISTIO_OUTPUT_DNS, which holds
// the IPv6 resolvers' rules.
func (p Plan) IP6Tables() string {
	var dns []Rule
	var owners []Rule
	for _, r := range p.Rules {
		switch {
		case r.ipv6():
			dns = append(dns, r)
		case r.Chain == ChainOutbound && r.Owner != nil && !r.Owner.Not && !r.OutLoopback && r.Action == Return:
			owners = append(owners, Rule{Chain: ChainOutput, Owner: r.Owner, Target: r.Target})
		}
	}
	if len(dns) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("*nat\n:" + ChainOutputDNS.IPTables() + " - [0:0]\n")
	for _, r := range owners {
		b.WriteString(r.iptables() + "\n")
	}
	for _, proto := range []Rule{{TCP: true}, {UDP: true}} {
		proto.Chain, proto.DPort, proto.Target = ChainOutput, portDNS, Target{Action: Jump, To: ChainOutputDNS}
		b.WriteString(proto.iptables() + "\n")
	}
	for _, r := range dns {
		b.WriteString(r.iptables() + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// ipv6 reports whether the rule matches IPv6 addresses only.
func (r Rule) ipv6() bool { return r.Dst.IsValid() && r.Dst.Addr().Is6() }

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

// SavedIPTables reads the nat table back (iptables-save), without
// comments and counters, for checks.
func SavedIPTables(ctx context.Context, netns string) (string, error) {
	return saved(ctx, "iptables-save", netns)
}

// SavedIP6Tables is SavedIPTables with ip6tables-save.
func SavedIP6Tables(ctx context.Context, netns string) (string, error) {
	return saved(ctx, "ip6tables-save", netns)
}

func saved(ctx context.Context, tool, netns string) (string, error) {
	args := []string{tool, "-t", "nat"}
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
