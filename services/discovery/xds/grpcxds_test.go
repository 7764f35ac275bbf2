package xds_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/services/discovery/ingest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

func quiet() *slog.Logger {
	if os.Getenv("FLOTILLA_TEST_VERBOSE") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// backend is a gRPC test server that answers UnaryCall with its name.
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
		m.write(t, name, content)
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
	gs := grpc.NewServer()
	m.srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	m.addr = lis.Addr().String()
	return m
}

func (m *mesh) write(t *testing.T, name, content string) {
	t.Helper()
	tmp := filepath.Join(m.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, name)); err != nil {
		t.Fatal(err)
	}
}

// client dials target through grpc-go's own xDS client with a bootstrap
// pointing at discovery.
func (m *mesh) client(t *testing.T, nodeID, target string) testgrpc.TestServiceClient {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "metadata": {"GENERATOR": "grpc"}}
	}`, m.addr, nodeID)
	r, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// count makes n calls and counts the answers by backend name.
func count(t *testing.T, c testgrpc.TestServiceClient, n int, md ...string) map[string]int {
	t.Helper()
	got := map[string]int{}
	ctx := context.Background()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	for range n {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		got[resp.GetHostname()]++
	}
	return got
}

// eventually polls cond for up to 10 s (bounded: 200 tries).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

const seedRouting = `apiVersion: networking.istio.io/v1alpha3
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
apiVersion: networking.istio.io/v1alpha3
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

func backendEntry(endpoints ...string) string {
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

func endpoint(port int, version string) string {
	return fmt.Sprintf("  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: %s}}", port, version)
}

func TestProxylessGRPCClientsFollowTheSeedRouting(t *testing.T) {
	v1, v2 := startBackend(t, "v1"), startBackend(t, "v2")
	m := startDiscovery(t, map[string]string{
		"backend.yaml": backendEntry(endpoint(v1, "v1"), endpoint(v2, "v2")),
		"routing.yaml": fmt.Sprintf(seedRouting, 90, 10),
	})
	c := m.client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", "backend-service.default.svc.cluster.local:80")

	got := count(t, c, 1000)
	t.Logf("1000 calls without a header: %v", got)
	if got["v1"]+got["v2"] != 1000 || got["v2"] < 60 || got["v2"] > 140 {
		t.Fatalf("split %v, want about 900/100 (v2 within 60..140)", got)
	}
	if got := count(t, c, 100, "x-version", "v2"); got["v2"] != 100 {
		t.Fatalf("with x-version: v2: %v, want all 100 to v2", got)
	}

	m.write(t, "routing.yaml", fmt.Sprintf(seedRouting, 0, 100))
	eventually(t, "the 0/100 split", func() bool { return count(t, c, 20)["v2"] == 20 })
	if got := count(t, c, 200); got["v2"] != 200 {
		t.Fatalf("after 0/100: %v", got)
	}

	// An endpoint-only change: v2's endpoint goes away; with the route
	// back to v1 only its endpoint serves.
	m.write(t, "routing.yaml", fmt.Sprintf(seedRouting, 100, 0))
	eventually(t, "the 100/0 split", func() bool { return count(t, c, 20)["v1"] == 20 })
	v1b := startBackend(t, "v1b")
	m.write(t, "backend.yaml", backendEntry(endpoint(v1, "v1"), endpoint(v1b, "v1"), endpoint(v2, "v2")))
	eventually(t, "the new v1 endpoint to serve", func() bool { return count(t, c, 50)["v1b"] > 0 })
	m.write(t, "backend.yaml", backendEntry(endpoint(v1b, "v1"), endpoint(v2, "v2")))
	eventually(t, "the removed endpoint to get no more calls", func() bool { return count(t, c, 50)["v1"] == 0 })
	if got := count(t, c, 200); got["v1"] != 0 || got["v1b"] != 200 {
		t.Fatalf("after removing an endpoint: %v", got)
	}

	st := m.srv.Status()
	if len(st) != 1 {
		t.Fatalf("status of %d proxies", len(st))
	}
	for _, ts := range st[0].Types {
		if !ts.Synced || ts.LastNack != nil {
			t.Errorf("%s: synced %v, last NACK %+v", ts.Type, ts.Synced, ts.LastNack)
		}
	}
}
