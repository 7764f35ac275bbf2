// Package root is the flotilla command line: the root cobra command and the
// registration of its subcommands.
package root

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/cli/kubeinject"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
)

// NewCommand returns the flotilla root command.
func NewCommand() *cobra.Command {
	info := buildinfo.Get()
	cmd := &cobra.Command{
		Use:   "flotilla",
		Short: "Operate a Flotilla service mesh",
		Long: `flotilla inspects and operates a Flotilla service mesh: the state of its
control plane services (galley, discovery, ca, injector) and of the proxies
they configure.`,
		Version:       info.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.SetVersionTemplate("flotilla {{.Version}}\n")
	cmd.AddCommand(newVersionCommand(info), kubeinject.NewCommand())
	return cmd
}

func newVersionCommand(info buildinfo.Info) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this client",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "client version: %s\n", info)
			return err
		},
	}
}

// Main runs the command line with args and returns the exit code: 0 on
// success, 1 on failure (with the error printed to stderr).
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	cmd := NewCommand()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintf(stderr, "flotilla: %v\n", err)
		return 1
	}
	return 0
}
