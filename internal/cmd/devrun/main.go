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
	"slices"
	"strings"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/devjwt"
	"github.com/flotilla-mesh/flotilla/internal/devrun"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin", "directory holding the flotilla-* binaries")
	services := fs.String("services", defaultServices, "processes to start, comma separated (of "+defaultServices+")")
	configDir := fs.String("config-dir", "examples", "directory of Istio YAML that galley serves (its own files only, not subdirectories)")
	meshFile := fs.String("mesh-config-file", "", "mesh configuration (MeshConfig YAML) galley serves (default: <config-dir>/mesh/mesh.yaml when that file exists)")
	portOffset := fs.Int("port-offset", 0, "added to every control-plane port (ca 15013/15018, galley 15019/15017/15015, discovery 15010/15012/15014 and 15110/15112/15114, injector 15016/15022), to run beside another stack; the greeters keep the ports examples/greeter.yaml names")
	stateDir := fs.String("state-dir", ".flotilla", "directory for the services' local state (ca's root)")
	stopTimeout := fs.Duration("stop-timeout", 20*time.Second, "how long services get to exit after Ctrl-C")
	if err := fs.Parse(args); err != nil {
		return command.ExitUsage
	}
	if *portOffset < 0 || *portOffset > 50000 {
		_, _ = fmt.Fprintf(stderr, "devrun: --port-offset %d: want 0..50000\n", *portOffset)
		return command.ExitUsage
	}
	if *meshFile == "" {
		if def := filepath.Join(*configDir, "mesh", "mesh.yaml"); fileExists(def) {
			*meshFile = def
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "devrun")

	requested := map[string]bool{}
	for _, name := range strings.Split(*services, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if !slices.Contains(strings.Split(defaultServices, ","), name) {
			_, _ = fmt.Fprintf(stderr, "devrun: unknown service %q (want some of %s)\n", name, defaultServices)
			return command.ExitUsage
		}
		requested[name] = true
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	var ids *devjwt.Dir
	if requested["ca"] {
		var err error
		if ids, err = newIdentities(filepath.Join(*stateDir, "identity")); err != nil {
			_, _ = fmt.Fprintf(stderr, "devrun: %v\n", err)
			return command.ExitError
		}
		go ids.Refresh(ctx, log)
	}
	// In dependency order, whatever the order asked for: ca, then galley,
	// then those that subscribe to galley.
	var procs []devrun.Process
	for _, name := range strings.Split(defaultServices, ",") {
		if requested[name] {
			procs = append(procs, process(name, local{bin: *bin, configDir: *configDir, meshFile: *meshFile, stateDir: *stateDir, offset: *portOffset}, ids))
		}
	}
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

// defaultServices is what `make run` starts, in the order it starts them:
// the control plane (two discovery replicas) and the demo (greeter v1 and
// v2, and a proxyless gRPC client printing how its calls split).
const defaultServices = "ca,galley,discovery-1,discovery-2,injector,greeter-v1,greeter-v2,client"

// local is the topology's settings: where binaries, config and state are,
// and how far every control-plane port is moved.
type local struct {
	bin, configDir, meshFile, stateDir string
	offset                             int
}

// addr is the loopback address of a control-plane port, moved by offset.
func (l local) addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port+l.offset) }

// Default ports of the local topology (the services' own defaults, and a
// second discovery replica 100 above the first).
const (
	caPort, caAdmin                       = 15013, 15018
	galleyMCP, galleyWebhook, galleyAdmin = 15019, 15017, 15015
	discovery1, secure1, discovery1Admin  = 15010, 15012, 15014 // plain text for the demo client; mTLS for workloads with ca certificates
	discovery2, secure2, discovery2Admin  = 15110, 15112, 15114
	injectorWebhook, injectorAdmin        = 15016, 15022
	clientNode                            = "sidecar~127.0.0.1~demo-client.demo~demo.svc.cluster.local"
	demoBinary                            = "flotilla-demo"
	greeterV1, greeterV2                  = "127.0.0.1:50061", "127.0.0.1:50062" // the endpoints of examples/greeter.yaml
)

