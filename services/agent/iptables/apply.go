package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Apply installs rules with one iptables-restore: the nat table is
// replaced atomically, so a failure leaves it as it was. netns, when set,
// runs it in that named network namespace (ip netns exec), for tests.
func Apply(ctx context.Context, rules, netns string) error {
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

// Saved reads the nat table back (iptables-save), without comments and
// counters, for checks.
func Saved(ctx context.Context, netns string) (string, error) {
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
