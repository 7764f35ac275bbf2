// Package discovery_test runs flotilla-galley (file mode) and
// flotilla-discovery as their own processes and drives grpc-go's xDS
// client (proxyless gRPC, a client we did not write) through them against
// real gRPC backends, all on 127.0.0.1.
package discovery_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	_ "github.com/flotilla-mesh/flotilla/internal/translate" // the Envoy types a dump holds, to print it
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, nil, "flotilla-galley", "flotilla-discovery", "xdsload"))
}

// seedDir starts the seed example's two backends, v1 and v2, and writes
// its configuration (the backend service and a v1/v2 split) into a new
// directory.
func seedDir(t *testing.T, v1Weight, v2Weight int) (dir string, v1, v2 int) {
	t.Helper()
	v1, v2 = xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	dir = t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(v1Weight, v2Weight))
	return dir, v1, v2
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

// syncz is the replica's sync state, read as flotilla proxy-status reads
// it (debug types over the plain-text xDS port, on loopback).
func (d *discovery) syncz(t *testing.T) []debugapi.ProxySync {
	t.Helper()
	return synczAt(t, d.xds)
}

func synczAt(t *testing.T, xdsAddr string) []debugapi.ProxySync {
	t.Helper()
	resp := debugFetch(t, xdsAddr, debugapi.Syncz)
	out, err := debugapi.Syncs(resp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func debugFetch(t *testing.T, xdsAddr, typeURL string, names ...string) *discoveryv3.DiscoveryResponse {
	t.Helper()
	cc, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := debugapi.Fetch(ctx, cc, typeURL, names...)
	if err != nil {
		t.Fatalf("%s at %s: %v", typeURL, xdsAddr, err)
	}
	return resp
}

func TestGalleyDiscoveryAndProxylessClientsRouteAsConfigured(t *testing.T) {
	dir, v1, v2 := seedDir(t, 90, 10)
	g := startGalley(t, dir, proc.FreeAddr(t))
	d := startDiscovery(t, g.mcp)
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, d.xds)

	got := xdstest.Count(t, c, 1000)
	t.Logf("1000 calls, no header: %v", got)
	if got["v1"]+got["v2"] != 1000 || got["v2"] < 60 || got["v2"] > 140 {
		t.Fatalf("split %v, want about 900/100 (v2 within 60..140) and no errors", got)
	}
	if got := xdstest.Count(t, c, 100, "x-version", "v2"); got["v2"] != 100 {
		t.Fatalf("x-version: v2 → %v, want all 100 to v2", got)
	}
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	took := xdstest.Eventually(t, "the 0/100 split", func() bool { return xdstest.Count(t, c, 20)["v2"] == 20 })
	t.Logf("measured: file edit to all traffic on v2 through galley and discovery: %s", took)
	if got := xdstest.Count(t, c, 200); got["v2"] != 200 {
		t.Fatalf("after 0/100: %v", got)
	}
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
	xdstest.Eventually(t, "the 100/0 split", func() bool { return xdstest.Count(t, c, 20)["v1"] == 20 })
	v1b := xdstest.StartBackend(t, "v1b")
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v1b, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.Eventually(t, "the added endpoint to serve", func() bool { return xdstest.Count(t, c, 50)["v1b"] > 0 })
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1b, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.Eventually(t, "no more calls to the removed endpoint", func() bool { return xdstest.Count(t, c, 50)["v1"] == 0 })
	if got := xdstest.Count(t, c, 200); got["v1b"] != 200 {
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
	dir, _, _ := seedDir(t, 50, 50)
	mcpAddr := proc.FreeAddr(t)
	g := startGalley(t, dir, mcpAddr)
	d := startDiscovery(t, g.mcp)
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, d.xds)
	if got := xdstest.Count(t, c, 100); got["v1"]+got["v2"] != 100 {
		t.Fatalf("before: %v", got)
	}
	xdstest.Eventually(t, "every type acknowledged", func() bool {
		st := d.syncz(t)
		if len(st) != 1 || len(st[0].Types) != 4 {
			return false
		}
		for _, ts := range st[0].Types {
			if ts.Status != debugapi.Synced {
				return false
			}
		}
		return true
	})
	before := d.syncz(t)[0]

	g.p.Kill(t)
	if got := xdstest.Count(t, c, 200); got["v1"]+got["v2"] != 200 {
		t.Fatalf("with galley killed: %v", got)
	}
	proc.WaitReady(t, "http://"+d.admin+"/readyz") // still serving

	g2 := startGalley(t, dir, mcpAddr)
	took := xdstest.Eventually(t, "discovery to resubscribe", func() bool { return strings.Contains(g2.p.Out.String(), "subscriber connected") })
	t.Logf("measured: galley logged discovery's subscription %s after it was ready again (it logs a subscriber once it has stayed a second)", took)
	time.Sleep(500 * time.Millisecond) // several debounce periods
	after := d.syncz(t)[0]
	for i, ts := range after.Types {
		if !ts.SentAt.Equal(before.Types[i].SentAt) {
			t.Errorf("%s was pushed again after galley's restart (sent at %s, then at %s)", ts.TypeURL, before.Types[i].SentAt, ts.SentAt)
		}
	}
	if got := xdstest.Count(t, c, 100); got["v1"]+got["v2"] != 100 {
		t.Fatalf("after galley's return: %v", got)
	}
	// And changes flow again.
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	xdstest.Eventually(t, "a change after galley's return", func() bool { return xdstest.Count(t, c, 20)["v2"] == 20 })
}

func TestClientsMoveToAnotherDiscoveryReplicaAndKeepRouting(t *testing.T) {
	dir, _, _ := seedDir(t, 100, 0)
	g := startGalley(t, dir, proc.FreeAddr(t))
	d1 := startDiscovery(t, g.mcp)
	d2 := startDiscovery(t, g.mcp)
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, d1.xds, d2.xds)
	if got := xdstest.Count(t, c, 50); got["v1"] != 50 {
		t.Fatalf("before: %v", got)
	}
	if len(d1.syncz(t)) != 1 || len(d2.syncz(t)) != 0 {
		t.Fatal("the client is not on the first replica")
	}
	d1.p.Kill(t)
	killed := time.Now()
	failed := 0
	moved := xdstest.Eventually(t, "the client on the second replica", func() bool {
		got := xdstest.Count(t, c, 10)
		failed += 10 - got["v1"]
		return len(d2.syncz(t)) == 1
	})
	t.Logf("measured: reconnected to the other replica %s after the kill; %d calls failed meanwhile", moved, failed)
	if failed > 0 {
		t.Errorf("%d calls failed while the client moved replicas", failed)
	}
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	took := xdstest.Eventually(t, "a change through the second replica", func() bool { return xdstest.Count(t, c, 20)["v2"] == 20 })
	t.Logf("measured: a change reached the client through the second replica %s later (%s after the kill)", took, time.Since(killed))
}

