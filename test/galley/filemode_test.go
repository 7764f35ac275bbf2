// Package galley_test runs flotilla-galley as its own process in file mode
// and subscribes to it over real gRPC on 127.0.0.1, as discovery does.
package galley_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, &env, "flotilla-galley", "flotilla-discovery", "flotilla", "flotilla-agent", "fakeenvoy"))
}

// process is a running flotilla-galley.
type process struct {
	cmd  *exec.Cmd
	out  *proc.Output
	done chan error
}

func startGalleyWith(tb testing.TB, adminAddr string, args ...string) *process {
	tb.Helper()
	args = append(args, "--admin-address", adminAddr, "--log-format", "text")
	cmd := exec.Command(filepath.Join(binDir, "flotilla-galley"), args...)
	p := &process{cmd: cmd, out: &proc.Output{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		exit := <-p.done
		if tb.Failed() {
			tb.Logf("galley (%v) output:\n%s", exit, p.out.String())
		}
	})
	proc.WaitReady(tb, "http://"+adminAddr+"/readyz")
	return p
}

// stop sends SIGTERM and expects a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("galley exit: %v", err)
		}
		p.done <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("galley did not stop")
	}
}

// subscriber mirrors what galley publishes.
type subscriber struct {
	mu      sync.Mutex
	state   map[string]map[string]*mcp.Resource
	calls   int
	changes int
	types   int // collections subscribed to
	log     []string
	notify  chan struct{}
}

func (s *subscriber) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	s.mu.Lock()
	if s.state[typeURL] == nil {
		s.state[typeURL] = map[string]*mcp.Resource{}
	}
	for _, r := range updated {
		s.state[typeURL][r.Name] = r
		s.log = append(s.log, typeURL+" "+r.Name+" "+r.Version)
	}
	for _, n := range removed {
		delete(s.state[typeURL], n)
	}
	s.calls++
	s.changes += len(updated) + len(removed)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return nil
}

func (s *subscriber) counts() (calls, changes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.changes
}

func (s *subscriber) weights(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.state[vsType()][name]
	if r == nil {
		return "absent"
	}
	var vs networking.VirtualService
	if err := r.Body.UnmarshalTo(&vs); err != nil {
		return "undecodable: " + err.Error()
	}
	var w []string
	for _, h := range vs.GetHttp() {
		for _, rd := range h.GetRoute() {
			w = append(w, fmt.Sprint(rd.GetWeight()))
		}
	}
	return strings.Join(w, "/")
}

// generation is a resource's generation (0 when absent).
func (s *subscriber) generation(typeURL, name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.state[typeURL][name]; r != nil {
		return r.Generation
	}
	return 0
}

func (s *subscriber) has(typeURL, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state[typeURL][name] != nil
}

func (s *subscriber) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-s.notify:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func vsType() string { return kindURL("VirtualService") }

func kindURL(kind string) string {
	for _, k := range istio.Kinds() {
		if k.Kind == kind {
			return k.TypeURL()
		}
	}
	panic("unknown kind " + kind)
}

