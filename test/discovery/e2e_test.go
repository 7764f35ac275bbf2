// Package discovery_test runs flotilla-galley (file mode) and
// flotilla-discovery as their own processes and drives grpc-go's xDS
// client (proxyless gRPC, a client we did not write) through them against
// real gRPC backends, all on 127.0.0.1.
package discovery_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/xdstest"
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

func TestGalleyDiscoveryAndProxylessClientsRouteAsConfigured(t *testing.T) {
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(90, 10))
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
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(50, 50))
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
			if !ts.Synced {
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
	t.Logf("measured: discovery resubscribed %s after galley was ready again", took)
	time.Sleep(500 * time.Millisecond) // several debounce periods
	after := d.syncz(t)[0]
	for i, ts := range after.Types {
		if ts.SentNonce != before.Types[i].SentNonce {
			t.Errorf("%s was pushed again after galley's restart (nonce %s → %s)", ts.Type, before.Types[i].SentNonce, ts.SentNonce)
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
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
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
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
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
