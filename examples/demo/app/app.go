// Package app is the flotilla-demo command line.
package app

import (
	"context"
	"io"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/examples/demo/client"
	"github.com/flotilla-mesh/flotilla/examples/demo/greeter"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
)

// Main runs the command and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd := NewCommand(stdout, stderr)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		return 1
	}
	return 0
}

// NewCommand returns the flotilla-demo command.
func NewCommand(stdout, stderr io.Writer) *cobra.Command {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	root := &cobra.Command{
		Use:          "flotilla-demo",
		Short:        "Flotilla's demo: greeter backends and a proxyless gRPC client routed by Flotilla",
		Version:      buildinfo.Get().String(),
		SilenceUsage: true,
	}
	root.SetVersionTemplate("flotilla-demo {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)

	var address, version string
	g := &cobra.Command{
		Use:   "greeter",
		Short: "Serve the greeter; every answer names --version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return greeter.Serve(cmd.Context(), log, address, version)
		},
	}
	g.Flags().StringVar(&address, "address", "127.0.0.1:50061", "listen address")
	g.Flags().StringVar(&version, "version", "v1", "version this backend answers with")

	o := client.Options{Out: stdout, Log: log}
	c := &cobra.Command{
		Use:   "client",
		Short: "Call --target through Flotilla (proxyless gRPC) and print the split once per --interval",
		Long: "client calls an xds:/// target with grpc-go's xDS client. The bootstrap comes from GRPC_XDS_BOOTSTRAP " +
			"(a file) or GRPC_XDS_BOOTSTRAP_CONFIG (JSON); with --discovery, its server_uri may be " +
			"\"" + client.DiscoveryScheme + ":///discovery\" to use those discovery replicas.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return client.Run(cmd.Context(), o)
		},
	}
	c.Flags().StringVar(&o.Target, "target", "xds:///greeter.demo.svc.cluster.local:50051", "xds:/// target to call")
	c.Flags().StringSliceVar(&o.Discovery, "discovery", nil, "discovery replicas (host:port) for the "+client.DiscoveryScheme+":/// server_uri")
	c.Flags().IntVar(&o.Rate, "rate", 50, "calls per second")
	c.Flags().DurationVar(&o.Interval, "interval", time.Second, "how often to print the split")
	c.Flags().DurationVar(&o.Timeout, "timeout", 5*time.Second, "deadline of each call")

	root.AddCommand(g, c)
	return root
}
