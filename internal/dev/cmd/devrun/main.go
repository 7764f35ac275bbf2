// Command devrun is what `make run` starts: Flotilla's control plane as
// separate local processes on loopback, with embedded defaults and no
// cluster, their logs prefixed per service, stopped together on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
	"github.com/flotilla-mesh/flotilla/internal/dev/devrun"
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
	portOffset := fs.Int("port-offset", 0, "added to every control-plane port (ca 15013/15018, galley 15019/15017/15015, discovery 15010/15012/15014 and 15110/15112/15114, injector 15016/15022, the demo agents 15120-15123), to run beside another stack; the greeters keep the ports examples/greeter.yaml names")
	stateDir := fs.String("state-dir", ".flotilla", "directory for the services' local state (ca's root; each service's log in logs/<name>.log)")
	stopTimeout := fs.Duration("stop-timeout", 20*time.Second, "how long services get to exit after Ctrl-C")
	exitOnFailure := fs.Bool("exit-on-failure", false, "stop every service when one exits (by default it is restarted, with backoff, and the others keep serving)")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0 // the usage asked for, printed
	} else if err != nil {
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
	// The agents' sockets and the gRPC bootstraps name absolute paths.
	abs, err := filepath.Abs(*stateDir)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "devrun: --state-dir: %v\n", err)
		return command.ExitUsage
	}
	*stateDir = abs

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
	for name := range demoPods() {
		switch {
		case (requested[name] || requested[name+"-agent"]) && !requested["ca"]:
			_, _ = fmt.Fprintf(stderr, "devrun: %s runs with an agent, which needs a certificate from ca: add ca to --services\n", name)
			return command.ExitUsage
		case requested[name] && !requested[name+"-agent"]:
			_, _ = fmt.Fprintf(stderr, "devrun: %s reads its bootstrap and certificate from its agent: add %s-agent to --services\n", name, name)
			return command.ExitUsage
		}
	}
	ctx, stop := lifecycle.SignalContext(context.Background())
	defer stop()
	var ids *devjwt.Dir
	if requested["ca"] {
		if ids, err = newIdentities(filepath.Join(*stateDir, "identity")); err != nil {
			_, _ = fmt.Fprintf(stderr, "devrun: %v\n", err)
			return command.ExitError
		}
		go ids.Refresh(ctx, log)
		demo, err := demoIdentities(ids, filepath.Join(*stateDir, "identity", demoNamespace))
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "devrun: %v\n", err)
			return command.ExitError
		}
		go demo.Refresh(ctx, log)
	}
	// In dependency order, whatever the order asked for: ca, then galley,
	// then those that subscribe to galley.
	var procs []devrun.Process
	l := local{bin: *bin, configDir: *configDir, meshFile: *meshFile, stateDir: *stateDir, offset: *portOffset}
	for _, name := range strings.Split(defaultServices, ",") {
		if requested[name] {
			procs = append(procs, process(name, l, ids))
		}
	}
	if busy := inUse(procs); len(busy) > 0 {
		_, _ = fmt.Fprintf(stderr, "devrun: in use already: %s. Another `make run` (or a stack of Flotilla or Istio) is running here: stop it, or move every control-plane port with make run RUN_FLAGS=--port-offset=1000 (./bin/devrun --port-offset 1000); the greeters' ports are examples/greeter.yaml's\n", strings.Join(busy, ", "))
		return command.ExitError
	}
	if err := writeContext(l, requested, ids); err != nil {
		_, _ = fmt.Fprintf(stderr, "devrun: %v\n", err)
		return command.ExitError
	}
	sup := &devrun.Supervisor{Out: stdout, Log: log, StopTimeout: *stopTimeout, NotBuiltCode: command.ExitNotBuilt, Restart: !*exitOnFailure, LogDir: l.logDir()}
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

// listenFlags are the flags naming an address a process listens on (the
// others name addresses it connects to).
var listenFlags = []string{"--admin-address=", "--address=", "--mcp-address=", "--webhook-address=", "--xds-address=", "--secure-xds-address="}

// inUse lists the addresses the processes would listen on that something
// else holds already, each with the process that needs it, so that a
// clash is named before anything starts rather than as one service's
// failure among the others' logs.
func inUse(procs []devrun.Process) []string {
	var busy []string
	for _, p := range procs {
		for _, a := range p.Args {
			for _, f := range listenFlags {
				addr, ok := strings.CutPrefix(a, f)
				if !ok {
					continue
				}
				l, err := net.Listen("tcp", addr)
				if err != nil {
					busy = append(busy, addr+" ("+p.Name+")")
					continue
				}
				_ = l.Close()
			}
		}
	}
	return busy
}

