// Package compose_test runs docker-compose.yaml as users do — `make
// images`, then Compose up — and checks the demo's split, that the
// control plane talks mTLS with certificates from ca, that the split
// follows an edit, that losing a discovery replica or galley loses no
// call, and that every container drains and exits 0 on docker stop; all
// with Compose v2 (`docker compose`, the plugin `make tools` builds) on a
// network moved off the default subnet, and the demo with its defaults
// with Compose v1 (docker-compose). Without a Docker engine it says so and
// skips (the process-level tests in test/binaries and test/faults cover
// the same topology without Docker).
package compose_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// composeV2 is Compose v2 as users run it, `docker compose`: the docker
// CLI plugin `make tools` builds into bin/tools/docker/cli-plugins, found
// through DOCKER_CONFIG. It returns the command and its environment.
func composeV2(t *testing.T, root string) (cmd, env []string) {
	t.Helper()
	dockerEngine(t)
	config := filepath.Join(root, "bin", "tools", "docker")
	if _, err := os.Stat(filepath.Join(config, "cli-plugins", "docker-compose")); err != nil {
		t.Fatalf("no Compose v2 plugin (make tools builds it): %v", err)
	}
	env = []string{"DOCKER_CONFIG=" + config}
	c := exec.Command("docker", "compose", "version", "--short")
	c.Env = append(os.Environ(), env...)
	out, err := c.CombinedOutput()
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), "2.") {
		t.Fatalf("docker compose version: %v %s, want 2.x", err, out)
	}
	return []string{"docker", "compose"}, env
}

// composeV1 is Compose v1, docker-compose (Debian's: make test's
// system-deps installs it).
func composeV1(t *testing.T) []string {
	t.Helper()
	dockerEngine(t)
	out, err := exec.Command("docker-compose", "version", "--short").CombinedOutput()
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), "1.") {
		t.Fatalf("docker-compose version: %v %s, want 1.x (make system-deps installs it)", err, out)
	}
	return []string{"docker-compose"}
}

// dockerEngine skips without a Docker engine: the process-level tests
// (test/binaries, test/faults) cover the same topology without one.
func dockerEngine(t *testing.T) {
	t.Helper()
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("no Docker engine here (docker info: %v)", err)
	}
}

// images builds the stack's images (`make images observability-image`),
// once for the package's tests.
func images(t *testing.T, root string) {
	t.Helper()
	imagesOnce.Do(func() {
		start := time.Now()
		out, err := exec.Command("make", "-C", root, "images", "observability-image").CombinedOutput()
		if err != nil {
			imagesErr = fmt.Errorf("make images observability-image: %w\n%s", err, out)
			return
		}
		t.Logf("make images observability-image took %s", time.Since(start).Round(time.Second))
	})
	if imagesErr != nil {
		t.Fatal(imagesErr)
	}
}

var (
	imagesOnce sync.Once
	imagesErr  error
)

type stack struct {
	t       *testing.T
	root    string
	cmd     []string
	project string
	env     []string
}

func (s *stack) run(args ...string) (string, error) {
	s.t.Helper()
	full := append(append(append([]string{}, s.cmd[1:]...), "-p", s.project, "-f", filepath.Join(s.root, "docker-compose.yaml")), args...)
	c := exec.Command(s.cmd[0], full...)
	c.Dir = s.root
	c.Env = append(os.Environ(), s.env...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.String(), err
}

func (s *stack) must(args ...string) string {
	s.t.Helper()
	out, err := s.run(args...)
	if err != nil {
		s.t.Fatalf("compose %v: %v\n%s", args, err, out)
	}
	return out
}

// splits returns the client's split lines so far.
func (s *stack) splits() []string {
	s.t.Helper()
	out, _ := s.run("logs", "--no-color", "client")
	return proc.DemoSplits(out)
}

// waitSplit waits (up to 90 s) for n consecutive split lines after the
// first `from` lines that satisfy ok, and returns the v1, v2 and error
// counts over them.
func (s *stack) waitSplit(from, n int, ok func(line string) bool) (v1, v2 int) {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		lines := s.splits()
		if v1, v2, found := proc.DemoRun(lines[min(from, len(lines)):], n, ok); found {
			return v1, v2
		}
		time.Sleep(time.Second)
	}
	logs, _ := s.run("logs", "--no-color")
	s.t.Fatalf("no %d split lines in a row as wanted; client said:\n%s\nall logs:\n%s", n, strings.Join(s.splits(), "\n"), logs)
	return 0, 0
}

