// Package root is the flotilla command line: the root cobra command and the
// registration of its subcommands.
package root

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
	"github.com/flotilla-mesh/flotilla/cli/bugreport"
	"github.com/flotilla-mesh/flotilla/cli/check"
	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/cli/experimental"
	"github.com/flotilla-mesh/flotilla/cli/kubeinject"
	"github.com/flotilla-mesh/flotilla/cli/proxyconfig"
	"github.com/flotilla-mesh/flotilla/cli/proxystatus"
	"github.com/flotilla-mesh/flotilla/cli/tag"
	"github.com/flotilla-mesh/flotilla/cli/token"
	"github.com/flotilla-mesh/flotilla/cli/wait"
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
	conn := &connect.Options{}
	conn.AddFlags(cmd.PersistentFlags())
	cmd.AddCommand(newVersionCommand(info, conn), analyze.NewCommand(conn), check.NewCommand(conn), kubeinject.NewCommand(), proxystatus.NewCommand(conn), proxyconfig.NewCommand(conn), token.NewCommand(), wait.NewCommand(conn), experimental.NewCommand(conn), tag.NewCommand(conn), bugreport.NewCommand(conn))
	return cmd
}

func newVersionCommand(info buildinfo.Info, conn *connect.Options) *cobra.Command {
	var short bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of this client, of each control-plane service and replica, and of the proxies",
		Long: `version prints this client's version and, unless --short, each discovery replica's (as it names
itself in its debug answers) with the versions of the proxies each serves, counted, and galley's
and each injector's (as their subscriptions to galley say) where the CLI knows galley's address, and
ca's (the replica that issued the CLI's certificate, when it got one from ca). A service that does
not answer is shown with its error.`,
		Example: `  flotilla version
  flotilla version --short`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			if _, err := fmt.Fprintf(w, "client version: %s\n", info); err != nil || short {
				return err
			}
			err := proxystatus.PrintVersions(cmd.Context(), w, conn)
			if conn.GalleyKnown() {
				err = errors.Join(err, printGalleyVersion(cmd.Context(), w, conn))
			}
			if r, ok := conn.CA(); ok {
				if _, werr := fmt.Fprintf(w, "ca version: %s (replica %s, which issued this client's certificate)\n", cmp.Or(r.Info.Version, "unknown"), cmp.Or(r.ID, "unnamed")); werr != nil {
					err = errors.Join(err, werr)
				}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&short, "short", false, "the client's version only")
	return cmd
}

// printGalleyVersion asks galley for its subscribers: its answer names
// galley's replica and version, and each injector's version comes with
// its subscription (discovery replicas say theirs themselves).
func printGalleyVersion(ctx context.Context, w io.Writer, conn *connect.Options) error {
	r, subs, err := conn.GalleySubscribers(ctx)
	if err != nil {
		_, _ = fmt.Fprintf(w, "galley: unavailable: %v\n", err)
		return fmt.Errorf("galley: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "galley version: %s (replica %s)\n", cmp.Or(r.Info.Version, "unknown"), cmp.Or(r.ID, "unnamed"))
	for _, s := range subs {
		if name, ok := strings.CutPrefix(s.ID, "injector~"); ok {
			fmt.Fprintf(&b, "injector version: %s (replica %s, subscribed to galley)\n", cmp.Or(s.Version, "unknown"), name)
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// Main runs the command line with args and returns the exit code (see
// Execute).
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	return Execute(ctx, NewCommand(), args, stdout, stderr)
}

// Execute runs cmd with args and returns the exit code: 0 on success,
// else the error's ExitCode() when it has one (analyze's 79), else 1; the
// error is printed to stderr.
func Execute(ctx context.Context, cmd *cobra.Command, args []string, stdout, stderr io.Writer) int {
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintf(stderr, "flotilla: %v\n", err)
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}
