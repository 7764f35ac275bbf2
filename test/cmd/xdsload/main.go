// Command xdsload measures discovery's convergence and memory under many
// clients (see test/load): proxyless gRPC clients ("xdsload run") or raw
// ADS clients that behave as Envoy sidecars ("xdsload run --mode
// sidecar"). "run" starts galley, discovery and the clients' process and
// prints a report; "clients" and "sidecars" are the clients' processes it
// starts. "xdsload run --mode fanout" measures galley instead: one galley
// serving many discovery replicas (processes) through a rolling change of
// every endpoint; "--mode spread" proxies moving onto replicas added by a
// scale-out, at discovery's connection age.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
	"github.com/flotilla-mesh/flotilla/test/load"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: xdsload run [flags] | xdsload clients [flags] | xdsload sidecars [flags]")
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
	case "sidecars":
		fs := flag.NewFlagSet("sidecars", flag.ExitOnError)
		o := load.SidecarClientOptions{Log: os.Stderr}
		fs.StringVar(&o.XDS, "xds", "127.0.0.1:15010", "discovery's xDS address")
		fs.IntVar(&o.N, "n", 100, "number of sidecar clients")
		fs.IntVar(&o.First, "first", 0, "the mesh's index of the first of them (processes sharing a mesh's clients)")
		fs.BoolVar(&o.Delta, "delta", false, "incremental xDS (default state of the world)")
		fs.StringVar(&o.Status, "status", "127.0.0.1:0", "address the process reports on")
		fs.DurationVar(&o.Ramp, "ramp", 0, "start the clients evenly over this long (default all at once)")
		fs.BoolVar(&o.Endpoints, "endpoints", false, "keep each EDS cluster's endpoints for POST /stale (state of the world only)")
		services := fs.Int("services", 100, "services in the mesh (who the clients are depends on it)")
		_ = fs.Parse(os.Args[2:])
		o.Workload = func(i int) bootstrap.Node { return load.SidecarNode(i, *services) }
		err = load.RunSidecarClients(ctx, o)
	case "run":
		err = run(ctx)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsload:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	mode := fs.String("mode", "proxyless", "proxyless (grpc-go xDS clients), sidecar (raw ADS clients behaving as Envoy), reference (sidecar clients of Kubernetes Services in a real kube-apiserver read by galley in cluster mode, over --client-procs processes and --replicas discovery replicas: Istio's performance reference point), fanout (one galley, --replicas discovery processes, a rolling change of every endpoint), spread (sidecars on one replica, --replicas-1 more started, proxies moving at the connection age), or churn (a whole cluster with kwok nodes: --deployments of --pods-each pods behind Services, --clients sidecars over --client-procs processes keeping every endpoint, then --waves rolling restarts of --fraction of the Deployments every --wave-interval)")
	clients := fs.Int("clients", 100, "number of clients")
	services := fs.Int("services", 0, "number of services in the mesh (default 1000 proxyless, 100 sidecar)")
	changes := fs.Int("changes", 5, "configuration changes to measure (sidecar: this many route and this many endpoint changes)")
	delta := fs.Bool("delta", false, "sidecar mode: incremental xDS")
	scoped := fs.Bool("scoped", false, "sidecar mode: a Sidecar resource per client namespace limits what it sees")
	nack := fs.Int("nack", 0, "sidecar mode: this many clients reject every route configuration after the initial sync")
	profile := fs.String("profile", "", "sidecar mode: directory for discovery's heap profile after the initial sync and a CPU profile of each change; reference mode: for the first replica's heap profile after the initial sync; fanout mode: for galley's heap profile after the change; churn mode: for galley's and discovery's CPU profiles over the waves and heaps after them")
	env := fs.String("discovery-env", "", "comma-separated VAR=value added to discovery's environment, e.g. GOMEMLIMIT=140MiB")
	replicas := fs.Int("replicas", 0, "fanout mode: discovery replicas subscribed to galley (default 20); spread mode: replicas after the scale-out (default 3); reference mode: replicas serving the sidecars (default 1)")
	clientProcs := fs.Int("client-procs", 2, "reference and churn modes: processes the sidecar clients are spread over")
	kubeBin := fs.String("kube-bin", "", "reference and churn modes: directory with the Kubernetes binaries (default: bin/tools of the repository)")
	age := fs.Duration("connection-age", 2*time.Minute, "spread mode: discovery's --xds-max-connection-age (longer than the initial sync)")
	ramp := fs.Duration("ramp", 0, "spread and reference modes: start the sidecar clients evenly over this long, as a rollout's pods connect (default all at once)")
	endpoints := fs.Int("endpoints", 10, "fanout mode: endpoints per service")
	steps := fs.Int("steps", 10, "fanout mode: the rolling change's steps (each moves every endpoint of services/steps services)")
	interval := fs.Duration("interval", time.Second, "fanout mode: time between the steps")
	deployments := fs.Int("deployments", 1000, "churn mode: Deployments, each behind a Service")
	podsEach := fs.Int("pods-each", 10, "churn mode: pods per Deployment")
	waves := fs.Int("waves", 5, "churn mode: rolling restarts")
	fraction := fs.Float64("fraction", 0.1, "churn mode: the part of the Deployments each wave restarts")
	waveInterval := fs.Duration("wave-interval", time.Minute, "churn mode: time between the waves' starts")
	syncTimeout := fs.Duration("sync-timeout", 15*time.Minute, "churn mode: how long to wait for the pods, the sidecars' sync and the last wave to settle")
	bin := fs.String("bin", "", "directory with flotilla-galley and flotilla-discovery (default: next to this binary)")
	_ = fs.Parse(os.Args[2:])
	self, _ := os.Executable()
	binDir := *bin
	if binDir == "" {
		binDir = filepath.Dir(self)
	}
	var discEnv []string
	if *env != "" {
		discEnv = strings.Split(*env, ",")
	}
	switch *mode {
	case "proxyless":
		o := load.Options{Log: os.Stderr, BinDir: binDir, Self: self, Clients: *clients, Services: *services, Changes: *changes, DiscoveryEnv: discEnv}
		if o.Services == 0 {
			o.Services = 1000
		}
		r, err := load.Run(ctx, o)
		if err != nil {
			return err
		}
		fmt.Print(r)
	case "reference":
		o := load.ReferenceOptions{
			Log: os.Stderr, BinDir: binDir, KubeBinDir: *kubeBin, Self: self, Sidecars: *clients, Services: cmp.Or(*services, 1000),
			Replicas: cmp.Or(*replicas, 1), ClientProcs: *clientProcs, Changes: *changes, Delta: *delta, Ramp: *ramp, ProfileDir: *profile, DiscoveryEnv: discEnv,
		}
		r, err := load.RunReference(ctx, o)
		if err != nil {
			return err
		}
		fmt.Print(r)
	case "churn":
		r, err := load.RunChurn(ctx, load.ChurnOptions{
			Log: os.Stderr, BinDir: binDir, KubeBinDir: *kubeBin, Self: self, Deployments: *deployments, PodsEach: *podsEach,
			Sidecars: *clients, ClientProcs: *clientProcs, Waves: *waves, Interval: *waveInterval, Fraction: *fraction, ProfileDir: *profile,
			SyncTimeout: *syncTimeout,
		})
		if err != nil {
			return err
		}
		fmt.Print(r)
	case "sidecar":
		o := load.SidecarOptions{
			Log: os.Stderr, BinDir: binDir, Self: self, Sidecars: *clients, Services: *services, Changes: *changes,
			Delta: *delta, Scoped: *scoped, NackClients: *nack, DiscoveryEnv: discEnv, ProfileDir: *profile,
		}
		if o.Services == 0 {
			o.Services = 100
		}
		r, err := load.RunSidecars(ctx, o)
		if err != nil {
			return err
		}
		fmt.Print(r)
	case "spread":
		o := load.SpreadOptions{
			Log: os.Stderr, BinDir: binDir, Self: self, Sidecars: *clients, Services: *services, Delta: *delta,
			Replicas: cmp.Or(*replicas, 3), ConnectionAge: *age, Changes: *changes, Ramp: *ramp,
		}
		if o.Services == 0 {
			o.Services = 100
		}
		r, err := load.RunSpread(ctx, o)
		if err != nil {
			return err
		}
		fmt.Print(r)
	case "fanout":
		o := load.FanoutOptions{
			Log: os.Stderr, BinDir: binDir, Replicas: cmp.Or(*replicas, 20), Services: *services, EndpointsEach: *endpoints, Steps: *steps, Interval: *interval,
			ProfileDir: *profile,
		}
		if o.Services == 0 {
			o.Services = 1000
		}
		r, err := load.RunFanout(ctx, o)
		if err != nil {
			return err
		}
		fmt.Print(r)
	default:
		return fmt.Errorf("--mode %q: want proxyless, sidecar, reference, fanout, spread or churn", *mode)
	}
	return nil
}
