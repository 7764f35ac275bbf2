// Package binaries_test checks what every Flotilla binary has in common:
// --help, --version, the exit codes, configuration errors, and that each
// service module builds on its own outside the workspace (as image builds do).
package binaries_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

type binary struct {
	name    string // file name in bin/
	service bool   // a service (the shared flags); false for the CLI and the demo
	// args run the service (the agent's is a subcommand).
	args []string
}

var binaries = []binary{
	{"flotilla-galley", true, nil},
	{"flotilla-discovery", true, nil},
	{"flotilla-ca", true, nil},
	{"flotilla-injector", true, nil},
	{"flotilla-agent", true, []string{"proxy", "sidecar"}},
	{"flotilla", false, nil},
	{"flotilla-demo", false, nil},
}

var binDir string

func TestMain(m *testing.M) {
	names := []string{"devrun"}
	for _, b := range binaries {
		names = append(names, b.name)
	}
	os.Exit(build.Main(m, &binDir, nil, names...))
}

type result struct {
	code   int
	stdout string
	stderr string
}

func run(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	return result{code, out.String(), errOut.String()}
}

func TestEveryBinaryAnswersHelpAndVersion(t *testing.T) {
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			r := run(t, nil, b.name, "--version")
			want := b.name + " " + build.Version + " (commit abc123, go"
			if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
				t.Fatalf("--version: exit %d, %q; want prefix %q", r.code, r.stdout, want)
			}
			r = run(t, nil, b.name, "--help")
			if r.code != 0 || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, b.name) {
				t.Fatalf("--help: exit %d, %q", r.code, r.stdout)
			}
		})
	}
}

func TestEveryServiceTakesTheSharedFlagsAndEnvironment(t *testing.T) {
	for _, b := range binaries {
		if !b.service {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			help := run(t, nil, b.name, append(slices.Clone(b.args), "--help")...).stdout
			for _, want := range []string{"--config", "--log-level", "--log-format", "--admin-address", "--otlp-endpoint", "FLOTILLA_OTLP_ENDPOINT", "--shutdown-timeout"} {
				if !strings.Contains(help, want) {
					t.Errorf("--help lacks %s", want)
				}
			}
		})
	}
}