func subscribe(tb testing.TB, addr string) *subscriber {
	tb.Helper()
	sub := &subscriber{state: map[string]map[string]*mcp.Resource{}, notify: make(chan struct{}, 1)}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	var types []string
	for _, k := range istio.Kinds() {
		types = append(types, k.TypeURL())
	}
	types = append(types, registry.ServiceTypeURL, registry.EndpointSetTypeURL, registry.NamespaceTypeURL, registry.MeshConfigTypeURL)
	sub.types = len(types)
	c, err := mcp.NewClient(mcp.ClientOptions{
		Conn: conn, NodeID: "test-subscriber", TypeURLs: types, Handler: sub,
		Log: slog.New(slog.DiscardHandler), MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Run(ctx)
		close(done)
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return sub
}

func greeterVS(w1, w2 int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - {destination: {host: greeter.demo.svc.cluster.local, subset: v1}, weight: %d}
    - {destination: {host: greeter.demo.svc.cluster.local, subset: v2}, weight: %d}
`, w1, w2)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestFileModeStreamsEditsKeepsTheLastValidStateAndSurvivesRestarts(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	examples, err := os.ReadFile(filepath.Join(root, "examples", "mesh-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "policy.yaml"), string(examples))
	greeter, err := os.ReadFile(filepath.Join(root, "examples", "greeter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	serviceEntry, _, _ := strings.Cut(string(greeter), "\n---\n") // the ServiceEntry, without the routes
	writeFile(t, filepath.Join(dir, "greeter-service.yaml"), serviceEntry)
	routes := filepath.Join(dir, "routes.yaml")
	writeFile(t, routes, greeterVS(80, 20))
	mcpAddr, adminAddr := proc.FreeAddr(t), proc.FreeAddr(t)
	meshFile := filepath.Join(t.TempDir(), "mesh.yaml")
	writeFile(t, meshFile, "trustDomain: demo.example\ndefaultConfig: {discoveryAddress: 127.0.0.1:15010}\n")
	g := startGalleyWith(t, adminAddr, "--config-dir", dir, "--mcp-address", mcpAddr, "--mesh-config-file", meshFile)

	sub := subscribe(t, mcpAddr)
	sub.waitFor(t, "every object", func() bool {
		return sub.weights("default/greeter") == "80/20" &&
			sub.has(kindURL("PeerAuthentication"), "istio-system/default") &&
			sub.has(kindURL("AuthorizationPolicy"), "demo/greeter") &&
			sub.has(registry.ServiceTypeURL, "demo/greeter.demo.svc.cluster.local") &&
			sub.has(registry.EndpointSetTypeURL, "demo/greeter.demo.svc.cluster.local/se-greeter-0") &&
			sub.has(registry.MeshConfigTypeURL, registry.MeshConfigName) &&
			// No cluster lists namespaces: galley serves those its files use,
			// which the injector's policy reads.
			sub.has(registry.NamespaceTypeURL, "demo") && sub.has(registry.NamespaceTypeURL, "istio-system")
	})

	// An edit reaches the subscriber.
	writeFile(t, routes, greeterVS(50, 50))
	sub.waitFor(t, "the edit", func() bool { return sub.weights("default/greeter") == "50/50" })

	// An invalid edit is reported with file and line; the last valid state stays.
	_, before := sub.counts()
	writeFile(t, routes, greeterVS(70, 70))
	g.out.WaitFor(t, "routes.yaml:7: VirtualService default/greeter: spec.http[0].route: destination weights must add up to 100, not 140 (70+70)")
	if got := sub.weights("default/greeter"); got != "50/50" {
		t.Fatalf("after an invalid edit the subscriber has %s, want the last valid 50/50", got)
	}
	if _, after := sub.counts(); after != before {
		t.Fatalf("an invalid edit sent %d changes", after-before)
	}

	// A galley restart that sees the same world changes nothing downstream.
	clean := g.out.Count("problems=0")
	writeFile(t, routes, greeterVS(50, 50))
	g.out.WaitForCount(t, "problems=0", clean+1) // back to the served content: nothing to apply
	callsBefore, changesBefore := sub.counts()
	g.stop(t)
	g2 := startGalleyWith(t, adminAddr, "--config-dir", dir, "--mcp-address", mcpAddr, "--mesh-config-file", meshFile)
	sub.waitFor(t, "the resubscription", func() bool {
		calls, _ := sub.counts()
		return calls >= callsBefore+sub.types
	})
	if _, changes := sub.counts(); changes != changesBefore {
		t.Fatalf("a restart with the same world sent %d changes, want 0: %v", changes-changesBefore, sub.log)
	}

	// Removing a file removes its objects.
	if err := os.Remove(routes); err != nil {
		t.Fatal(err)
	}
	sub.waitFor(t, "the deletion", func() bool { return sub.weights("default/greeter") == "absent" })
	g2.stop(t)
}
