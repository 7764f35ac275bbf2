// Package adsc_test drives flotilla-galley (file mode) and
// flotilla-discovery, as processes, with Istio's delta xDS client.
package adsc_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"istio.io/istio/istioctl/pkg/writer/pilot"
	"istio.io/istio/pkg/adsc"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flotilla-adsc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := 1
	// Built from the workspace at the repository root.
	cmd := exec.Command("go", "build", "-o", dir, "./services/galley/cmd/galley", "./services/discovery/cmd/discovery")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "GOWORK=", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the services: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
}

func waitReady(t *testing.T, admin string) {
	t.Helper()
	for range 600 {
		if resp, err := http.Get("http://" + admin + "/readyz"); err == nil { //nolint:noctx // test-local, bounded
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never became ready", admin)
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

const mesh = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend-service}
spec:
  hosts: [backend-service.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
  - {address: 10.1.0.11, labels: {version: v1}}
  - {address: 10.1.0.12, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend-dr}
spec:
  host: backend-service
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`

func routing(v1, v2 int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend-vs}
spec:
  hosts: [backend-service]
  http:
  - route:
    - {destination: {host: backend-service, subset: v1}, weight: %d}
    - {destination: {host: backend-service, subset: v2}, weight: %d}
`, v1, v2)
}

// state is what the delta client holds, by type and name.
type state struct {
	mu        sync.Mutex
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
}

func (st *state) put(m any, name string, v any, event adsc.Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch mm := m.(type) {
	case map[string]*clusterv3.Cluster:
		if event == adsc.EventDelete {
			delete(mm, name)
		} else {
			mm[name] = v.(*clusterv3.Cluster)
		}
	case map[string]*endpointv3.ClusterLoadAssignment:
		if event == adsc.EventDelete {
			delete(mm, name)
		} else {
			mm[name] = v.(*endpointv3.ClusterLoadAssignment)
		}
	case map[string]*listenerv3.Listener:
		if event == adsc.EventDelete {
			delete(mm, name)
		} else {
			mm[name] = v.(*listenerv3.Listener)
		}
	case map[string]*routev3.RouteConfiguration:
		if event == adsc.EventDelete {
			delete(mm, name)
		} else {
			mm[name] = v.(*routev3.RouteConfiguration)
		}
	}
}

func newState() *state {
	return &state{
		clusters: map[string]*clusterv3.Cluster{}, endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		listeners: map[string]*listenerv3.Listener{}, routes: map[string]*routev3.RouteConfiguration{},
	}
}

func (s *state) weights(t *testing.T) map[string]uint32 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]uint32{}
	for _, vh := range s.routes["80"].GetVirtualHosts() {
		if vh.GetName() != "backend-service.default.svc.cluster.local:80" {
			continue
		}
		for _, w := range vh.GetRoutes()[0].GetRoute().GetWeightedClusters().GetClusters() {
			out[w.GetName()] = w.GetWeight().GetValue()
		}
	}
	return out
}

func TestIstiosDeltaClientGetsTheMeshAndItsChanges(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "mesh.yaml", mesh)
	writeFile(t, dir, "routing.yaml", routing(90, 10))
	mcp, galleyAdmin, xds, admin := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	start(t, "galley", "--config-dir", dir, "--mcp-address", mcp, "--admin-address", galleyAdmin)
	waitReady(t, galleyAdmin)
	start(t, "discovery", "--galley-address", mcp, "--xds-address", xds, "--admin-address", admin, "--debounce-quiet", "20ms", "--replica-name", "discovery-adsc")
	waitReady(t, admin)

	st := newState()
	client := newClient(xds, "app-1", st, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go client.Run(ctx)
	select {
	case <-client.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("the delta client never synced")
	}
	v1, v2 := "outbound|80|v1|backend-service.default.svc.cluster.local", "outbound|80|v2|backend-service.default.svc.cluster.local"
	waitFor(t, "clusters, endpoints and routes", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.clusters[v1] != nil && st.clusters[v2] != nil && st.listeners["virtualOutbound"] != nil &&
			len(st.endpoints[v1].GetEndpoints()) == 1 && st.routes["80"] != nil
	})
	if w := st.weights(t); w[v1] != 90 || w[v2] != 10 {
		t.Fatalf("weights %v, want 90/10", w)
	}
	writeFile(t, dir, "routing.yaml", routing(0, 100))
	waitFor(t, "the 0/100 route", func() bool {
		w := st.weights(t)
		return w[v1] == 0 && w[v2] == 100 || (len(w) == 0 && routeTo(st) == v2)
	})
	waitSynced(t, xds, 1)
	cancel()
	client.Close()

	// Removals. adsc relates every EDS name a response registers to every
	// cluster of that response and then cannot follow a cluster's removal
	// (it exits with "unknown parent"): this client therefore watches
	// clusters, listeners and routes only.
	st2 := newState()
	client2 := newClient(xds, "app-2", st2, false)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go client2.Run(ctx2)
	waitFor(t, "the second client's clusters", func() bool {
		st2.mu.Lock()
		defer st2.mu.Unlock()
		return st2.clusters[v1] != nil && st2.clusters[v2] != nil
	})
	// Removing the subsets' DestinationRule deletes their clusters (a delta
	// removal); the route, naming a subset that is gone, answers 503.
	writeFile(t, dir, "mesh.yaml", mesh[:bytes.Index([]byte(mesh), []byte("---"))])
	waitFor(t, "the subset clusters to be removed", func() bool {
		st2.mu.Lock()
		defer st2.mu.Unlock()
		return st2.clusters[v1] == nil && st2.clusters[v2] == nil && st2.clusters["outbound|80||backend-service.default.svc.cluster.local"] != nil
	})
	waitFor(t, "the route to answer 503", func() bool {
		st2.mu.Lock()
		defer st2.mu.Unlock()
		for _, vh := range st2.routes["80"].GetVirtualHosts() {
			if vh.GetName() == "backend-service.default.svc.cluster.local:80" {
				return vh.GetRoutes()[0].GetDirectResponse().GetStatus() == 503
			}
		}
		return false
	})
	waitSynced(t, xds, 1)
}