// up runs `up -d` with the stack's down at the test's end, checks that
// every service (and extra, of profiles) runs, discovery as two replicas,
// then waits for 10 s of the demo's calls without an error: about 80 %
// to v1, each version answering over mTLS as its own service account.
func (s *stack) up(extra ...string) {
	t := s.t
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := s.run("logs", "--no-color")
			t.Logf("compose logs:\n%s", logs)
		}
		if out, err := s.run("down", "-v", "--remove-orphans", "-t", "10"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	start := time.Now()
	s.must("up", "-d")
	ps := s.must("ps")
	for _, svc := range append([]string{"identity", "identity-demo", "galley", "ca", "discovery", "injector", "greeter-v1-agent", "greeter-v2-agent", "client-agent", "intruder-agent"}, extra...) {
		if !strings.Contains(ps, svc) {
			t.Fatalf("compose ps lacks %s:\n%s", svc, ps)
		}
	}
	if ids := strings.Fields(s.must("ps", "-q", "discovery")); len(ids) != 2 {
		t.Fatalf("%d discovery replicas, want 2 (deploy.replicas)", len(ids))
	}

	v1, v2 := s.waitSplit(0, 10, noErrors)
	t.Logf("up and splitting %s after `up`: over 10 s v1 %d, v2 %d", time.Since(start).Round(time.Second), v1, v2)
	if share := v1 * 100 / (v1 + v2); share < 70 || share > 90 {
		t.Fatalf("v1 got %d%%, want about 80%%", share)
	}
	splits := s.splits()
	if ids := proc.DemoIdentities(splits[len(splits)-1]); ids["v1"] != "spiffe://cluster.local/ns/demo/sa/greeter-v1" || ids["v2"] != "spiffe://cluster.local/ns/demo/sa/greeter-v2" {
		t.Fatalf("the client reached %v: want each version over mTLS as its own service account", ids)
	}
}

func noErrors(l string) bool { return !strings.Contains(l, "error") && strings.Contains(l, "(") }

