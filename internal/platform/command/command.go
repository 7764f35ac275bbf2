// Package command is the shared command line of every Flotilla service
// binary: cobra with --help and --version, configuration through
// internal/platform/config (file, flags, FLOTILLA_* environment), the logger,
// telemetry, admin server, the Go runtime's memory limit (from the
// container's) and graceful shutdown. A service supplies its
// configuration type and a run function; everything around it is the same in
// every service.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/admin"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/config"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/platform/logging"
	"github.com/flotilla-mesh/flotilla/internal/platform/memlimit"
	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
)

// Exit codes shared by every Flotilla binary.
const (
	ExitOK = 0
	// ExitError: the service failed while running.
	ExitError = 1
	// ExitUsage: bad flags, configuration file or environment.
	ExitUsage = 2
	// ExitNotBuilt: the binary exists but its service is not implemented yet.
	ExitNotBuilt = 3
)

// EnvPrefix prefixes every environment variable a service reads.
const EnvPrefix = "FLOTILLA_"

// Common is the configuration every service shares. Embed it inline:
//
//	type Config struct {
//		command.Common `yaml:",inline"`
//		...
//	}
type Common struct {
	Log logging.Options `yaml:"log"`
	// AdminAddress serves /healthz, /readyz, /metrics and /debug/pprof.
	AdminAddress string `yaml:"adminAddress" usage:"listen address of the admin HTTP server (/healthz, /readyz, /metrics, /debug/pprof)"`
	// OTLPEndpoint receives traces over OTLP/gRPC; empty disables tracing.
	OTLPEndpoint string `yaml:"otlpEndpoint" usage:"OTLP/gRPC trace endpoint, host:port (plain text) or https://host:port; empty disables trace export"`
	// ShutdownTimeout bounds the drain after SIGTERM.
	ShutdownTimeout time.Duration `yaml:"shutdownTimeout" usage:"how long to drain connections and streams after SIGTERM before exiting"`
}

// CommonDefaults returns the shared defaults with the service's admin address.
func CommonDefaults(adminAddress string) Common {
	return Common{
		Log:             logging.Defaults(),
		AdminAddress:    adminAddress,
		ShutdownTimeout: 15 * time.Second,
	}
}

// Platform returns the shared part of a service configuration.
func (c Common) Platform() Common { return c }