// waitSynced waits until discovery shows n delta proxies, every type
// acknowledged and none rejected, as istioctl proxy-status prints
// discovery's syncz (Istio's own status writer reads it), and the replica
// that answered named as istioctl names an istiod.
func waitSynced(t *testing.T, xds string, n int) {
	t.Helper()
	cc, err := grpc.NewClient(xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var out bytes.Buffer
	waitFor(t, "discovery to show the delta client in sync", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			return false
		}
		if st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "istio.io/debug/syncz"}) != nil {
			return false
		}
		resp, err := st.Recv()
		if err != nil || len(resp.GetResources()) != n {
			return false
		}
		out.Reset()
		w := &pilot.XdsStatusWriter{Writer: &out, OutputFormat: "table", Verbosity: 1} // a column per type
		if err := w.PrintAll(map[string]*discoveryv3.DiscoveryResponse{"discovery-adsc": resp}); err != nil {
			t.Fatalf("istioctl's status writer: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != n+1 {
			return false
		}
		for _, l := range lines[1:] {
			if strings.Count(l, "SYNCED") < 3 || !strings.Contains(l, "discovery-adsc") || strings.Contains(l, "STALE") || strings.Contains(l, "ERROR") || strings.Contains(l, "NOT SENT") {
				return false
			}
		}
		return true
	})
	t.Logf("istioctl proxy-status, from discovery's syncz:\n%s", out.String())
}

// newClient is Istio's delta client watching every cluster and listener,
// and the routes (and with withEndpoints the endpoints) they name.
func newClient(xds, workload string, st *state, withEndpoints bool) *adsc.Client {
	return adsc.NewDelta(xds, &adsc.DeltaADSConfig{Config: adsc.Config{Namespace: "default", Workload: workload, IP: "10.1.0.50"}},
		adsc.Register(func(ctx adsc.HandlerContext, name, _ string, c *clusterv3.Cluster, event adsc.Event) {
			st.put(st.clusters, name, c, event)
			if withEndpoints && event != adsc.EventDelete && c.GetType() == clusterv3.Cluster_EDS {
				ctx.RegisterDependency(resourcev3.EndpointType, c.GetEdsClusterConfig().GetServiceName())
			}
		}),
		adsc.Register(func(ctx adsc.HandlerContext, name, _ string, l *listenerv3.Listener, event adsc.Event) {
			st.put(st.listeners, name, l, event)
			if event == adsc.EventDelete {
				return
			}
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					hcm := &hcmv3.HttpConnectionManager{}
					if f.GetTypedConfig().UnmarshalTo(hcm) == nil && hcm.GetRds() != nil {
						ctx.RegisterDependency(resourcev3.RouteType, hcm.GetRds().GetRouteConfigName())
					}
				}
			}
		}),
		adsc.Register(func(_ adsc.HandlerContext, name, _ string, e *endpointv3.ClusterLoadAssignment, event adsc.Event) {
			st.put(st.endpoints, name, e, event)
		}),
		adsc.Register(func(_ adsc.HandlerContext, name, _ string, r *routev3.RouteConfiguration, event adsc.Event) {
			st.put(st.routes, name, r, event)
		}),
		adsc.Watch[*clusterv3.Cluster]("*"),
		adsc.Watch[*listenerv3.Listener]("*"),
	)
}

// routeTo is the single cluster of the backend route, when it has one.
func routeTo(st *state) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, vh := range st.routes["80"].GetVirtualHosts() {
		if vh.GetName() == "backend-service.default.svc.cluster.local:80" {
			return vh.GetRoutes()[0].GetRoute().GetCluster()
		}
	}
	return ""
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 600 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}
