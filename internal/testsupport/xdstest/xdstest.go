// Package xdstest helps tests drive discovery with grpc-go's own xDS
// client (proxyless gRPC, a client Flotilla did not write): gRPC backends
// that answer with their name, clients with their own bootstrap, calls
// counted by backend, and the seed example's configuration as YAML.
package xdstest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Target is the seed example's listener.
const Target = "backend-service.default.svc.cluster.local:80"

type backend struct {
	testgrpc.UnimplementedTestServiceServer
	name string
	// failEvery > 0 answers every failEvery-th call UNAVAILABLE.
	failEvery int64
	calls     atomic.Int64
}

func (b *backend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if n := b.calls.Add(1); b.failEvery > 0 && n%b.failEvery == 0 {
		return nil, status.Error(codes.Unavailable, "flaky backend "+b.name)
	}
	return &testgrpc.SimpleResponse{Hostname: b.name}, nil
}

// StartFlakyBackend is StartBackend answering every failEvery-th call
// with UNAVAILABLE; calls reports how many calls it has received.
func StartFlakyBackend(tb testing.TB, name string, failEvery int64) (port int, calls func() int64) {
	tb.Helper()
	b := &backend{name: name, failEvery: failEvery}
	port, _ = serve(tb, b)
	return port, b.calls.Load
}

// StartBackend serves a gRPC test service on 127.0.0.1 that answers
// UnaryCall with name, until the test ends; it returns the port.
func StartBackend(tb testing.TB, name string) int {
	tb.Helper()
	port, _ := StartStoppableBackend(tb, name)
	return port
}

// StartStoppableBackend is StartBackend with a stop function, for a test
// that takes the backend away (the test's end stops it too).
func StartStoppableBackend(tb testing.TB, name string) (port int, stop func()) {
	tb.Helper()
	return serve(tb, &backend{name: name})
}

func serve(tb testing.TB, b *backend) (port int, stop func()) {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, b)
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	addr, _ := lis.Addr().(*net.TCPAddr)
	return addr.Port, gs.Stop
}

var schemes atomic.Int64

// Client dials xds:///target with grpc-go's xDS client, node nodeID
// (GENERATOR=grpc). servers are discovery replicas behind one name, as
// behind a Kubernetes Service: the client uses one and moves to another
// when it goes away.
func Client(tb testing.TB, nodeID, target string, servers ...string) testgrpc.TestServiceClient {
	tb.Helper()
	return ClientAt(tb, nodeID, "", target, servers...)
}

// ClientAt is Client on a node whose bootstrap says where it runs:
// locality "region/zone/subzone" (empty: not said).
func ClientAt(tb testing.TB, nodeID, locality, target string, servers ...string) testgrpc.TestServiceClient {
	tb.Helper()
	scheme := fmt.Sprintf("xdstest%d", schemes.Add(1))
	r := manual.NewBuilderWithScheme(scheme)
	addrs := make([]resolver.Address, 0, len(servers))
	for _, s := range servers {
		addrs = append(addrs, resolver.Address{Addr: s})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	resolver.Register(r)
	loc := append(strings.SplitN(locality, "/", 3), "", "")
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": "%s:///discovery", "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "metadata": {%q: %q}, "locality": {"region": %q, "zone": %q, "sub_zone": %q}}
	}`, scheme, nodeID, proxycontract.MetadataGenerator, proxycontract.GeneratorGRPC, loc[0], loc[1], loc[2])
	xr, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(xr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// Count makes n calls (with metadata md as key, value pairs) and counts
// the answers by backend name; a failed call counts as "error: <message>".
func Count(tb testing.TB, c testgrpc.TestServiceClient, n int, md ...string) map[string]int {
	tb.Helper()
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

// Eventually polls cond every 50 ms for up to 30 s, and returns
// how long it took.
func Eventually(tb testing.TB, what string, cond func() bool) time.Duration {
	tb.Helper()
	return EventuallyWithin(tb, 30*time.Second, what, cond)
}

// EventuallyWithin is Eventually with another bound, for what waits on
// something slower (a Lease changing hands).
func EventuallyWithin(tb testing.TB, limit time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if cond() {
		return time.Since(start)
	}
	tb.Fatalf("timed out after %s waiting for %s", time.Since(start).Round(time.Millisecond), what)
	return 0
}

// WriteFile replaces dir/name atomically, as editors and ConfigMap volumes
// do.
func WriteFile(tb testing.TB, dir, name, content string) {
	tb.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		tb.Fatal(err)
	}
}

// Routing is the seed example's VirtualService (x-version: v2 → v2, else
// v1/v2 by weight) and DestinationRule (pool, outlier detection, v2's own
// pool).
func Routing(v1, v2 int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1alpha3
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
`, v1, v2)
}

// Backend is the seed example's service as a ServiceEntry with the given
// endpoints (see Endpoint).
func Backend(endpoints ...string) string {
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

// Endpoint is a backend on 127.0.0.1:port labelled with a version.
func Endpoint(port int, version string) string {
	return fmt.Sprintf("  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: %s}}", port, version)
}

// EndpointAt is Endpoint in a locality, "region/zone/subzone".
func EndpointAt(port int, version, locality string) string {
	return fmt.Sprintf("  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: %s}, locality: %s}", port, version, locality)
}