// clientBootstrap is the demo client's xDS bootstrap: the discovery
// replicas behind one name (the client's --discovery list), as behind a
// Kubernetes Service; proxyless gRPC node metadata.
const clientBootstrap = `{"xds_servers": [{"server_uri": "flotilla-demo:///discovery", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],` +
	` "node": {"id": "` + clientNode + `", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}}}`

// process binds each service to loopback on its default ports, points
// galley at the example configuration, discovery and injector at galley,
// ca at a local state directory, and the demo at discovery. With ids (ca
// runs), galley, discovery and the injector get their certificates from ca
// and talk mTLS, as in a cluster.
func process(name string, l local, ids *devjwt.Dir) devrun.Process {
	bin := l.bin
	service := func(binary string, admin int, args ...string) devrun.Process {
		return devrun.Process{
			Name: name, Path: filepath.Join(bin, binary),
			Args: append([]string{"--log-format=text", "--admin-address=" + l.addr(admin)}, args...),
		}
	}
	caAddress, galleyAddress := l.addr(caPort), l.addr(galleyMCP)
	// ca's keys stay in its state directory; the trust bundle is published
	// beside it for the others.
	caState, roots := filepath.Join(l.stateDir, "ca"), filepath.Join(l.stateDir, "roots.pem")
	fromCA := func(account string) []string {
		if ids == nil {
			return nil
		}
		return []string{"--ca-address=" + caAddress, "--ca-roots-file=" + roots, "--token-file=" + ids.TokenFile(account)}
	}
	switch name {
	case "ca":
		args := []string{"--address=" + caAddress, "--state-dir=" + caState, "--roots-file=" + roots}
		if ids != nil {
			args = append(args, "--jwks-file="+ids.JWKSFile(), "--jwt-issuer="+ids.Issuer.Name)
		}
		p := service("flotilla-ca", caAdmin, args...)
		p.ReadyURL = "http://" + l.addr(caAdmin) + "/readyz" // the others get their certificates from it
		return p
	case "galley":
		args := []string{"--config-dir=" + l.configDir, "--mcp-address=" + galleyAddress}
		if l.meshFile != "" {
			args = append(args, "--mesh-config-file="+l.meshFile)
		}
		if ids != nil { // with a certificate, galley also serves its validating webhook
			args = append(args, "--webhook-address="+l.addr(galleyWebhook))
		}
		p := service("flotilla-galley", galleyAdmin, append(args, fromCA("flotilla-galley")...)...)
		p.ReadyURL = "http://" + l.addr(galleyAdmin) + "/readyz" // discovery and injector subscribe to it
		return p
	case "discovery-1", "discovery-2":
		admin, xds, secure := discovery1Admin, discovery1, secure1
		if name == "discovery-2" {
			admin, xds, secure = discovery2Admin, discovery2, secure2
		}
		args := []string{"--galley-address=" + galleyAddress, "--xds-address=" + l.addr(xds)}
		if ids != nil {
			args = append(args, "--secure-xds-address="+l.addr(secure))
		}
		return service("flotilla-discovery", admin, append(args, fromCA("flotilla-discovery")...)...)
	case "injector":
		return service("flotilla-injector", injectorAdmin, append([]string{"--galley-address=" + galleyAddress, "--webhook-address=" + l.addr(injectorWebhook)}, fromCA("flotilla-injector")...)...)
	case "greeter-v1":
		return devrun.Process{Name: name, Path: filepath.Join(bin, demoBinary), Args: []string{"greeter", "--version=v1", "--address=" + greeterV1}}
	case "greeter-v2":
		return devrun.Process{Name: name, Path: filepath.Join(bin, demoBinary), Args: []string{"greeter", "--version=v2", "--address=" + greeterV2}}
	default: // "client"
		return devrun.Process{
			Name: name, Path: filepath.Join(bin, demoBinary),
			Args: []string{"client", "--discovery=" + l.addr(discovery1) + "," + l.addr(discovery2)},
			Env:  []string{"GRPC_XDS_BOOTSTRAP_CONFIG=" + clientBootstrap},
		}
	}
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
