package istioagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// envoyNode is the node the pod's Envoy would present: the ID and metadata
// pilot-agent generated for the pod. pilot-agent writes them into Envoy's
// bootstrap (envoy-rev.json), which it writes only when it starts Envoy;
// it writes the same node into the gRPC bootstrap it always writes beside
// it, with the gRPC generator added (generateGRPCBootstrap), which is
// taken out again here.
func (p *pod) envoyNode(tb testing.TB) *corev3.Node {
	tb.Helper()
	var bootstrap struct {
		Node struct {
			ID       string         `json:"id"`
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
	}
	xdstest.Eventually(tb, "pilot-agent's bootstrap", func() bool {
		data, err := os.ReadFile(p.bootstrap())
		return err == nil && json.Unmarshal(data, &bootstrap) == nil
	})
	delete(bootstrap.Node.Metadata, "GENERATOR")
	md, err := structpb.NewStruct(bootstrap.Node.Metadata)
	if err != nil {
		tb.Fatal(err)
	}
	return &corev3.Node{Id: bootstrap.Node.ID, Metadata: md, UserAgentName: "envoy"}
}

// envoy is the test playing the pod's Envoy on pilot-agent's xDS socket:
// a delta ADS stream, as Istio's Envoy bootstrap configures it.
type envoy struct {
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node   *corev3.Node
}

func startEnvoy(tb testing.TB, ctx context.Context, p *pod) *envoy {
	tb.Helper()
	socket := p.path("etc/istio/proxy/XDS")
	xdstest.Eventually(tb, "pilot-agent's xDS socket", func() bool { _, err := os.Stat(socket); return err == nil })
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return &envoy{stream: stream, node: p.envoyNode(tb)}
}

// subscribe asks for every resource of typeURL (a wildcard, as Envoy asks
// for clusters and listeners), waits for the answer, acknowledges it and
// returns the resources' names. Envoy sends its node on the first request
// of the stream only.
func (e *envoy) subscribe(tb testing.TB, typeURL string) []string {
	tb.Helper()
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL, Node: e.node}
	e.node = nil
	if err := e.stream.Send(req); err != nil {
		tb.Fatal(err)
	}
	for {
		resp, err := e.stream.Recv()
		if err != nil {
			tb.Fatalf("waiting for %s through pilot-agent: %v", typeURL, err)
		}
		// Anything else (pushed unasked) is acknowledged too.
		if err := e.stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
			tb.Fatal(err)
		}
		if resp.GetTypeUrl() != typeURL {
			continue
		}
		var names []string
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
		}
		return names
	}
}

// proxyStatus runs `flotilla proxy-status -o json` against discovery's
// TLS port as an operator would (a token shown to ca for a certificate)
// and returns the proxies it lists.
func proxyStatus(tb testing.TB, m *mesh) []debugapi.ProxySync {
	tb.Helper()
	dir := tb.TempDir()
	token, empty := filepath.Join(dir, "token"), filepath.Join(dir, "context.yaml") // the flags say it all
	writeFile(tb, token, m.s.token(tb, "istio-system", "flotilla-cli"))
	writeFile(tb, empty, "")
	cmd := exec.Command(filepath.Join(binDir, "flotilla"), "proxy-status", "-o", "json", "--context-file", empty,
		"--discovery-address", m.secureXDS, "--ca-address", m.ca, "--token-file", token, "--cacert", m.roots)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		tb.Fatalf("flotilla proxy-status: %v\n%s%s", err, out.String(), errOut.String())
	}
	var rows []struct {
		Proxy debugapi.ProxySync `json:"proxy"`
	}
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		tb.Fatalf("flotilla proxy-status -o json: %v\n%s", err, out.String())
	}
	proxies := make([]debugapi.ProxySync, 0, len(rows))
	for _, r := range rows {
		proxies = append(proxies, r.Proxy)
	}
	return proxies
}

// synced reports whether every type the proxy watches is acknowledged.
func synced(p debugapi.ProxySync) bool {
	return len(p.Types) > 0 && !slices.ContainsFunc(p.Types, func(t debugapi.TypeSync) bool { return t.Status != debugapi.Synced })
}

// TestIstiosAgentRelaysItsSidecarsXDSAndStopsOnSIGTERM runs ca, discovery
// (the demo's mesh) and Istio's pilot-agent injected with Istio's sidecar
// template for the demo client's pod, as processes, the test playing the
// pod's Envoy: pilot-agent runs with DISABLE_ENVOY, so as not to start an
// Envoy of its own, and the test speaks delta ADS on pilot-agent's xDS
// socket with the node pilot-agent generated. pilot-agent relays it to
// discovery's port, authenticated with the pod's token: clusters and
// listeners come back; flotilla proxy-status shows the proxy synced, as
// its service account, at Istio's version; on SIGTERM pilot-agent ends the
// stream and exits cleanly.
//
// With DISABLE_ENVOY pilot-agent serves no SDS (initSdsServer keeps the
// certificates for proxyless files), so Envoy's secrets are not part of
// this test; nor is Envoy's drain, which pilot-agent asks of Envoy's admin
// port only when it runs Envoy.
func TestIstiosAgentRelaysItsSidecarsXDSAndStopsOnSIGTERM(t *testing.T) {
	m := startMesh(t, greeterConfig(t, proc.FreeAddr(t), proc.FreeAddr(t)))
	p := startPod(t, m, podSpec{
		name: "greeter-client-1", namespace: "demo", account: "greeter-client", workload: "greeter-client",
		labels: map[string]string{"app": "greeter-client"}, certTTL: time.Hour,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	e := startEnvoy(t, ctx, p)
	if clusters := e.subscribe(t, resourcev3.ClusterType); !slices.Contains(clusters, "outbound|50051||greeter.demo.svc.cluster.local") {
		t.Fatalf("clusters through pilot-agent: %q", clusters)
	}
	if listeners := e.subscribe(t, resourcev3.ListenerType); len(listeners) == 0 {
		t.Fatal("no listeners through pilot-agent")
	}

	var proxy debugapi.ProxySync
	xdstest.Eventually(t, "the proxy synced in flotilla proxy-status", func() bool {
		proxies := proxyStatus(t, m)
		i := slices.IndexFunc(proxies, func(p debugapi.ProxySync) bool {
			return p.ID == "sidecar~127.0.0.1~greeter-client-1.demo~demo.svc.cluster.local"
		})
		if i < 0 {
			return false
		}
		proxy = proxies[i]
		return synced(proxy)
	})
	if proxy.Identity != "spiffe://cluster.local/ns/demo/sa/greeter-client" || proxy.IstioVersion != "1.31-dev" || !proxy.Delta {
		t.Fatalf("discovery sees %s as %q at version %q (delta %v)", proxy.ID, proxy.Identity, proxy.IstioVersion, proxy.Delta)
	}

	if err := p.agent.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("pilot-agent's exit after SIGTERM: %v", err)
	}
	if _, err := e.stream.Recv(); err == nil {
		t.Fatal("the stand-in Envoy's stream still open after pilot-agent exited")
	}
}
