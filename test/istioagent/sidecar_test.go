package istioagent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// envoyBootstrap is what the test, playing the pod's Envoy, reads of the
// bootstrap pilot-agent wrote for Envoy (envoy-rev.json in its
// configuration directory): its node and the Unix sockets of its xds-grpc
// and sds-grpc clusters (pilot-agent's xDS proxy and SDS server).
type envoyBootstrap struct {
	node     *corev3.Node
	xds, sds string
}

func (p *pod) envoyBootstrap(tb testing.TB) envoyBootstrap {
	tb.Helper()
	var b struct {
		Node struct {
			ID       string         `json:"id"`
			Cluster  string         `json:"cluster"`
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
		StaticResources struct {
			Clusters []struct {
				Name           string `json:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LBEndpoints []struct {
							Endpoint struct {
								Address struct {
									Pipe struct {
										Path string `json:"path"`
									} `json:"pipe"`
								} `json:"address"`
							} `json:"endpoint"`
						} `json:"lb_endpoints"`
					} `json:"endpoints"`
				} `json:"load_assignment"`
			} `json:"clusters"`
		} `json:"static_resources"`
	}
	xdstest.Eventually(tb, "pilot-agent's Envoy bootstrap", func() bool {
		data, err := os.ReadFile(p.path("etc/istio/proxy/envoy-rev.json"))
		return err == nil && json.Unmarshal(data, &b) == nil
	})
	md, err := structpb.NewStruct(b.Node.Metadata)
	if err != nil {
		tb.Fatal(err)
	}
	out := envoyBootstrap{node: &corev3.Node{Id: b.Node.ID, Cluster: b.Node.Cluster, Metadata: md, UserAgentName: "envoy"}}
	for _, c := range b.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LBEndpoints {
				// Relative paths are the pod's (Envoy's working directory).
				path := lb.Endpoint.Address.Pipe.Path
				if !filepath.IsAbs(path) {
					path = p.path(path)
				}
				switch c.Name {
				case "xds-grpc":
					out.xds = path
				case "sds-grpc":
					out.sds = path
				}
			}
		}
	}
	if out.xds == "" || out.sds == "" {
		tb.Fatalf("Envoy's bootstrap names no xds-grpc or sds-grpc socket: %+v", out)
	}
	return out
}

// unixConn is a gRPC connection to a Unix socket, once it exists.
func unixConn(tb testing.TB, socket string) *grpc.ClientConn {
	tb.Helper()
	xdstest.Eventually(tb, socket, func() bool { _, err := os.Stat(socket); return err == nil })
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// ads is the test playing Envoy's ADS on pilot-agent's xDS socket: a
// delta stream, as Istio's Envoy bootstrap configures it.
type ads struct {
	stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node   *corev3.Node
}

func startADS(tb testing.TB, ctx context.Context, b envoyBootstrap) *ads {
	tb.Helper()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(unixConn(tb, b.xds)).DeltaAggregatedResources(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return &ads{stream: stream, node: b.node}
}

// subscribe asks for every resource of typeURL (a wildcard, as Envoy asks
// for clusters and listeners), waits for the answer, acknowledges it and
// returns the resources' names. Envoy sends its node on the first request
// of the stream only.
func (e *ads) subscribe(tb testing.TB, typeURL string) []string {
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

// secret asks pilot-agent's SDS server for one secret, on a stream of
// its own as Envoy's SDS subscriptions are, and returns it.
func secret(tb testing.TB, ctx context.Context, b envoyBootstrap, name string) *tlsv3.Secret {
	tb.Helper()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(unixConn(tb, b.sds)).StreamSecrets(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: b.node, TypeUrl: resourcev3.SecretType, ResourceNames: []string{name}}); err != nil {
		tb.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		tb.Fatalf("secret %s from pilot-agent: %v", name, err)
	}
	for _, r := range resp.GetResources() {
		s := &tlsv3.Secret{}
		if err := r.UnmarshalTo(s); err != nil {
			tb.Fatal(err)
		}
		if s.GetName() == name {
			return s
		}
	}
	tb.Fatalf("no secret %s in %d resources", name, len(resp.GetResources()))
	return nil
}

// proxyStatus runs `flotilla proxy-status -o json` against discovery's
// TLS port as an operator would (a token shown to ca for a certificate)
// and returns the proxies it lists.
func proxyStatus(tb testing.TB, m *mesh) []debugapi.ProxySync {
	tb.Helper()
	dir := tb.TempDir()
	token, empty := filepath.Join(dir, "token"), filepath.Join(dir, "context.yaml") // the flags say it all
	writeFile(tb, token, m.s.Token(tb, "istio-system", "flotilla-cli"))
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

// TestIstiosAgentServesItsSidecarAndDrainsItOnSIGTERM runs ca, discovery
// (the demo's mesh) and Istio's pilot-agent injected with Istio's sidecar
// template for the demo client's pod, as processes. pilot-agent starts a
// stand-in for Envoy (its binaryPath), the test playing Envoy's streams
// from the bootstrap pilot-agent wrote for it: over SDS, the pod's
// certificate (got from discovery's port with the pod's token) and the
// mesh's root; over delta ADS, clusters and listeners relayed from
// discovery. flotilla proxy-status shows the proxy synced, as its service
// account, at Istio's version. On SIGTERM pilot-agent drains Envoy's
// inbound listeners, stops it after the drain and exits cleanly.
func TestIstiosAgentServesItsSidecarAndDrainsItOnSIGTERM(t *testing.T) {
	m := startMesh(t, greeterConfig(t, proc.FreeAddr(t), proc.FreeAddr(t)))
	p := startPod(t, m, podSpec{
		name: "greeter-client-1", namespace: "demo", account: "greeter-client", workload: "greeter-client",
		labels: map[string]string{"app": "greeter-client"}, certTTL: time.Hour,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := p.envoyBootstrap(t)

	// The certificates Envoy's listeners and clusters name.
	tc := secret(t, ctx, b, "default").GetTlsCertificate()
	pair, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(pair.Leaf.URIs) != 1 || pair.Leaf.URIs[0].String() != "spiffe://cluster.local/ns/demo/sa/greeter-client" {
		t.Fatalf("the pod's certificate is for %v", pair.Leaf.URIs)
	}
	roots, err := os.ReadFile(m.roots)
	if err != nil {
		t.Fatal(err)
	}
	if got := secret(t, ctx, b, "ROOTCA").GetValidationContext().GetTrustedCa().GetInlineBytes(); !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(roots)) {
		t.Fatalf("ROOTCA is\n%s\nwant ca's roots\n%s", got, roots)
	}

	e := startADS(t, ctx, b)
	if clusters := e.subscribe(t, resourcev3.ClusterType); !slices.Contains(clusters, "outbound|50051||greeter.demo.svc.cluster.local") {
		t.Fatalf("clusters through pilot-agent: %q", clusters)
	}
	if listeners := e.subscribe(t, resourcev3.ListenerType); len(listeners) == 0 {
		t.Fatal("no listeners through pilot-agent")
	}

	var proxy debugapi.ProxySync
	xdstest.Eventually(t, "the proxy synced in flotilla proxy-status", func() bool {
		proxies := proxyStatus(t, m)
		i := slices.IndexFunc(proxies, func(p debugapi.ProxySync) bool { return p.ID == b.node.GetId() })
		if i < 0 {
			return false
		}
		proxy = proxies[i]
		return synced(proxy)
	})
	if proxy.ID != "sidecar~127.0.0.1~greeter-client-1.demo~demo.svc.cluster.local" || proxy.Identity != "spiffe://cluster.local/ns/demo/sa/greeter-client" ||
		proxy.IstioVersion != istioVersion || !proxy.Delta {
		t.Fatalf("discovery sees %s as %q at version %q (delta %v)", proxy.ID, proxy.Identity, proxy.IstioVersion, proxy.Delta)
	}

	// SIGTERM: Envoy's inbound listeners drain gracefully, pilot-agent
	// waits the termination drain duration, stops Envoy and exits.
	if err := p.agent.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("pilot-agent's exit after SIGTERM: %v", err)
	}
	if rec, _ := os.ReadFile(p.path("envoy-record")); !strings.Contains(string(rec), "drain inboundonly&graceful") {
		t.Fatalf("Envoy saw:\n%s", rec)
	}
	if _, err := e.stream.Recv(); err == nil {
		t.Fatal("Envoy's xDS stream still open after pilot-agent exited")
	}
}
