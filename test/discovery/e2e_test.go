// Package discovery_test runs flotilla-galley (file mode) and
// flotilla-discovery as their own processes and drives grpc-go's xDS
// client (proxyless gRPC, a client we did not write) through them against
// real gRPC backends, all on 127.0.0.1.
package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flotilla-discovery-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := 1
	if err := build.Binaries(dir, "flotilla-galley", "flotilla-discovery", "xdsload"); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type backend struct {
	testgrpc.UnimplementedTestServiceServer
	name string
}

func (b *backend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: b.name}, nil
}

func startBackend(t *testing.T, name string) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, &backend{name: name})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().(*net.TCPAddr).Port
}

type galley struct {
	p          *proc.Process
	mcp, admin string
	dir        string
}

func startGalley(t *testing.T, dir, mcpAddr string) *galley {
	t.Helper()
	g := &galley{mcp: mcpAddr, admin: proc.FreeAddr(t), dir: dir}
	g.p = proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"),
		"--config-dir", dir, "--mcp-address", g.mcp, "--admin-address", g.admin)
	proc.WaitReady(t, "http://"+g.admin+"/readyz")
	return g
}

type discovery struct {
	p          *proc.Process
	xds, admin string
}

func startDiscovery(t *testing.T, galleyAddr string) *discovery {
	t.Helper()
	d := &discovery{xds: proc.FreeAddr(t), admin: proc.FreeAddr(t)}
	d.p = proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--galley-address", galleyAddr, "--xds-address", d.xds, "--admin-address", d.admin, "--debounce-quiet", "20ms")
	proc.WaitReady(t, "http://"+d.admin+"/readyz")
	return d
}

type typeStatus struct {
	Type      string `json:"type"`
	SentNonce string `json:"sentNonce"`
	Synced    bool   `json:"synced"`
}

type proxyStatus struct {
	ID    string       `json:"id"`
	Types []typeStatus `json:"types"`
}