// writeContext tells the flotilla CLI where this stack is, in
// <state-dir>/context.yaml, which the CLI finds from the checkout. With
// ca, the CLI reaches the discovery replicas' mTLS ports and galley with
// a certificate from ca for the system namespace's operator token (it
// then sees every proxy, as in a cluster); without, the replicas'
// plain-text ports, which serve debug types on loopback, and not galley
// (whose MCP port takes certificates only once ca runs).
func writeContext(l local, requested map[string]bool, ids *devjwt.Dir) error {
	c := debugapi.Context{Plaintext: true}
	secure := ids != nil
	if secure {
		// Absolute: the CLI finds the file from any directory below.
		state, err := filepath.Abs(l.stateDir)
		if err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		token, err := filepath.Abs(ids.TokenFile(controlplane.OperatorAccount))
		if err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		c = debugapi.Context{
			CAAddress: l.addr(caPort), CAFile: filepath.Join(state, "roots.pem"), TokenFile: token, SystemNamespace: ids.Namespace,
		}
		if requested["galley"] {
			c.GalleyAddress = l.addr(galleyMCP)
		}
	}
	for _, r := range []struct {
		name          string
		plain, secure int
	}{{"discovery-1", discovery1, secure1}, {"discovery-2", discovery2, secure2}} {
		if !requested[r.name] {
			continue
		}
		if secure {
			c.DiscoveryAddresses = append(c.DiscoveryAddresses, l.addr(r.secure))
		} else {
			c.DiscoveryAddresses = append(c.DiscoveryAddresses, l.addr(r.plain))
		}
	}
	if len(c.DiscoveryAddresses) == 0 {
		return nil
	}
	c.LogDir = l.logDir()
	for name, d := range demoPods() {
		if requested[name+"-agent"] {
			if c.AgentAddresses == nil {
				c.AgentAddresses = map[string]string{}
			}
			c.AgentAddresses[name+"."+demoNamespace] = l.addr(d.admin)
		}
	}
	if err := os.MkdirAll(l.stateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	return debugapi.WriteContext(filepath.Join(l.stateDir, debugapi.ContextFileName), c)
}

// defaultServices is what `make run` starts, in the order it starts them:
// the control plane (two discovery replicas) and the demo (greeter v1 and
// v2, a proxyless gRPC client printing how its calls split, and an
// intruder: the same client as a service account the greeter's
// AuthorizationPolicy does not allow, printing its calls denied), each
// demo workload after its agent (proxyless mode: its own service account,
// certificate files and gRPC bootstrap), as the grpc-agent template runs
// them in a pod.
const defaultServices = "ca,galley,discovery-1,discovery-2,injector," +
	"greeter-v1-agent,greeter-v1,greeter-v2-agent,greeter-v2,client-agent,client,intruder-agent,intruder"

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
	// The demo agents' admin ports (15020 in a pod, where each has its
	// own).
	greeterV1Agent, greeterV2Agent, clientAgent, intruderAgent = 15120, 15121, 15122, 15123
	demoBinary                                                 = "flotilla-demo"
	greeterV1, greeterV2                                       = "127.0.0.1:50061", "127.0.0.1:50062" // the endpoints of examples/greeter.yaml
)

// The demo's workloads: namespace and service accounts, as
// examples/greeter.yaml and examples/mesh-policy.yaml name them.
const (
	demoNamespace                                     = "demo"
	greeterV1Account, greeterV2Account, clientAccount = "greeter-v1", "greeter-v2", "greeter-client"
	// intruderAccount is a service account examples/mesh-policy.yaml's
	// AuthorizationPolicy does not allow to call the greeter.
	intruderAccount = "greeter-intruder"
)

// demoPod is a demo workload as its pod would be: its agent's settings
// and where the agent keeps what the application reads.
type demoPod struct {
	name, account, labels string
	admin                 int
	// discovery is the replica's mTLS port the agent talks to.
	discovery int
}

