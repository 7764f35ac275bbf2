package xds_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/discovery/ingest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

func quiet() *slog.Logger {
	if os.Getenv("FLOTILLA_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// mesh is discovery in-process: a config dir, the file source, the
// debouncer and the ADS server on 127.0.0.1.
type mesh struct {
	dir  string
	addr string
	srv  *xds.Server
}

func startDiscovery(t *testing.T, files map[string]string) *mesh {
	t.Helper()
	m := &mesh{dir: t.TempDir()}
	for name, content := range files {
		xdstest.WriteFile(t, m.dir, name, content)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var err error
	m.srv, err = xds.New(xds.Options{Log: quiet(), Meter: noop.NewMeterProvider().Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ingest.New(ingest.Options{
		Log: quiet(), Meter: noop.NewMeterProvider().Meter("test"), Quiet: 20 * time.Millisecond, Max: time.Second,
		TypeURLs: model.TypeURLs(), Push: m.srv.Push,
	})
	if err != nil {
		t.Fatal(err)
	}
	src := ingest.NewFiles(ingest.FileOptions{Dir: m.dir, DefaultNamespace: "default", DomainSuffix: "cluster.local", Log: quiet()}, in)
	go func() { _ = src.Run(ctx) }()
	go func() { _ = in.Run(ctx) }()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(xds.ServerOption())
	m.srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	m.addr = lis.Addr().String()
	return m
}

func TestProxylessGRPCClientsFollowTheSeedRouting(t *testing.T) {
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	m := startDiscovery(t, map[string]string{
		"backend.yaml": xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")),
		"routing.yaml": xdstest.Routing(90, 10),
	})
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, m.addr)

	got := xdstest.Count(t, c, 1000)
	t.Logf("1000 calls without a header: %v", got)
	if got["v1"]+got["v2"] != 1000 || got["v2"] < 60 || got["v2"] > 140 {
		t.Fatalf("split %v, want about 900/100 (v2 within 60..140)", got)
	}
	if got := xdstest.Count(t, c, 100, "x-version", "v2"); got["v2"] != 100 {
		t.Fatalf("with x-version: v2: %v, want all 100 to v2", got)
	}

	xdstest.WriteFile(t, m.dir, "routing.yaml", xdstest.Routing(0, 100))
	xdstest.Eventually(t, "the 0/100 split", func() bool { return xdstest.Count(t, c, 20)["v2"] == 20 })
	if got := xdstest.Count(t, c, 200); got["v2"] != 200 {
		t.Fatalf("after 0/100: %v", got)
	}

	// An endpoint-only change: v2's endpoint goes away; with the route
	// back to v1 only its endpoint serves.
	xdstest.WriteFile(t, m.dir, "routing.yaml", xdstest.Routing(100, 0))
	xdstest.Eventually(t, "the 100/0 split", func() bool { return xdstest.Count(t, c, 20)["v1"] == 20 })
	v1b := xdstest.StartBackend(t, "v1b")
	xdstest.WriteFile(t, m.dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v1b, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.Eventually(t, "the new v1 endpoint to serve", func() bool { return xdstest.Count(t, c, 50)["v1b"] > 0 })
	xdstest.WriteFile(t, m.dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1b, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.Eventually(t, "the removed endpoint to get no more calls", func() bool { return xdstest.Count(t, c, 50)["v1"] == 0 })
	if got := xdstest.Count(t, c, 200); got["v1"] != 0 || got["v1b"] != 200 {
		t.Fatalf("after removing an endpoint: %v", got)
	}

	st := m.srv.Status()
	if len(st) != 1 {
		t.Fatalf("status of %d proxies", len(st))
	}
	for _, ts := range st[0].Types {
		if ts.Status != debugapi.Synced {
			t.Errorf("%s: %s %s", ts.TypeURL, ts.Status, ts.Nack)
		}
	}
}

// TestAPortLevelConsistentHashKeepsEachHeaderValueOnOneBackend: grpc-go's
// own xDS client, with a DestinationRule whose top level says ROUND_ROBIN
// and whose entry for port 80 hashes on x-user: by Istio's rule the port
// level replaces the top level, so calls with one x-user value all reach
// one backend, and calls without the header still spread.
func TestAPortLevelConsistentHashKeepsEachHeaderValueOnOneBackend(t *testing.T) {
	a, b, c := xdstest.StartBackend(t, "a"), xdstest.StartBackend(t, "b"), xdstest.StartBackend(t, "c")
	m := startDiscovery(t, map[string]string{
		"backend.yaml": xdstest.Backend(xdstest.Endpoint(a, "v1"), xdstest.Endpoint(b, "v1"), xdstest.Endpoint(c, "v1")),
		"rule.yaml": `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend}
spec:
  host: backend-service.default.svc.cluster.local
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    portLevelSettings:
    - port: {number: 80}
      loadBalancer: {consistentHash: {httpHeaderName: x-user}}
`,
	})
	client := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, m.addr)
	for _, user := range []string{"alice", "bob", "carol", "dave"} {
		got := xdstest.Count(t, client, 30, "x-user", user)
		if len(got) != 1 {
			t.Fatalf("x-user %s reached %v, want one backend", user, got)
		}
		t.Logf("x-user %s → %v", user, got)
	}
	// Without the header grpc-go hashes a random value per call: the
	// calls spread.
	if got := xdstest.Count(t, client, 60); len(got) < 2 {
		t.Fatalf("calls without x-user all reached %v", got)
	}
}

// TestLocalityFailoverMovesCallsToTheNextLocalityWhenTheLocalOnesFail:
// grpc-go's own xDS client in us-east/a/1, backends there and in eu. With
// outlier detection and no localityLbSetting, Istio's default (locality
// load balancing enabled, failover needs outlier detection) puts the
// local backend first: every call goes there. When it stops, grpc-go's
// priority policy moves the calls to eu; when another backend takes the
// local locality's place (an endpoint change), the calls go back to it.
// Without outlier detection there is no failover order and calls spread.
func TestLocalityFailoverMovesCallsToTheNextLocalityWhenTheLocalOnesFail(t *testing.T) {
	local, stopLocal := xdstest.StartStoppableBackend(t, "local")
	remote := xdstest.StartBackend(t, "remote")
	rule := `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend}
spec:
  host: backend-service.default.svc.cluster.local
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    outlierDetection: {consecutive5xxErrors: 5, interval: 1s, baseEjectionTime: 30s}
`
	m := startDiscovery(t, map[string]string{
		"backend.yaml": xdstest.Backend(xdstest.EndpointAt(local, "v1", "us-east/a/1"), xdstest.EndpointAt(remote, "v1", "eu/x/1")),
		"rule.yaml":    rule,
	})
	c := xdstest.ClientAt(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", "us-east/a/1", xdstest.Target, m.addr)
	if got := xdstest.Count(t, c, 100); got["local"] != 100 {
		t.Fatalf("with both up: %v, want all 100 to the local backend", got)
	}

	stopLocal()
	took := xdstest.Eventually(t, "calls to fail over to eu", func() bool { return xdstest.Count(t, c, 10)["remote"] == 10 })
	t.Logf("failed over in %s", took)
	if got := xdstest.Count(t, c, 100); got["remote"] != 100 {
		t.Fatalf("after the local backend stopped: %v, want all 100 to eu", got)
	}

	// Without outlier detection Istio gives no failover order: one
	// priority, the calls spread over both localities.
	both := xdstest.StartBackend(t, "local-again")
	xdstest.WriteFile(t, m.dir, "backend.yaml", xdstest.Backend(xdstest.EndpointAt(both, "v1", "us-east/a/1"), xdstest.EndpointAt(remote, "v1", "eu/x/1")))
	xdstest.Eventually(t, "the new local backend to take the calls", func() bool { return xdstest.Count(t, c, 10)["local-again"] == 10 })
	xdstest.WriteFile(t, m.dir, "rule.yaml", strings.Replace(rule, "    outlierDetection: {consecutive5xxErrors: 5, interval: 1s, baseEjectionTime: 30s}\n", "", 1))
	xdstest.Eventually(t, "calls to spread without outlier detection", func() bool {
		got := xdstest.Count(t, c, 40)
		return got["local-again"] > 0 && got["remote"] > 0
	})
}

// TestProxylessClientsRetryUnavailableByDefaultAndNotWhenTheVirtualServiceTurnsRetriesOff:
// a backend that answers every second call UNAVAILABLE, reached by
// grpc-go's own xDS client. By default a proxyless client gets Istio's
// default retry policy (translateRoute gives every proxy
// retry.ConvertPolicy of the mesh default: two retries, of which grpc-go
// reads "unavailable" and "cancelled"), so every call succeeds, some on a
// retry; a VirtualService with retries.attempts 0 turns retries off, as in
// Istio, and half the calls fail.
func TestProxylessClientsRetryUnavailableByDefaultAndNotWhenTheVirtualServiceTurnsRetriesOff(t *testing.T) {
	port, calls := xdstest.StartFlakyBackend(t, "flaky", 2)
	m := startDiscovery(t, map[string]string{"backend.yaml": xdstest.Backend(xdstest.Endpoint(port, "v1"))})
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, m.addr)
	before := calls()
	if got := xdstest.Count(t, c, 40); got["flaky"] != 40 {
		t.Fatalf("with the default retries: %v, want all 40 answered", got)
	}
	// A failed call's retry lands on a call the backend answers, so each
	// call is retried at most once, and some are.
	if extra := calls() - before - 40; extra < 1 || extra > 40 {
		t.Fatalf("%d retries for 40 calls to a backend failing every second call, want 1 to 40", extra)
	}

	xdstest.WriteFile(t, m.dir, "retries.yaml", `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend}
spec:
  hosts: [backend-service.default.svc.cluster.local]
  http:
  - route: [{destination: {host: backend-service.default.svc.cluster.local}}]
    retries: {attempts: 0}
`)
	xdstest.Eventually(t, "retries to be turned off", func() bool { return xdstest.Count(t, c, 10)["flaky"] < 10 })
	if got := xdstest.Count(t, c, 40); got["flaky"] != 20 {
		t.Fatalf("without retries: %v, want 20 of 40 calls answered", got)
	}
}