func (d *discovery) syncz(t *testing.T) []proxyStatus {
	t.Helper()
	resp, err := http.Get("http://" + d.admin + "/debug/syncz") //nolint:noctx // test-local
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []proxyStatus
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// client dials target with grpc-go's xDS client; servers lists the
// discovery replicas behind one name, as a Kubernetes Service would.
func client(t *testing.T, nodeID, target string, servers ...string) testgrpc.TestServiceClient {
	t.Helper()
	scheme := fmt.Sprintf("discovery%d", time.Now().UnixNano())
	r := manual.NewBuilderWithScheme(scheme)
	var addrs []resolver.Address
	for _, s := range servers {
		addrs = append(addrs, resolver.Address{Addr: s})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	resolver.Register(r)
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": "%s:///discovery", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "metadata": {"GENERATOR": "grpc"}}
	}`, scheme, nodeID)
	xr, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(xr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

func count(t *testing.T, c testgrpc.TestServiceClient, n int, md ...string) map[string]int {
	t.Helper()
	got := map[string]int{}
	ctx := context.Background()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	for range n {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		resp, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		got[resp.GetHostname()]++
	}
	return got
}

func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for range 600 {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", time.Since(start), what)
	return 0
}

const routing = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend-vs}
spec:
  hosts: [backend-service]
  http:
  - match:
    - headers:
        x-version: {exact: v2}
    route:
    - destination: {host: backend-service, subset: v2}
  - route:
    - destination: {host: backend-service, subset: v1}
      weight: %d
    - destination: {host: backend-service, subset: v2}
      weight: %d
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend-dr}
spec:
  host: backend-service
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 100}
      http: {http2MaxRequests: 1000}
    outlierDetection: {consecutive5xxErrors: 5, interval: 30s, baseEjectionTime: 30s}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy:
      connectionPool:
        http: {http2MaxRequests: 500}
`

func entry(endpoints ...string) string {
	return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend-service}
spec:
  hosts: [backend-service.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: grpc, protocol: GRPC}]
  endpoints:
` + strings.Join(endpoints, "\n") + "\n"
}

func ep(port int, version string) string {
	return fmt.Sprintf("  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: %s}}", port, version)
}

const target = "backend-service.default.svc.cluster.local:80"

func TestGalleyDiscoveryAndProxylessClientsRouteAsConfigured(t *testing.T) {
	v1, v2 := startBackend(t, "v1"), startBackend(t, "v2")
	dir := t.TempDir()
	writeFile(t, dir, "backend.yaml", entry(ep(v1, "v1"), ep(v2, "v2")))
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 90, 10))
	g := startGalley(t, dir, proc.FreeAddr(t))
	d := startDiscovery(t, g.mcp)
	c := client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", target, d.xds)

	got := count(t, c, 1000)
	t.Logf("1000 calls, no header: %v", got)
	if got["v1"]+got["v2"] != 1000 || got["v2"] < 60 || got["v2"] > 140 {
		t.Fatalf("split %v, want about 900/100 (v2 within 60..140) and no errors", got)
	}
	if got := count(t, c, 100, "x-version", "v2"); got["v2"] != 100 {
		t.Fatalf("x-version: v2 → %v, want all 100 to v2", got)
	}
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 0, 100))
	took := eventually(t, "the 0/100 split", func() bool { return count(t, c, 20)["v2"] == 20 })
	t.Logf("measured: file edit to all traffic on v2 through galley and discovery: %s", took)
	if got := count(t, c, 200); got["v2"] != 200 {
		t.Fatalf("after 0/100: %v", got)
	}
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 100, 0))
	eventually(t, "the 100/0 split", func() bool { return count(t, c, 20)["v1"] == 20 })
	v1b := startBackend(t, "v1b")
	writeFile(t, dir, "backend.yaml", entry(ep(v1, "v1"), ep(v1b, "v1"), ep(v2, "v2")))
	eventually(t, "the added endpoint to serve", func() bool { return count(t, c, 50)["v1b"] > 0 })
	writeFile(t, dir, "backend.yaml", entry(ep(v1b, "v1"), ep(v2, "v2")))
	eventually(t, "no more calls to the removed endpoint", func() bool { return count(t, c, 50)["v1"] == 0 })
	if got := count(t, c, 200); got["v1b"] != 200 {
		t.Fatalf("after removing an endpoint: %v", got)
	}
	if err := d.p.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("discovery after SIGTERM: %v", err)
	}
	if err := g.p.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("galley after SIGTERM: %v", err)
	}
}

func TestWithGalleyGoneClientsKeepRoutingAndItsReturnPushesNothing(t *testing.T) {
	v1, v2 := startBackend(t, "v1"), startBackend(t, "v2")
	dir := t.TempDir()
	writeFile(t, dir, "backend.yaml", entry(ep(v1, "v1"), ep(v2, "v2")))
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 50, 50))
	mcpAddr := proc.FreeAddr(t)
	g := startGalley(t, dir, mcpAddr)
	d := startDiscovery(t, g.mcp)
	c := client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", target, d.xds)
	if got := count(t, c, 100); got["v1"]+got["v2"] != 100 {
		t.Fatalf("before: %v", got)
	}
	eventually(t, "every type acknowledged", func() bool {
		st := d.syncz(t)
		if len(st) != 1 || len(st[0].Types) != 4 {
			return false
		}
		for _, ts := range st[0].Types {
			if !ts.Synced {
				return false
			}
		}
		return true
	})
	before := d.syncz(t)[0]

	g.p.Kill(t)
	if got := count(t, c, 200); got["v1"]+got["v2"] != 200 {
		t.Fatalf("with galley killed: %v", got)
	}
	proc.WaitReady(t, "http://"+d.admin+"/readyz") // still serving

	g2 := startGalley(t, dir, mcpAddr)
	took := eventually(t, "discovery to resubscribe", func() bool { return strings.Contains(g2.p.Out.String(), "subscriber connected") })
	t.Logf("measured: discovery resubscribed %s after galley was ready again", took)
	time.Sleep(500 * time.Millisecond) // several debounce periods
	after := d.syncz(t)[0]
	for i, ts := range after.Types {
		if ts.SentNonce != before.Types[i].SentNonce {
			t.Errorf("%s was pushed again after galley's restart (nonce %s → %s)", ts.Type, before.Types[i].SentNonce, ts.SentNonce)
		}
	}
	if got := count(t, c, 100); got["v1"]+got["v2"] != 100 {
		t.Fatalf("after galley's return: %v", got)
	}
	// And changes flow again.
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 0, 100))
	eventually(t, "a change after galley's return", func() bool { return count(t, c, 20)["v2"] == 20 })
}

func TestClientsMoveToAnotherDiscoveryReplicaAndKeepRouting(t *testing.T) {
	v1, v2 := startBackend(t, "v1"), startBackend(t, "v2")
	dir := t.TempDir()
	writeFile(t, dir, "backend.yaml", entry(ep(v1, "v1"), ep(v2, "v2")))
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 100, 0))
	g := startGalley(t, dir, proc.FreeAddr(t))
	d1 := startDiscovery(t, g.mcp)
	d2 := startDiscovery(t, g.mcp)
	c := client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", target, d1.xds, d2.xds)
	if got := count(t, c, 50); got["v1"] != 50 {
		t.Fatalf("before: %v", got)
	}
	if len(d1.syncz(t)) != 1 || len(d2.syncz(t)) != 0 {
		t.Fatal("the client is not on the first replica")
	}
	d1.p.Kill(t)
	killed := time.Now()
	failed := 0
	moved := eventually(t, "the client on the second replica", func() bool {
		got := count(t, c, 10)
		failed += 10 - got["v1"]
		return len(d2.syncz(t)) == 1
	})
	t.Logf("measured: reconnected to the other replica %s after the kill; %d calls failed meanwhile", moved, failed)
	if failed > 0 {
		t.Errorf("%d calls failed while the client moved replicas", failed)
	}
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 0, 100))
	took := eventually(t, "a change through the second replica", func() bool { return count(t, c, 20)["v2"] == 20 })
	t.Logf("measured: a change reached the client through the second replica %s later (%s after the kill)", took, time.Since(killed))
}

func TestDiscoveryServesADirectoryOnItsOwn(t *testing.T) {
	v1, v2 := startBackend(t, "v1"), startBackend(t, "v2")
	dir := t.TempDir()
	writeFile(t, dir, "backend.yaml", entry(ep(v1, "v1"), ep(v2, "v2")))
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 0, 100))
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	d := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin, "--debounce-quiet", "20ms")
	proc.WaitReady(t, "http://"+admin+"/readyz")
	c := client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", target, xdsAddr)
	if got := count(t, c, 50); got["v2"] != 50 {
		t.Fatalf("0/100 from --config-dir: %v", got)
	}
	writeFile(t, dir, "routing.yaml", fmt.Sprintf(routing, 100, 0))
	eventually(t, "the edit", func() bool { return count(t, c, 20)["v1"] == 20 })
	// An invalid edit is reported with its file and line, and the rest is
	// still served.
	writeFile(t, dir, "broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec:\n  hosts: []\n")
	d.Out.WaitFor(t, "broken.yaml:4: VirtualService default/broken: spec")
	if got := count(t, c, 20); got["v1"] != 20 {
		t.Fatalf("after an invalid file: %v", got)
	}
	if err := d.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("discovery after SIGTERM: %v", err)
	}
}