// demoPods are the demo's workloads, by the name of their application
// process.
func demoPods() map[string]demoPod {
	return map[string]demoPod{
		"greeter-v1": {name: "greeter-v1", account: greeterV1Account, labels: `{"app": "greeter", "version": "v1"}`, admin: greeterV1Agent, discovery: secure1},
		"greeter-v2": {name: "greeter-v2", account: greeterV2Account, labels: `{"app": "greeter", "version": "v2"}`, admin: greeterV2Agent, discovery: secure2},
		"client":     {name: "client", account: clientAccount, labels: `{"app": "greeter-client"}`, admin: clientAgent, discovery: secure1},
		"intruder":   {name: "intruder", account: intruderAccount, labels: `{"app": "greeter-intruder"}`, admin: intruderAgent, discovery: secure2},
	}
}

// logDir keeps each service's output (<state-dir>/logs/<name>.log);
// stateDir is absolute by then.
func (l local) logDir() string { return filepath.Join(l.stateDir, "logs") }

func (d demoPod) dir(l local) string       { return filepath.Join(l.stateDir, demoNamespace, d.name) }
func (d demoPod) bootstrap(l local) string { return filepath.Join(d.dir(l), "grpc-bootstrap.json") }

// agent runs `flotilla-agent proxy sidecar` in proxyless mode for the
// workload, with the environment the grpc-agent template gives it.
func (d demoPod) agent(l local, ids *devjwt.Dir) devrun.Process {
	admin := l.addr(d.admin)
	token := ""
	if ids != nil {
		token = filepath.Join(ids.Path, demoNamespace, d.account+".token")
	}
	return devrun.Process{
		Name: d.name + "-agent", Path: filepath.Join(l.bin, "flotilla-agent"),
		Args: []string{
			"proxy", "sidecar", "--log-format=text", "--admin-address=" + admin,
			"--ca-roots-file=" + filepath.Join(l.stateDir, "roots.pem"), "--token-file=" + token,
			"--discovery-server-name=flotilla-discovery.istio-system.svc",
			"--certs-dir=" + filepath.Join(d.dir(l), "no-mounted-certs"), "--xds-socket=" + filepath.Join(d.dir(l), "XDS"),
		},
		Env: []string{
			"POD_NAME=" + d.name, "POD_NAMESPACE=" + demoNamespace, "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=" + d.account,
			"TRUST_DOMAIN=cluster.local", "CLUSTER_ID=Kubernetes", "ISTIO_METAJSON_LABELS=" + d.labels,
			"DISCOVERY_ADDRESS=" + l.addr(d.discovery), "CA_ADDRESS=" + l.addr(caPort),
			"DISABLE_ENVOY=true", "GRPC_XDS_BOOTSTRAP=" + d.bootstrap(l), "OUTPUT_CERTS=" + filepath.Join(d.dir(l), "certs"),
		},
		// The application starts once its bootstrap and certificate are there.
		ReadyURL: "http://" + admin + "/healthz/ready",
	}
}

// process binds each service to loopback on its default ports, points
// galley at the example configuration, discovery and injector at galley,
// ca at a local state directory, and the demo at discovery. With ids (ca
// runs), galley, discovery and the injector get their certificates from ca
// and talk mTLS, as in a cluster.
func process(name string, l local, ids *devjwt.Dir) devrun.Process {
	bin := l.bin
	// Every service is named by its process (flotilla version, check):
	// on one machine they all have its host name.
	service := func(binary string, admin int, args ...string) devrun.Process {
		return devrun.Process{
			Name: name, Path: filepath.Join(bin, binary),
			Args: append([]string{"--log-format=text", "--admin-address=" + l.addr(admin), "--replica-name=" + name}, args...),
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
	case "greeter-v1-agent", "greeter-v2-agent", "client-agent", "intruder-agent":
		return demoPods()[strings.TrimSuffix(name, "-agent")].agent(l, ids)
	case "greeter-v1", "greeter-v2":
		version, address := "v1", greeterV1
		if name == "greeter-v2" {
			version, address = "v2", greeterV2
		}
		return devrun.Process{
			Name: name, Path: filepath.Join(bin, demoBinary), Args: []string{"greeter", "--xds", "--version=" + version, "--address=" + address},
			Env: []string{"GRPC_XDS_BOOTSTRAP=" + demoPods()[name].bootstrap(l)},
		}
	default: // "client", "intruder"
		return devrun.Process{
			Name: name, Path: filepath.Join(bin, demoBinary), Args: []string{"client"},
			Env: []string{"GRPC_XDS_BOOTSTRAP=" + demoPods()[name].bootstrap(l)},
		}
	}
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
