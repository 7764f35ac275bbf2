// Command devrun is what `make run` starts: Flotilla's control plane as
// separate local processes on loopback, with embedded defaults and no
// cluster, their logs prefixed per service, stopped together on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/devrun"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin", "directory holding the flotilla-* binaries")
	services := fs.String("services", "galley,discovery,ca,injector", "control-plane services to start, comma separated")
	configDir := fs.String("config-dir", "examples", "directory of Istio YAML that galley serves")
	stateDir := fs.String("state-dir", ".flotilla", "directory for the services' local state (ca's root)")
	stopTimeout := fs.Duration("stop-timeout", 20*time.Second, "how long services get to exit after Ctrl-C")
	if err := fs.Parse(args); err != nil {
		return command.ExitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "devrun")

	var procs []devrun.Process
	for _, name := range strings.Split(*services, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		procs = append(procs, devrun.Process{
			Name: name,
			Path: filepath.Join(*bin, "flotilla-"+name),
			Args: append([]string{"--log-format=text"}, serviceArgs(name, *configDir, *stateDir)...),
		})
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	sup := &devrun.Supervisor{Out: stdout, Log: log, StopTimeout: *stopTimeout, NotBuiltCode: command.ExitNotBuilt}
	res, err := sup.Run(ctx, procs)
	if len(res.NotBuilt) > 0 {
		_, _ = fmt.Fprintf(stdout, "not built yet: %s\n", strings.Join(res.NotBuilt, ", "))
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "devrun: %v\n", err)
		return command.ExitError
	}
	if len(res.Stopped) == 0 {
		_, _ = fmt.Fprintln(stdout, "no service is built yet: nothing is running")
		return command.ExitOK
	}
	_, _ = fmt.Fprintf(stdout, "stopped: %s\n", strings.Join(res.Stopped, ", "))
	return command.ExitOK
}

// serviceArgs binds every service to loopback on its default ports,
// points galley at the example configuration, discovery at galley, and ca
// at a local state directory.
func serviceArgs(name, configDir, stateDir string) []string {
	admin := map[string]string{
		"discovery": "127.0.0.1:15014",
		"galley":    "127.0.0.1:15015",
		"ca":        "127.0.0.1:15018",
		"injector":  "127.0.0.1:15022",
		"agent":     "127.0.0.1:15020",
	}[name]
	var args []string
	if admin != "" {
		args = append(args, "--admin-address="+admin)
	}
	if name == "ca" {
		args = append(args, "--address=127.0.0.1:15013", "--state-dir="+filepath.Join(stateDir, "ca"))
	}
	if name == "discovery" {
		args = append(args, "--galley-address=127.0.0.1:15019", "--xds-address=127.0.0.1:15010")
	}
	if name == "injector" {
		args = append(args, "--galley-address=127.0.0.1:15019", "--webhook-address=127.0.0.1:15016")
	}
	if name == "galley" {
		args = append(args, "--config-dir="+configDir, "--mcp-address=127.0.0.1:15019")
		if mesh := filepath.Join(configDir, "mesh", "mesh.yaml"); fileExists(mesh) {
			args = append(args, "--mesh-config-file="+mesh)
		}
	}
	return args
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