// TestTheAgentSaysWhatThePodMustGiveIt: the proxy command names each
// piece of the pod's environment it lacks, and its argument. INSTANCE_IP
// is not among them: without it the pod's IP comes from its interfaces,
// as with Istio's agent; a value that is no IP is refused.
func TestTheAgentSaysWhatThePodMustGiveIt(t *testing.T) {
	r := run(t, nil, "flotilla-agent", "proxy", "sidecar", "--admin-address=127.0.0.1:0")
	for _, want := range []string{"POD_NAME", "POD_NAMESPACE", "SERVICE_ACCOUNT", "DISCOVERY_ADDRESS"} {
		if r.code != 2 || !strings.Contains(r.stderr, want) {
			t.Errorf("exit %d, stderr %q; want 2 and %s named", r.code, r.stderr, want)
		}
	}
	if strings.Contains(r.stderr, "INSTANCE_IP") {
		t.Errorf("an unset INSTANCE_IP was refused: %q", r.stderr)
	}
	if r := run(t, nil, "flotilla-agent", "proxy", "sidecar", "--admin-address=127.0.0.1:0", "--instance-ip=pod-1"); r.code != 2 || !strings.Contains(r.stderr, `instanceIP (INSTANCE_IP) "pod-1" is not an IP address`) {
		t.Errorf("INSTANCE_IP pod-1: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run(t, nil, "flotilla-agent", "proxy", "waypoint"); r.code != 2 || !strings.Contains(r.stderr, "sidecar or router") {
		t.Errorf("proxy waypoint: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run(t, nil, "flotilla-agent"); r.code != 0 || !strings.Contains(r.stdout, "proxy") || !strings.Contains(r.stdout, "iptables") {
		t.Errorf("flotilla-agent alone: exit %d, %q; want its commands listed", r.code, r.stdout)
	}
}

func TestGalleyWithoutAClusterOrADirectorySaysWhatItNeeds(t *testing.T) {
	r := run(t, []string{"KUBERNETES_SERVICE_HOST="}, "flotilla-galley", "--admin-address=127.0.0.1:0", "--mcp-address=127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "no --config-dir, no --kubeconfig and not running in a cluster") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestCAPublishesRootsOnlyWithAStateDirectory(t *testing.T) {
	r := run(t, nil, "flotilla-ca", "--roots-file", filepath.Join(t.TempDir(), "roots.pem"), "--admin-address=127.0.0.1:0")
	if r.code != 2 || !strings.Contains(r.stderr, "rootsFile needs stateDir") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestGalleyRefusesAnInvalidMeshConfigFile(t *testing.T) {
	dir := t.TempDir()
	mesh := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(mesh, []byte("trustDomain: [not, a, string]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "flotilla-galley", "--config-dir", dir, "--mesh-config-file", mesh,
		"--admin-address=127.0.0.1:0", "--mcp-address=127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "mesh config "+mesh) {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestAMeshConfigFileWithoutAConfigDirIsRefusedRatherThanIgnored(t *testing.T) {
	mesh := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(mesh, []byte("trustDomain: example.org\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"flotilla-galley", "flotilla-discovery"} {
		r := run(t, []string{"KUBERNETES_SERVICE_HOST="}, b, "--mesh-config-file", mesh, "--admin-address=127.0.0.1:0")
		if r.code != 2 || !strings.Contains(r.stderr, "meshConfigFile is read only with configDir") {
			t.Errorf("%s: exit %d, stderr %q; want 2 and the reason", b, r.code, r.stderr)
		}
	}
}

func TestBadConfigurationIsAUsageErrorInEveryService(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("log:\n  level: debug\nadminAdress: :1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown field in file", nil, []string{"--config", cfg}, "field adminAdress not found"},
		{"bad level in env", []string{"FLOTILLA_LOG_LEVEL=loud"}, nil, `log level "loud"`},
		{"bad duration flag", nil, []string{"--shutdown-timeout=soon"}, "soon"},
		{"bad admin address", nil, []string{"--admin-address=nowhere"}, "adminAddress"},
	}
	for _, b := range binaries {
		if !b.service {
			continue
		}
		for _, c := range cases {
			t.Run(b.name+"/"+c.name, func(t *testing.T) {
				r := run(t, c.env, b.name, append(slices.Clone(b.args), c.args...)...)
				if r.code != 2 || !strings.Contains(r.stderr, c.want) {
					t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, c.want)
				}
			})
		}
	}
}

// TestMakeRunShowsTheLiveSplitAndStopsOnCtrlC runs what `make run` runs
// (on a copy of examples/, which it edits): the control plane with two
// discovery replicas, talking mTLS with certificates from ca, and the
// demo through its agents in proxyless mode, whose client prints the
// split the example VirtualService asks for, each version reached over
// mTLS as its own service account, and follows an edit of it.
func TestMakeRunShowsTheLiveSplitAndStopsOnCtrlC(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	examples := t.TempDir()
	if err := os.CopyFS(examples, os.DirFS(filepath.Join(root, "examples"))); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	// The greeters' ports (examples/greeter.yaml) lie in the kernel's
	// ephemeral range, which the other test packages running meanwhile
	// draw their ports and connections from: wait until they are free,
	// rather than have devrun refuse them as another stack's.
	waitFree(t, 2*time.Minute, "127.0.0.1:50061", "127.0.0.1:50062")
	cmd := exec.Command(filepath.Join(binDir, "devrun"), "--bin", binDir, "--config-dir", examples, "--state-dir", state)
	var out proc.Output
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	for _, want := range []string{
		"msg=serving service=flotilla-galley source=files:",
		"msg=serving service=flotilla-ca",
		"msg=serving service=flotilla-injector",
		"msg=\"greeter serving\" version=v1",
		"msg=\"greeter serving\" version=v2",
		"msg=\"certificate files written\" service=flotilla-agent",
	} {
		out.WaitFor(t, want)
	}
	for _, name := range []string{"discovery-1", "discovery-2", "greeter-v1-agent", "greeter-v2-agent", "client-agent", "client", "intruder-agent", "intruder"} {
		xdstest.Eventually(t, name+"'s prefixed output", func() bool { return prefixed(out.String(), name) })
	}
	out.WaitForCount(t, "msg=serving service=flotilla-discovery source=galley:127.0.0.1:15019", 2)
	checkControlPlaneMTLS(t, filepath.Join(state, "roots.pem"))
	for _, unwanted := range []string{"self-signed development certificate", "no token authentication", "no certificate from ca yet"} {
		if strings.Contains(out.String(), unwanted) {
			t.Errorf("make run's control plane logged %q:\n%s", unwanted, out.String())
		}
	}

	// 80/20 in examples/greeter.yaml: over ten one-second lines with no
	// errors, v1 gets 70–90 %.
	v1, v2 := splitOver(t, &out, 10)
	t.Logf("split over 10 s: v1 %d, v2 %d", v1, v2)
	splits := proc.DemoSplits(out.String())
	ids := proc.DemoIdentities(splits[len(splits)-1])
	if ids["v1"] != "spiffe://cluster.local/ns/demo/sa/greeter-v1" || ids["v2"] != "spiffe://cluster.local/ns/demo/sa/greeter-v2" {
		t.Fatalf("the client reached %v: want each version over mTLS as its own service account", ids)
	}
	if share := v1 * 100 / (v1 + v2); share < 70 || share > 90 {
		t.Fatalf("v1 got %d%% of the calls, want about 80%%", share)
	}
	// examples/mesh-policy.yaml's AuthorizationPolicy lets only the
	// client's service account call the greeter: the intruder's calls
	// are all denied.
	xdstest.Eventually(t, "the intruder's calls denied", func() bool {
		in := proc.IntruderSplits(out.String())
		return len(in) > 0 && strings.HasPrefix(in[len(in)-1], "denied 100%")
	})

	// Editing the example moves the split: all to v2.
	data, err := os.ReadFile(filepath.Join(examples, "greeter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(strings.Replace(string(data), "weight: 80", "weight: 0", 1), "weight: 20", "weight: 100", 1)
	if edited == string(data) {
		t.Fatal("examples/greeter.yaml has no 80/20 weights to edit")
	}
	if err := os.WriteFile(filepath.Join(examples, "greeter.yaml"), []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	out.WaitFor(t, "split: v2 spiffe://cluster.local/ns/demo/sa/greeter-v2 100%")

	// The CLI with the context make run wrote, and no flags: over mTLS,
	// with a certificate from ca for the operator's token, it sees every
	// demo proxy on the two replicas, waits for the edit to reach them
	// all, and analyzes galley's configuration.
	cliDir := t.TempDir()
	cli := func(args ...string) (int, string) {
		t.Helper()
		c := exec.Command(filepath.Join(binDir, "flotilla"), args...)
		c.Env = append(os.Environ(), "FLOTILLA_CONTEXT="+filepath.Join(state, "context.yaml"))
		c.Dir = cliDir // what a command writes (bug-report's archive) stays out of the checkout
		b, err := c.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return c.ProcessState.ExitCode(), string(b)
	}
	if code, got := cli("proxy-status"); code != 0 || strings.Count(got, ".demo ") < 4 || !strings.Contains(got, "discovery-2") {
		t.Errorf("proxy-status: exit %d\n%s", code, got)
	}
	if code, got := cli("wait", "virtualservice", "greeter.demo"); code != 0 || !strings.Contains(got, "held by 4 of 4 proxies, on 2 replicas") {
		t.Errorf("wait: exit %d\n%s", code, got)
	}
	// check: every service answers, is current and on one version, the
	// replicas' certificates and the roots are valid, over mTLS.
	if code, got := cli("check"); code != 0 || strings.Contains(got, "×") || strings.Count(got, "is subscribed to galley and current") != 3 ||
		strings.Count(got, "'s certificate valid until") != 2 || !strings.Contains(got, "√ the control plane runs one version") {
		t.Errorf("check: exit %d\n%s", code, got)
	}
	if code, got := cli("analyze", "--live"); code != 0 {
		t.Errorf("analyze --live: exit %d\n%s", code, got)
	}
	if code, got := cli("version"); code != 0 || strings.Count(got, "discovery version: ") != 2 || !strings.Contains(got, "proxies at ") ||
		!strings.Contains(got, "galley version: ") || !strings.Contains(got, "injector version: ") || !strings.Contains(got, "ca version: ") ||
		// Each named by its make-run process, not the host name they share.
		!strings.Contains(got, "(replica galley)") || !strings.Contains(got, "(replica ca, ") || !strings.Contains(got, "(replica injector, ") {
		t.Errorf("version: exit %d\n%s", code, got)
	}
	// The client's agent wrote its gRPC bootstrap; the context names the
	// agent's status port.
	if code, got := cli("proxy-config", "bootstrap", "client.demo"); code != 0 || !strings.Contains(got, `"xds_servers"`) || !strings.Contains(got, "~client.demo~demo.svc.cluster.local") {
		t.Errorf("proxy-config bootstrap: exit %d\n%s", code, got)
	}
	// The client's certificate and roots, from its agent: the certificate
	// files a proxyless application reads.
	if code, got := cli("proxy-config", "secret", "client.demo"); code != 0 || !strings.Contains(got, "spiffe://cluster.local/ns/demo/sa/greeter-client") ||
		!regexp.MustCompile(`(?m)^default +Cert Chain +ACTIVE +true `).MatchString(got) || !regexp.MustCompile(`(?m)^ROOTCA +ROOTCA +ACTIVE +true `).MatchString(got) {
		t.Errorf("proxy-config secret: exit %d\n%s", code, got)
	}
	// The routes the client follows, each with its header match and the
	// VirtualService it came from; the clusters with their DestinationRule.
	if code, got := cli("proxy-config", "route", "client.demo"); code != 0 || !strings.Contains(got, "/* header x-version=v1") || !strings.Contains(got, "/* header x-version=v2") ||
		strings.Count(got, "greeter.demo") < 3 {
		t.Errorf("proxy-config route: exit %d\n%s", code, got)
	}

	// README's walkthrough, each command as a user types it.
	walkthrough := readmeCommands(t)
	if len(walkthrough) < 5 {
		t.Fatalf("README's make-run walkthrough has %d flotilla commands", len(walkthrough))
	}
	for _, c := range walkthrough {
		code, got := cli(c.args...)
		if code != 0 || strings.TrimSpace(got) == "" {
			t.Errorf("README's %q: exit %d\n%s", c.line, code, got)
		}
		if c.header != "" && strings.Join(strings.Fields(strings.SplitN(got, "\n", 2)[0]), " ") != c.header {
			t.Errorf("README's %q shows the header %q; the command prints\n%s", c.line, c.header, got)
		}
	}

	// bug-report gathers the live stack: every file there, none failed,
	// no key or token in any.
	archive := filepath.Join(cliDir, "report.tar.gz")
	if code, got := cli("bug-report", "-o", archive); code != 0 || strings.Contains(got, "failed") {
		t.Errorf("bug-report: exit %d\n%s", code, got)
	}
	files := proc.ReadArchive(t, archive)
	dumps := 0
	for name, body := range files {
		if strings.HasPrefix(name, "bug-report/proxies/") && strings.Contains(body, "type.googleapis.com/envoy.admin.v3.") {
			dumps++
		}
	}
	if dumps != 4 {
		t.Errorf("bug-report has %d proxies' config dumps, want the 4 demo proxies'", dumps)
	}
	for _, want := range []string{"version.txt", "proxy-status.json", "galley/config.yaml", "galley/rejections.json", "galley/subscribers.json", "logs/galley.log", "logs/discovery-2.log", "logs/client-agent.log"} {
		if files["bug-report/"+want] == "" {
			t.Errorf("bug-report has no %s (or it is empty); it has %d files", want, len(files))
		}
	}
	if !strings.Contains(files["bug-report/galley/config.yaml"], "kind: VirtualService") || !strings.Contains(files["bug-report/logs/galley.log"], "level=INFO") {
		t.Errorf("bug-report's configuration or galley's log:\n%.1000s\n%.1000s", files["bug-report/galley/config.yaml"], files["bug-report/logs/galley.log"])
	}
	for name, body := range files {
		if strings.Contains(body, "PRIVATE KEY") || regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.`).MatchString(body) {
			t.Errorf("bug-report's %s holds a key or a token", name)
		}
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("devrun after Ctrl-C: %v\n%s", err, out.String())
	}
	for _, want := range []string{"msg=\"grpc server drained\"", "stopped: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !prefixed(out.String(), "galley") {
		t.Errorf("no line of galley's:\n%s", out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "stopped: "); ok {
			for _, s := range strings.Split("galley, ca, discovery-1, discovery-2, injector, greeter-v1-agent, greeter-v1, greeter-v2-agent, greeter-v2, client-agent, client, intruder-agent, intruder", ", ") {
				if !strings.Contains(rest, s) {
					t.Errorf("stopped %q, lacks %s", rest, s)
				}
			}
		}
	}
}

// prefixed reports whether some line of out is name's: "name   | …".
func prefixed(out, name string) bool {
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, name+" "); ok && strings.HasPrefix(strings.TrimLeft(rest, " "), "| ") {
			return true
		}
	}
	return false
}

// checkControlPlaneMTLS: galley's MCP port serves a certificate from make
// run's ca with galley's SPIFFE identity and wants a client certificate;
// the injector's webhook and discovery's secure xDS ports serve their ca
// certificates for their Service names.
func checkControlPlaneMTLS(t *testing.T, rootsFile string) {
	t.Helper()
	pemRoots, err := os.ReadFile(rootsFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemRoots) {
		t.Fatalf("%s holds no certificate", rootsFile)
	}
	for _, c := range []struct{ addr, name, spiffe string }{
		{"127.0.0.1:15019", "flotilla-galley.istio-system.svc", "spiffe://cluster.local/ns/istio-system/sa/flotilla-galley"},
		{"127.0.0.1:15017", "flotilla-galley.istio-system.svc", "spiffe://cluster.local/ns/istio-system/sa/flotilla-galley"},
		{"127.0.0.1:15016", "flotilla-injector.istio-system.svc", "spiffe://cluster.local/ns/istio-system/sa/flotilla-injector"},
		{"127.0.0.1:15012", "flotilla-discovery.istio-system.svc", "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery"},
		{"127.0.0.1:15112", "flotilla-discovery.istio-system.svc", "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery"},
	} {
		conn, err := tls.Dial("tcp", c.addr, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: c.name, NextProtos: []string{"h2"}})
		if err != nil {
			t.Errorf("%s: %v", c.addr, err)
			continue
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != c.spiffe {
			t.Errorf("%s serves %v, want %s", c.addr, leaf.URIs, c.spiffe)
		}
		if c.addr == "127.0.0.1:15019" {
			// TLS 1.3 reports a refused client certificate on the first read.
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
				t.Errorf("galley's MCP port took a client without a certificate (read: %v)", err)
			}
		}
		_ = conn.Close()
	}
}

// splitOver waits for n consecutive split lines without errors from the
// demo client and sums their v1 and v2 counts.
func splitOver(t *testing.T, out *proc.Output, n int) (v1, v2 int) {
	t.Helper()
	answered := func(l string) bool {
		c := proc.DemoCounts(l)
		return c["error"] == 0 && c["v1"]+c["v2"] > 0
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if v1, v2, ok := proc.DemoRun(proc.DemoSplits(out.String()), n, answered); ok {
			return v1, v2
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("no %d error-free split lines in a row:\n%s", n, out.String())
	return 0, 0
}

func TestEachServiceModuleBuildsOutsideTheWorkspace(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{"services/galley", "services/discovery", "services/ca", "services/injector", "services/agent", "cli", "examples/demo"} {
		t.Run(mod, func(t *testing.T) {
			cmd := exec.Command("go", "build", "-o", os.DevNull, "./...")
			cmd.Dir = filepath.Join(root, mod)
			cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("GOWORK=off go build ./... in %s: %v\n%s", mod, err, out)
			}
		})
	}
}

// readmeCommand is one command of README's make-run walkthrough: its
// line, its arguments, and the header README shows it printing (its
// fields joined by one space), if any.
type readmeCommand struct {
	line, header string
	args         []string
}

// readmeCommands are the flotilla commands of README's walkthrough of
// make run (the block after "While it runs"), comments removed.
func readmeCommands(t *testing.T) []readmeCommand {
	t.Helper()
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "While it runs, the CLI")
	if !ok {
		t.Fatal("README has no walkthrough of the CLI under make run")
	}
	_, block, _ := strings.Cut(after, "```\n")
	block, _, _ = strings.Cut(block, "```")
	var out []readmeCommand
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		cmdline, ok := strings.CutPrefix(l, "$ ./bin/flotilla ")
		if !ok {
			continue
		}
		cmdline, _, _ = strings.Cut(cmdline, " #")
		c := readmeCommand{line: strings.TrimSpace(l), args: strings.Fields(cmdline)}
		if i+1 < len(lines) && lines[i+1] != "" && !strings.HasPrefix(lines[i+1], "$") {
			c.header = strings.Join(strings.Fields(lines[i+1]), " ")
		}
		out = append(out, c)
	}
	return out
}

// waitFree waits until every address can be listened on, at most
// timeout.
func waitFree(t *testing.T, timeout time.Duration, addrs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, a := range addrs {
		for {
			l, err := net.Listen("tcp", a)
			if err == nil {
				_ = l.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still in use after %s: %v", a, timeout, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
