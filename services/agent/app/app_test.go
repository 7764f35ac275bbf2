package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/services/agent/iptables"
)

func TestIptablesDryRunPrintsTheRulesForTheFlags(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"iptables", "--dry-run", "--exclude-outbound-ports", "3306,5432", "--exclude-outbound-ip-ranges", "169.254.169.254/32", "--inbound-ports", "8080"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	want, err := iptables.Rules(iptables.Settings{
		ExcludeOutboundPorts: []uint16{3306, 5432}, ExcludeOutboundIPRanges: []string{"169.254.169.254/32"},
		InboundPorts: []uint16{8080}, IncludeOutboundIPRanges: []string{"*"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestIptablesRefusesBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"70000 is not a port":       {"iptables", "--dry-run", "--exclude-outbound-ports", "70000"},
		`"nope" is not an IP range`: {"iptables", "--dry-run", "--exclude-outbound-ip-ranges", "nope"},
		"0 is not a port":           {"iptables", "--dry-run", "--inbound-ports", "0"},
	} {
		cmd := NewCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want an error saying %q", args, err, want)
		}
	}
}
