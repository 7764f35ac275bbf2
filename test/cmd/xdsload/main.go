// Command xdsload measures discovery's convergence and memory under N
// proxyless gRPC clients (see test/load). "xdsload run" runs galley,
// discovery and the clients and prints a report; "xdsload clients" is the
// clients' process it starts.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/flotilla-mesh/flotilla/test/load"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: xdsload run [flags] | xdsload clients [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "clients":
		fs := flag.NewFlagSet("clients", flag.ExitOnError)
		xds := fs.String("xds", "127.0.0.1:15010", "discovery's xDS address")
		target := fs.String("target", "", "listener every client dials, host:port")
		n := fs.Int("n", 100, "number of clients")
		_ = fs.Parse(os.Args[2:])
		err = load.RunClients(ctx, *xds, *target, *n)
	case "run":
		fs := flag.NewFlagSet("run", flag.ExitOnError)
		o := load.Options{Log: os.Stderr}
		fs.IntVar(&o.Clients, "clients", 100, "number of proxyless gRPC clients")
		fs.IntVar(&o.Services, "services", 1000, "number of services in the mesh")
		fs.IntVar(&o.Changes, "changes", 5, "configuration changes to measure")
		env := fs.String("discovery-env", "", "comma-separated VAR=value added to discovery's environment, e.g. GOMEMLIMIT=140MiB")
		bin := fs.String("bin", "", "directory with flotilla-galley and flotilla-discovery (default: next to this binary)")
		_ = fs.Parse(os.Args[2:])
		if *env != "" {
			o.DiscoveryEnv = strings.Split(*env, ",")
		}
		self, _ := os.Executable()
		o.Self = self
		o.BinDir = *bin
		if o.BinDir == "" {
			o.BinDir = filepath.Dir(self)
		}
		var r *load.Report
		if r, err = load.Run(ctx, o); err == nil {
			fmt.Print(r)
		}
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsload:", err)
		os.Exit(1)
	}
}