// TestDockerComposeRunsTheDemoAndEachServiceFailsOnItsOwn: Compose v2
// (`docker compose`), on a network moved off the default subnet.
func TestDockerComposeRunsTheDemoAndEachServiceFailsOnItsOwn(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd, composeEnv := composeV2(t, root)
	images(t, root)

	// The stack on a network of its own choosing, as a user whose
	// machine has 10.89.57.0/24 taken does it: FLOTILLA_SUBNET_PREFIX,
	// and a copy of the examples whose greeter endpoints follow it.
	const prefix = "10.89.58"
	examples := t.TempDir()
	if err := os.CopyFS(examples, os.DirFS(filepath.Join(root, "deploy", "compose", "examples"))); err != nil {
		t.Fatal(err)
	}
	greeter := filepath.Join(examples, "greeter.yaml")
	text, err := os.ReadFile(greeter)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(text, []byte("10.89.57.")) {
		t.Fatal("greeter.yaml names no endpoint at compose's default addresses (10.89.57.*)")
	}
	if err := os.WriteFile(greeter, bytes.ReplaceAll(text, []byte("10.89.57."), []byte(prefix+".")), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &stack{t: t, root: root, cmd: cmd, project: fmt.Sprintf("flotillae2e%d", os.Getpid()), env: append(composeEnv,
		"FLOTILLA_EXAMPLES="+examples, "FLOTILLA_SUBNET_PREFIX="+prefix,
		// The observability profile, as its comment says to start it.
		"COMPOSE_PROFILES=observability", "FLOTILLA_OTLP_ENDPOINT=otel-collector:4317",
	)}
	s.up("otel-collector")

	// The intruder, the same client as a service account the greeter's
	// AuthorizationPolicy does not allow, has its calls denied by the
	// greeter's gRPC server.
	xdstest.Eventually(t, "the intruder's calls denied", func() bool {
		out, _ := s.run("logs", "--no-color", "intruder")
		in := proc.IntruderSplits(out)
		return len(in) > 0 && strings.HasPrefix(in[len(in)-1], "denied 100%")
	})

	base := len(s.splits()) // from here on no call may fail

	// The control plane talks mTLS with certificates from ca: each of
	// galley, the two discovery replicas and the injector got one (with
	// the token identity wrote), and discovery and the injector subscribed
	// to galley, which takes only their certificates.
	for svc, want := range map[string]int{"galley": 1, "discovery": 2, "injector": 1} {
		logs := s.must("logs", "--no-color", svc)
		if got := strings.Count(logs, `msg="certificate from ca"`); got < want {
			t.Errorf("%s: %d certificates from ca in its logs, want %d:\n%s", svc, got, want, logs)
		}
	}
	if got := strings.Count(s.must("logs", "--no-color", "galley"), "subscriber connected"); got < 3 {
		t.Errorf("%d subscribers connected to galley over mTLS, want 3 (two discovery replicas and the injector)", got)
	}

	// The CLI inside the network (the cli service), with no flags: every
	// demo proxy on both replicas (the name discovery resolves to each),
	// the routing held by all of them, galley's version beside theirs.
	if out := s.must("run", "--rm", "cli", "proxy-status"); strings.Count(out, ".demo ") != 4 || strings.Count(out, "SYNCED") < 10 ||
		strings.Contains(out, "STALE") || strings.Contains(out, "NACKED") || strings.Contains(out, "NOT SENT") {
		t.Errorf("proxy-status in compose: want the 4 demo proxies, every type they watch SYNCED:\n%s", out)
	}
	if out := s.must("run", "--rm", "cli", "wait", "virtualservice", "greeter.demo"); !strings.Contains(out, "held by 4 of 4 proxies, on 2 replicas") {
		t.Errorf("wait in compose:\n%s", out)
	}
	if out := s.must("run", "--rm", "cli", "version"); strings.Count(out, "discovery version: ") != 2 || !strings.Contains(out, "galley version: ") ||
		!strings.Contains(out, "injector version: ") || !strings.Contains(out, "ca version: ") {
		t.Errorf("version in compose:\n%s", out)
	}

	// An edit moves the split.
	pristine, err := os.ReadFile(filepath.Join(examples, "greeter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	setWeights := func(w1, w2 int) {
		t.Helper()
		if !strings.Contains(string(pristine), "weight: 80") || !strings.Contains(string(pristine), "weight: 20") {
			t.Fatal("greeter.yaml has no 80/20 weights")
		}
		next := strings.NewReplacer("weight: 80", fmt.Sprintf("weight: %d", w1), "weight: 20", fmt.Sprintf("weight: %d", w2)).Replace(string(pristine))
		if err := os.WriteFile(filepath.Join(examples, "greeter.yaml"), []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	share := func(lo, hi int) func(string) bool {
		return func(l string) bool {
			c := proc.DemoCounts(l)
			a, b := c["v1"], c["v2"]
			return noErrors(l) && a+b > 0 && a*100/(a+b) >= lo && a*100/(a+b) <= hi
		}
	}
	setWeights(0, 100)
	seen := len(s.splits())
	start := time.Now()
	s.waitSplit(seen, 2, share(0, 0))
	t.Logf("an edit of greeter.yaml (0/100) reached the client within %s", time.Since(start).Round(time.Second))

	// The edit as the Collector printed it: one trace holding galley's
	// change, a push of each discovery replica to the proxies, and the
	// ACKs of the two clients (client, intruder), whose routes changed
	// (the greeters' server-side configuration did not: their pushes send
	// nothing to acknowledge).
	var trace []string
	xdstest.Eventually(t, "the edit's trace in the Collector's log", func() bool {
		trace = editTrace(s.must("logs", "--no-color", "otel-collector"))
		count := func(name string) int {
			return len(slices.DeleteFunc(slices.Clone(trace), func(n string) bool { return n != name }))
		}
		return count("files.change") == 1 && count("discovery.push") == 2 && count("proxy.push") >= 2 && count("proxy.ack") >= 2
	})
	t.Logf("the Collector printed the edit's trace: %d spans (%s)", len(trace), strings.Join(trace, ", "))

	// Lose each discovery replica in turn (each is started again before
	// the next goes): no call fails, and a change still arrives, through
	// the replica left.
	ids := strings.Fields(s.must("ps", "-q", "discovery"))
	for i, id := range ids {
		if out, err := exec.Command("docker", "kill", id).CombinedOutput(); err != nil {
			t.Fatalf("docker kill: %v\n%s", err, out)
		}
		seen = len(s.splits())
		start = time.Now()
		want := share(100, 100)
		if i == 0 {
			setWeights(50, 50)
			want = share(30, 70)
		} else {
			setWeights(100, 0)
		}
		a, b := s.waitSplit(seen, 3, want)
		t.Logf("discovery replica %d of 2 killed: the next change's split held 3 s in a row, %s after the kill (v1 %d, v2 %d, no failed call)",
			i+1, time.Since(start).Round(time.Second), a, b)
		// Back for what follows.
		if out, err := exec.Command("docker", "start", id).CombinedOutput(); err != nil {
			t.Fatalf("docker start: %v\n%s", err, out)
		}
	}
	// galley killed: the client keeps routing on what discovery holds; once
	// galley is back, changes flow again.
	galley := strings.TrimSpace(s.must("ps", "-q", "galley"))
	if out, err := exec.Command("docker", "kill", galley).CombinedOutput(); err != nil {
		t.Fatalf("docker kill galley: %v\n%s", err, out)
	}
	seen = len(s.splits())
	a, b := s.waitSplit(seen, 3, share(100, 100))
	t.Logf("galley killed: 3 s of calls as before (v1 %d, v2 %d), none failed", a, b)
	if out, err := exec.Command("docker", "start", galley).CombinedOutput(); err != nil {
		t.Fatalf("docker start galley: %v\n%s", err, out)
	}
	start = time.Now()
	setWeights(20, 80)
	seen = len(s.splits())
	s.waitSplit(seen, 3, share(5, 35))
	t.Logf("galley restarted: a change's split held 3 s in a row, %s after the restart", time.Since(start).Round(time.Second))

	failed := 0
	for _, l := range s.splits()[base:] {
		if strings.Contains(l, "error") {
			failed++
			t.Errorf("calls failed: %s", l)
		}
	}
	t.Logf("failed calls after the first convergence: %d seconds with failures", failed)
	if failed > 0 {
		// The client logs the first failure of each second with its
		// reason, and the services what they did meanwhile.
		logs, _ := s.run("logs", "--no-color", "--timestamps", "client", "greeter-v1", "greeter-v2", "discovery")
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "calls failed") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Logf("%s", l)
			}
		}
	}

	// docker stop (SIGTERM, then SIGKILL after 15 s): every container
	// drains and exits 0, the client first so that nothing it depends on
	// goes away under it.
	for _, svc := range []string{"intruder", "intruder-agent", "client", "client-agent", "greeter-v1", "greeter-v1-agent", "greeter-v2", "greeter-v2-agent", "injector", "galley", "ca", "discovery", "identity-demo", "identity"} {
		for _, id := range strings.Fields(s.must("ps", "-q", svc)) {
			start := time.Now()
			if out, err := exec.Command("docker", "stop", "-t", "15", id).CombinedOutput(); err != nil {
				t.Fatalf("docker stop %s: %v\n%s", svc, err, out)
			}
			took := time.Since(start)
			out, err := exec.Command("docker", "inspect", "-f", "{{.State.ExitCode}}", id).Output()
			if err != nil {
				t.Fatal(err)
			}
			code := strings.TrimSpace(string(out))
			t.Logf("measured: %s stopped in %s, exit code %s", svc, took.Round(time.Millisecond), code)
			if code != "0" {
				t.Errorf("%s exited %s after SIGTERM, want 0", svc, code)
			}
		}
	}
}

// TestDockerComposeV1RunsTheDemoWithItsDefaults: Compose v1
// (docker-compose), as README's lines run it: the default network and
// the examples in the repository; the demo's calls split over mTLS.
func TestDockerComposeV1RunsTheDemoWithItsDefaults(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := composeV1(t)
	images(t, root)
	s := &stack{t: t, root: root, cmd: cmd, project: fmt.Sprintf("flotillav1e2e%d", os.Getpid())}
	s.up()
}

// editTrace reads the Collector's debug exporter log (verbosity detailed)
// and returns the names of the spans of the last trace holding a
// files.change span (galley's scan of an edit), in the order printed.
func editTrace(log string) []string {
	type span struct{ trace, name string }
	var spans []span
	for _, block := range strings.Split(log, "Span #")[1:] {
		var sp span
		for _, l := range strings.Split(block, "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(lastField(k)) {
			case "ID":
				if strings.Contains(k, "Trace ID") {
					sp.trace = strings.TrimSpace(v)
				}
			case "Name":
				if sp.name == "" {
					sp.name = strings.TrimSpace(v)
				}
			}
		}
		spans = append(spans, sp)
	}
	last := ""
	for _, sp := range spans {
		if sp.name == "files.change" {
			last = sp.trace
		}
	}
	var names []string
	for _, sp := range spans {
		if last != "" && sp.trace == last {
			names = append(names, sp.name)
		}
	}
	return names
}

// lastField is the last word of a log line's key ("Trace ID" → "ID").
func lastField(k string) string {
	f := strings.Fields(k)
	if len(f) == 0 {
		return ""
	}
	return f[len(f)-1]
}