func TestDiscoveryServesADirectoryOnItsOwn(t *testing.T) {
	dir, _, _ := seedDir(t, 0, 100)
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	d := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin, "--debounce-quiet", "20ms")
	proc.WaitReady(t, "http://"+admin+"/readyz")
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, xdsAddr)
	if got := xdstest.Count(t, c, 50); got["v2"] != 50 {
		t.Fatalf("0/100 from --config-dir: %v", got)
	}
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
	xdstest.Eventually(t, "the edit", func() bool { return xdstest.Count(t, c, 20)["v1"] == 20 })
	// An invalid edit is reported with its file and line, and the rest is
	// still served.
	xdstest.WriteFile(t, dir, "broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec:\n  hosts: []\n")
	d.Out.WaitFor(t, "broken.yaml:4: VirtualService default/broken: spec")
	if got := xdstest.Count(t, c, 20); got["v1"] != 20 {
		t.Fatalf("after an invalid file: %v", got)
	}
	if err := d.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("discovery after SIGTERM: %v", err)
	}
}

// TestTheSameDirectoryYieldsTheSameXDSThroughGalleyOrOnItsOwn gives one
// directory to galley (discovery subscribed to it) and to discovery's own
// --config-dir, with a mesh configuration, ServiceEntries, WorkloadEntries,
// routing, security policy, an invalid object and an object defined in two
// files: both discoveries must generate the same xDS for the same proxy,
// because both read the directory through the one file source and
// publisher.
func TestTheSameDirectoryYieldsTheSameXDSThroughGalleyOrOnItsOwn(t *testing.T) {
	dir, _, _ := seedDir(t, 30, 70)
	xdstest.WriteFile(t, dir, "policy.yaml", readExample(t, "mesh-policy.yaml"))
	xdstest.WriteFile(t, dir, "vm.yaml", `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1}
spec: {address: 10.9.0.1, labels: {app: legacy}, serviceAccount: legacy}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: legacy}
spec: {host: legacy.example.com, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy}
spec:
  hosts: [legacy.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: http, number: 8080, protocol: HTTP}]
  workloadSelector: {labels: {app: legacy}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken}
spec: {hosts: []}
`)
	// The same object again in a later file: the first file's definition
	// stands in both.
	xdstest.WriteFile(t, dir, "z-duplicate.yaml", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: legacy}\nspec: {hosts: [other.example.com], ports: [{name: tcp, number: 9, protocol: TCP}], resolution: NONE}\n")
	mesh := filepath.Join(t.TempDir(), "mesh.yaml")
	xdstest.WriteFile(t, filepath.Dir(mesh), "mesh.yaml", "outboundTrafficPolicy: {mode: REGISTRY_ONLY}\ntrustDomain: example.org\n")

	galleyAdmin, galleyMCP := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"),
		"--config-dir", dir, "--mesh-config-file", mesh, "--mcp-address", galleyMCP, "--admin-address", galleyAdmin)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	viaGalley := startDiscovery(t, galleyMCP)
	onItsOwn := &discovery{xds: proc.FreeAddr(t), admin: proc.FreeAddr(t)}
	onItsOwn.p = proc.Start(t, "discovery-files", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--mesh-config-file", mesh, "--xds-address", onItsOwn.xds, "--admin-address", onItsOwn.admin)
	proc.WaitReady(t, "http://"+onItsOwn.admin+"/readyz")

	// A proxyless gRPC client that calls through each, and an Envoy
	// sidecar's stream (everything it can see) on each.
	const proxyless = "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local"
	const sidecar = "sidecar~10.0.0.8~app-1.default~default.svc.cluster.local"
	dumps := map[string]map[string]any{}
	for name, d := range map[string]*discovery{"via galley": viaGalley, "on its own": onItsOwn} {
		c := xdstest.Client(t, proxyless, xdstest.Target, d.xds)
		if got := xdstest.Count(t, c, 20); got["v1"]+got["v2"] != 20 {
			t.Fatalf("%s: calls %v", name, got)
		}
		openSidecarStream(t, d.xds, sidecar)
		for _, node := range []string{proxyless, sidecar} {
			dump := configDump(t, d, node)
			dumps[name+" "+node] = dump
		}
	}
	for _, node := range []string{proxyless, sidecar} {
		if diff := cmp.Diff(dumps["via galley "+node], dumps["on its own "+node]); diff != "" {
			t.Fatalf("the same directory gave %s different xDS (- via galley, + on its own):\n%s", node, diff)
		}
	}
	// What both say is what the directory says: the duplicate and the
	// invalid object left out, the mesh configuration in force.
	raw, err := json.Marshal(dumps["via galley "+sidecar])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"legacy.example.com", "10.9.0.1", "BlackHoleCluster", "spiffe://example.org/"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the xDS lacks %q", want)
		}
	}
	for _, unwanted := range []string{"other.example.com", "broken"} {
		if strings.Contains(string(raw), unwanted) {
			t.Errorf("the xDS holds %q", unwanted)
		}
	}
}

// openSidecarStream connects as an Envoy sidecar asking for clusters, and
// keeps the stream open until the test ends.
func openSidecarStream(t *testing.T, addr, node string) {
	t.Helper()
	st := adsStream(t, addr, node, nil, resourcev3.ClusterType)
	if resp, err := st.Recv(); err != nil || len(resp.GetResources()) == 0 {
		t.Fatalf("sidecar stream: %d clusters, %v", len(resp.GetResources()), err)
	}
}

func readExample(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// configDump is what the replica would send a proxy now, as JSON.
func configDump(t *testing.T, d *discovery, proxy string) map[string]any {
	t.Helper()
	resp := debugFetch(t, d.xds, debugapi.ConfigDump, proxy)
	var sections []any
	for _, a := range resp.GetResources() {
		b, err := protojson.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		sections = append(sections, v)
	}
	return map[string]any{"sections": sections}
}
