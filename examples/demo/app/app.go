// Package app is the flotilla-demo command line.
package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/examples/demo/client"
	"github.com/flotilla-mesh/flotilla/examples/demo/greeter"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
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

	gopts := greeter.Options{Log: log}
	g := &cobra.Command{
		Use:   "greeter",
		Short: "Serve the greeter; every answer names --version and the caller's mesh identity",
		Long: "greeter serves grpc-go's TestService. With --xds it is an xDS-enabled gRPC server: its listener and mTLS come from discovery " +
			"through the bootstrap in GRPC_XDS_BOOTSTRAP (which the agent writes in proxyless mode), and the port serves once discovery has sent them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return greeter.Serve(cmd.Context(), gopts)
		},
	}
	g.Flags().StringVar(&gopts.Address, "address", "127.0.0.1:50061", "listen address")
	g.Flags().StringVar(&gopts.Version, "version", "v1", "version this backend answers with")
	g.Flags().BoolVar(&gopts.XDS, "xds", false, "serve as an xDS-enabled gRPC server (listener and mTLS from discovery; needs GRPC_XDS_BOOTSTRAP)")

	o := client.Options{Out: stdout, Log: log}
	c := &cobra.Command{
		Use:   "client",
		Short: "Call --target through Flotilla (proxyless gRPC) and print the split once per --interval",
		Long: "client calls an xds:/// target with grpc-go's xDS client and xDS credentials: mTLS with the mesh certificate where discovery says so, " +
			"and each answer is counted by the version and the SPIFFE identity of the server that gave it. The bootstrap comes from GRPC_XDS_BOOTSTRAP " +
			"(a file; the agent writes it in proxyless mode) or GRPC_XDS_BOOTSTRAP_CONFIG (JSON); with --discovery, its server_uri may be " +
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

	root.AddCommand(g, c, identityCommand(log))
	return root
}

// identityCommand stands in for the kubelet where there is no cluster (the
// docker compose stack): it writes a JWKS for ca's --jwks-file and a
// service account token per control-plane account, and replaces the tokens
// at a third of their life until stopped. The signing key is kept in
// --key-file, apart from what the services mount, so a restart signs as
// before.
func identityCommand(log *slog.Logger) *cobra.Command {
	d := &devjwt.Dir{}
	var issuer, keyFile string
	var check bool
	cmd := &cobra.Command{
		Use:   "identity",
		Short: "Write a JWKS and service account tokens for the control plane to --dir, and keep the tokens fresh",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if check {
				return checkIdentity(d)
			}
			if d.Lifetime <= 0 {
				return fmt.Errorf("--lifetime %s: want a positive lifetime", d.Lifetime)
			}
			iss, err := devjwt.LoadOrCreate(issuer, keyFile)
			if err != nil {
				return err
			}
			d.Issuer = iss
			if err := d.Write(time.Now()); err != nil {
				return err
			}
			log.Info("service account tokens written", "dir", d.Path, "accounts", d.Accounts, "issuer", issuer, "lifetime", d.Lifetime)
			d.Refresh(cmd.Context(), log)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&d.Path, "dir", "/var/lib/flotilla/identity", "directory for jwks.json and <account>.token")
	f.StringVar(&keyFile, "key-file", "/var/lib/flotilla/identity-key/key.pem", "the issuer's signing key (created when missing)")
	f.StringVar(&issuer, "issuer", "https://flotilla.local/compose", "the tokens' issuer, ca's --jwt-issuer")
	f.StringVar(&d.Namespace, "namespace", controlplane.DefaultNamespace, "namespace of the service accounts")
	f.StringVar(&d.Audience, "audience", "istio-ca", "audience of the tokens")
	f.StringSliceVar(&d.Accounts, "accounts", append(controlplane.TokenAccounts(), controlplane.OperatorAccount), "service accounts to write tokens for (default: the control plane's, and the operator's the flotilla CLI shows ca)")
	f.DurationVar(&d.Lifetime, "lifetime", time.Hour, "lifetime of each token")
	f.BoolVar(&check, "check", false, "only check that --dir holds the JWKS and every account's token (a container healthcheck)")
	return cmd
}

// checkIdentity reports the first file of d that is missing or empty.
func checkIdentity(d *devjwt.Dir) error {
	files := []string{d.JWKSFile()}
	for _, a := range d.Accounts {
		files = append(files, d.TokenFile(a))
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		if st.Size() == 0 {
			return fmt.Errorf("%s is empty", f)
		}
	}
	return nil
}