// Validate checks the shared configuration.
func (c Common) Validate() error {
	var errs []error
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := net.SplitHostPort(c.AdminAddress); err != nil {
		errs = append(errs, fmt.Errorf("adminAddress %q: %w", c.AdminAddress, err))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("shutdownTimeout %s: must be positive", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// Config is what a service configuration must provide: the shared part
// (usually by embedding Common) and its own validation, which should include
// Common's.
type Config interface {
	Platform() Common
	Validate() error
}

// Spec describes a service binary.
type Spec[C Config] struct {
	// Name is the binary name, e.g. "flotilla-galley".
	Name string
	// Use is the command's usage line when it differs from Name (a
	// subcommand, e.g. "proxy sidecar|router").
	Use   string
	Short string
	Long  string
	// Args, when set, takes the positional arguments and may set the
	// configuration from them; an error is a usage error. Without it the
	// command takes flags only.
	Args func(args []string, cfg *C) error
	// Defaults returns a fresh default configuration.
	Defaults func() C
	// Run runs the service until ctx ends. It usually builds its components
	// and hands them to rt.Serve.
	Run func(ctx context.Context, cfg C, rt *Runtime) error
}

// Runtime is what the shell gives a service's Run.
type Runtime struct {
	Log       *slog.Logger
	Telemetry *telemetry.Providers
	Ready     *admin.Readiness
	common    Common
	debug     map[string]http.Handler
}

// HandleAdmin adds a service endpoint to the admin server (call before
// Serve), e.g. HandleAdmin("GET /debug/syncz", h).
func (rt *Runtime) HandleAdmin(pattern string, h http.Handler) {
	if rt.debug == nil {
		rt.debug = map[string]http.Handler{}
	}
	rt.debug[pattern] = h
}

// LocalMode is called by a service running without a cluster (a directory
// of YAML on a developer's machine): its admin server, plain text, then
// listens on loopback unless its address names a host (":15015" becomes
// "127.0.0.1:15015"; "0.0.0.0:15015" stays as given). Call before Serve.
func (rt *Runtime) LocalMode() {
	rt.common.AdminAddress = LoopbackIfNoHost(rt.common.AdminAddress)
}

// LoopbackIfNoHost gives an address that names no host (":15010") the
// loopback host; any other address is returned as it is. In local mode,
// plain-text ports are for this machine only.
func LoopbackIfNoHost(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// Serve runs the admin server and actors until ctx ends or one of them
// stops, then drains everything within the configured shutdown timeout.
func (rt *Runtime) Serve(ctx context.Context, actors ...lifecycle.Actor) error {
	lis, err := net.Listen("tcp", rt.common.AdminAddress)
	if err != nil {
		return fmt.Errorf("admin listen: %w", err)
	}
	h := admin.Handler(rt.Ready, rt.Telemetry.MetricsHandler(), rt.debug)
	adminActor := lifecycle.Actor{Name: "admin", Run: func(ctx context.Context) error {
		return admin.Serve(ctx, rt.Log, lis, h, rt.common.ShutdownTimeout)
	}}
	return lifecycle.Run(ctx, rt.Log, rt.common.ShutdownTimeout, append([]lifecycle.Actor{adminActor}, actors...)...)
}

// NotBuiltError says that a service binary exists but its service is not
// implemented yet. It exits with ExitNotBuilt.
type NotBuiltError struct {
	Service string
	// Issue tracks the work; 0 when no issue does yet.
	Issue int
}

func (e *NotBuiltError) Error() string {
	tracked := "no issue tracks it yet"
	if e.Issue != 0 {
		tracked = fmt.Sprintf("tracked in issue #%d", e.Issue)
	}
	return fmt.Sprintf("%s is not built yet (%s): this binary parses its configuration and exits", e.Service, tracked)
}

// probeCommand checks a health URL (a container healthcheck in images
// that hold nothing but the binary): exit 0 when it answers 200.
func probeCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "Exit 0 if URL (e.g. http://127.0.0.1:15014/healthz) answers 200: a healthcheck for containers without a shell",
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.ExactArgs(1)(cmd, args); err != nil {
				return &usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(args[0])
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return &usageError{fmt.Errorf("probe: %q is not an http(s) URL", args[0])}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("probe: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("probe: %s answered %s", u, resp.Status)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for the answer")
	return cmd
}

// ExitCodeError ends a binary with Code (a child's exit code the service
// passes on, as the agent does Envoy's).
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// New builds the cobra command of a service.
func New[C Config](spec Spec[C]) *cobra.Command {
	var configFile string
	use := spec.Name
	if spec.Use != "" {
		use = spec.Use
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   spec.Short,
		Long:    spec.Long,
		Version: buildinfo.Get().String(),
		Args: func(_ *cobra.Command, args []string) error {
			if spec.Args != nil {
				var probe C // the arguments are checked before the configuration is read
				if err := spec.Args(args, &probe); err != nil {
					return &usageError{err}
				}
				return nil
			}
			if len(args) > 0 {
				return &usageError{fmt.Errorf("unexpected arguments %q: %s takes flags only", args, spec.Name)}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.SetVersionTemplate(spec.Name + " {{.Version}}\n")
	cmd.AddCommand(probeCommand())
	cmd.Flags().StringVar(&configFile, "config", "", "YAML configuration file; flags, then "+EnvPrefix+"* environment variables, override it (env "+EnvPrefix+"CONFIG)")
	binding, err := config.Bind(cmd.Flags(), spec.Defaults, EnvPrefix)
	if err != nil {
		// A configuration type the loader cannot handle is a programming
		// error in the service; report it on every invocation.
		cmd.RunE = func(*cobra.Command, []string) error { return fmt.Errorf("configuration type: %w", err) }
		return cmd
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if configFile == "" {
			configFile = os.Getenv(EnvPrefix + "CONFIG")
		}
		cfg, err := binding.Load(configFile, os.LookupEnv)
		if err != nil {
			return &usageError{err}
		}
		if spec.Args != nil {
			if err := spec.Args(args, &cfg); err != nil {
				return &usageError{err}
			}
		}
		return run(cmd.Context(), cmd.ErrOrStderr(), spec, cfg)
	}
	return cmd
}

func run[C Config](ctx context.Context, stderr io.Writer, spec Spec[C], cfg C) (err error) {
	common := cfg.Platform()
	log, err := logging.New(stderr, spec.Name, common.Log)
	if err != nil {
		return &usageError{err}
	}
	if soft, err := memlimit.Apply(memlimit.Root(), os.Getenv); err != nil {
		log.Warn("the container's memory limit could not be read; the Go runtime has no memory limit", "error", err)
	} else if soft > 0 {
		log.Info("Go runtime memory limit set from the container's", "limit_bytes", soft, "ratio", memlimit.Ratio)
	}
	info := buildinfo.Get()
	tel, err := telemetry.New(ctx, telemetry.Options{
		ServiceName:  spec.Name,
		Version:      info.Version,
		OTLPEndpoint: common.OTLPEndpoint,
	})
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if serr := tel.Shutdown(sctx); serr != nil {
			log.Warn("telemetry shutdown", "error", serr)
		}
	}()
	log.Info("starting", "version", info.Version, "commit", info.Commit)
	rt := &Runtime{Log: log, Telemetry: tel, Ready: admin.NewReadiness(), common: common}
	return spec.Run(ctx, cfg, rt)
}

// Main runs cmd with a context cancelled by SIGINT/SIGTERM and returns the
// process exit code. A service's main is:
//
//	func main() { os.Exit(command.Main(app.NewCommand())) }
func Main(cmd *cobra.Command) int {
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	err := cmd.ExecuteContext(ctx)
	return report(cmd.Name(), cmd.ErrOrStderr(), err)
}

func report(name string, stderr io.Writer, err error) int {
	var nb *NotBuiltError
	var ue *usageError
	var ce *ExitCodeError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ce):
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ce.Code
	case errors.As(err, &nb):
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitNotBuilt
	case errors.As(err, &ue):
		_, _ = fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return ExitUsage
	default:
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitError
	}
}
