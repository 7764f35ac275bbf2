package discovery_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// services is n ServiceEntries with HTTP ports, so that a sidecar's
// clusters and listeners are far more than one HTTP/2 flow-control window.
func services(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %[1]s-%[2]d}
spec:
  hosts: [%[1]s-%[2]d.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.3.%[3]d.%[4]d}]
`, prefix, i, i/250, i%250+1)
	}
	return b.String()
}

// neverReading opens a sidecar's ADS stream with a 64 KiB flow-control
// window, asks for clusters and listeners and never reads an answer. Its
// connection stays healthy: gRPC answers keepalive pings on its own.
func neverReading(t *testing.T, addr, node string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNeverReadingProxiesDelayNoOneElse: five sidecars that never read
// (more than discovery's translation slots) stay connected while the
// configuration changes; a healthy proxyless client gets every change,
// and a proxy that connects later gets its configuration.
func TestNeverReadingProxiesDelayNoOneElse(t *testing.T) {
	dir, _, _ := seedDir(t, 100, 0)
	xdstest.WriteFile(t, dir, "many.yaml", services("many", 600))
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	d := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin, "--debounce-quiet", "20ms")
	proc.WaitReady(t, "http://"+admin+"/readyz")

	healthy := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, xdsAddr)
	if got := xdstest.Count(t, healthy, 20); got["v1"] != 20 {
		t.Fatalf("before the slow proxies: %v", got)
	}
	for i := range 5 {
		neverReading(t, xdsAddr, fmt.Sprintf("sidecar~10.0.1.%d~stuck-%d.default~default.svc.cluster.local", i+1, i))
	}
	// Every change adds services (new clusters and listeners for the
	// sidecars, more than their windows hold) and moves the split.
	for step, w := range []int{0, 100, 0, 100, 0, 100} {
		xdstest.WriteFile(t, dir, fmt.Sprintf("more-%d.yaml", step), services(fmt.Sprintf("more%d", step), 50))
		xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(w, 100-w))
		want := "v1"
		if w == 0 {
			want = "v2"
		}
		took := xdstest.EventuallyWithin(t, 15*time.Second, fmt.Sprintf("change %d reaching the healthy client", step+1), func() bool {
			return xdstest.Count(t, healthy, 10)[want] == 10
		})
		t.Logf("change %d reached the healthy client in %s", step+1, took.Round(time.Millisecond))
	}
	late := xdstest.Client(t, "sidecar~10.0.0.10~client-2.default~default.svc.cluster.local", xdstest.Target, xdsAddr)
	xdstest.EventuallyWithin(t, 15*time.Second, "a proxy connecting now configured", func() bool {
		return xdstest.Count(t, late, 10)["v1"] == 10
	})
	if n := d.Out.Count("panic"); n > 0 {
		t.Fatalf("discovery panicked:\n%s", d.Out.String())
	}
}

// TestANackLoopIsLoggedOnceAndSlowedDown: a sidecar rejecting the same
// response again and again with a long reason for 5 s gets one log line,
// is served at a bounded rate, and another proxy is still served.
func TestANackLoopIsLoggedOnceAndSlowedDown(t *testing.T) {
	v1 := xdstest.StartBackend(t, "v1")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1")))
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	d := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin)
	proc.WaitReady(t, "http://"+admin+"/readyz")
	cc, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const node = "sidecar~10.0.0.7~nacker.default~default.svc.cluster.local"
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	nack := &discoveryv3.DiscoveryRequest{
		TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: strings.Repeat("the cluster is not to my liking ", 125)},
	}
	sent := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); sent++ {
		if err := st.Send(nack); err != nil {
			t.Fatal(err)
		}
	}
	healthy := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, xdsAddr)
	if got := xdstest.Count(t, healthy, 10); got["v1"] != 10 {
		t.Fatalf("another proxy during the NACK loop: %v", got)
	}
	d.Out.WaitFor(t, "proxy rejected a response")
	if n := d.Out.Count("proxy rejected a response"); n != 1 {
		t.Fatalf("%d NACK log lines for %d NACKs of one response, want 1", n, sent)
	}
	if n := len(d.Out.String()); n > 64<<10 {
		t.Fatalf("discovery logged %d bytes during the NACK loop", n)
	}
	var proxies []debugapi.ProxySync
	xdstest.Eventually(t, "the repeats counted", func() bool {
		proxies = synczAt(t, xdsAddr)
		for _, p := range proxies {
			for _, ts := range p.Types {
				if p.ID == node && ts.Status == debugapi.Nacked && ts.NackRepeats > 0 {
					return true
				}
			}
		}
		return false
	})
	t.Logf("%d NACKs sent in 5 s (the client is slowed once over 100 at 50 a second)", sent)
}

// TestAChangeMadeWhileGalleyWasDownArrivesOnceItIsBackAndDiscoveryRetriesAtLeastEverySecond:
// galley is away long enough for reconnect backoffs to have grown (12 s);
// a change made meanwhile reaches a proxy once galley is back (how long
// that takes is logged, not asserted: a benchmark's figure), and every
// wait discovery logged before resubscribing is at most a second — at
// least one such line must be there, or nothing was checked.
func TestAChangeMadeWhileGalleyWasDownArrivesOnceItIsBackAndDiscoveryRetriesAtLeastEverySecond(t *testing.T) {
	dir, _, _ := seedDir(t, 100, 0)
	mcpAddr := proc.FreeAddr(t)
	g := startGalley(t, dir, mcpAddr)
	d := startDiscovery(t, g.mcp)
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, d.xds)
	if got := xdstest.Count(t, c, 20); got["v1"] != 20 {
		t.Fatalf("before: %v", got)
	}
	g.p.Kill(t)
	time.Sleep(12 * time.Second)
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	startGalley(t, dir, mcpAddr)
	back := time.Now()
	xdstest.Eventually(t, "the change made while galley was down", func() bool { return xdstest.Count(t, c, 10)["v2"] == 10 })
	t.Logf("measured: the change reached the proxy %s after galley was ready again", time.Since(back).Round(10*time.Millisecond))
	waits := 0
	for _, l := range strings.Split(d.p.Out.String(), "\n") {
		_, wait, ok := strings.Cut(l, "subscription broken; reconnecting")
		if !ok {
			continue
		}
		_, in, ok := strings.Cut(wait, " in=")
		if !ok {
			t.Errorf("a reconnect line without its wait: %s", l)
			continue
		}
		dur, err := time.ParseDuration(strings.Fields(in)[0])
		if err != nil {
			t.Errorf("a reconnect line whose wait does not parse: %s", l)
			continue
		}
		waits++
		if dur > time.Second {
			t.Errorf("discovery waited %s before resubscribing: %s", dur, l)
		}
	}
	if waits == 0 {
		t.Errorf("discovery logged no wait before resubscribing while galley was down: the backoff was not checked\n%s", d.p.Out.String())
	}
}
