package capture

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// IPTables renders the plan as iptables-restore input for the nat table,
// in the canonical form iptables-save prints it back in.
func (p Plan) IPTables() string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range Chains() {
		b.WriteString(":" + c.IPTables() + " - [0:0]\n")
	}
	for _, r := range p.Rules {
		b.WriteString(r.iptables() + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
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
	if r.TCP {
		parts = append(parts, "-p", "tcp")
		if r.DPort != 0 {
			parts = append(parts, "-m", "tcp", "--dport", strconv.Itoa(int(r.DPort)))
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

// ApplyIPTables installs rules (iptables-restore input) with one
// iptables-restore: the nat table is replaced atomically, so a failure
// leaves it as it was. netns, when set, runs it in that named network
// namespace (ip netns exec), for tests.
func ApplyIPTables(ctx context.Context, rules, netns string) error {
	args := []string{"iptables-restore"}
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(rules)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("iptables-restore: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// SavedIPTables reads the nat table back (iptables-save), without
// comments and counters, for checks.
func SavedIPTables(ctx context.Context, netns string) (string, error) {
	args := []string{"iptables-save", "-t", "nat"}
	if netns != "" {
		args = append([]string{"ip", "netns", "exec", netns}, args...)
	}
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		return "", fmt.Errorf("iptables-save: %w", err)
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
