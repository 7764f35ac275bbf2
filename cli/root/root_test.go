package root

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func run(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVersionFlagAndSubcommandPrintTheBuild(t *testing.T) {
	code, out, _ := run("--version")
	if code != 0 || !strings.HasPrefix(out, "flotilla dev (commit ") {
		t.Fatalf("--version: %d %q", code, out)
	}
	code, out, _ = run("version", "--short")
	if code != 0 || !strings.HasPrefix(out, "client version: dev (commit ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestVersionSaysWhichReplicaDidNotAnswer(t *testing.T) {
	code, out, errOut := run("version", "--context-file", "", "--discovery-address", "127.0.0.1:1", "--plaintext", "--timeout", "3s")
	if code != 1 || !strings.HasPrefix(out, "client version: ") || !strings.Contains(out, "discovery 127.0.0.1:1: unavailable") || !strings.Contains(errOut, "127.0.0.1:1") {
		t.Fatalf("version with discovery away: %d %q %q", code, out, errOut)
	}
}

func TestHelpListsTheSubcommands(t *testing.T) {
	code, out, _ := run("--help")
	if code != 0 || !strings.Contains(out, "version") || !strings.Contains(out, "Usage:") {
		t.Fatalf("--help: %d %q", code, out)
	}
}

func TestUnknownCommandFailsWithAMessage(t *testing.T) {
	code, _, errOut := run("proxy-stauts")
	if code != 1 || !strings.Contains(errOut, `unknown command "proxy-stauts"`) {
		t.Fatalf("%d %q", code, errOut)
	}
}

func TestEveryCommandsHelpHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		// cobra's own help and completion commands carry their usage.
		if c.Hidden || !c.Runnable() || c.Name() == "help" || (c.Parent() != nil && c.Parent().Name() == "completion") {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%q has no examples in its --help", c.CommandPath())
		}
	}
	root := NewCommand()
	root.InitDefaultCompletionCmd()
	walk(root)
}
