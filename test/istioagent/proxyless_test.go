package istioagent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	xdscreds "google.golang.org/grpc/credentials/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// greeterConfig is a --config-dir holding the demo's mesh as `make run`
// serves it (examples/greeter.yaml: the greeter's two versions split
// 80/20; examples/mesh-policy.yaml: STRICT mTLS and only greeter-client
// allowed to call), the versions' ports moved to v1 and v2.
func greeterConfig(tb testing.TB, v1, v2 string) string {
	tb.Helper()
	root, err := build.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	for name, ports := range map[string]*strings.Replacer{
		"greeter.yaml":     strings.NewReplacer("{grpc: 50061}", "{grpc: "+port(v1)+"}", "{grpc: 50062}", "{grpc: "+port(v2)+"}"),
		"mesh-policy.yaml": strings.NewReplacer(),
	} {
		data, err := os.ReadFile(filepath.Join(root, "examples", name))
		if err != nil {
			tb.Fatal(err)
		}
		moved := ports.Replace(string(data))
		if name == "greeter.yaml" && (!strings.Contains(moved, port(v1)) || !strings.Contains(moved, port(v2))) {
			tb.Fatalf("examples/greeter.yaml has no greeter ports 50061 and 50062 to move:\n%s", data)
		}
		xdstest.WriteFile(tb, dir, name, moved)
	}
	return dir
}

// proxylessPod runs pilot-agent injected with Istio's grpc-agent template
// for demo/name as service account account, and waits for what it writes
// for the application: the gRPC xDS bootstrap and the certificate files.
func proxylessPod(tb testing.TB, m *mesh, name, account string, labels map[string]string, certTTL time.Duration) *pod {
	tb.Helper()
	p := startPod(tb, m, podSpec{
		name: name, namespace: "demo", account: account, workload: strings.TrimSuffix(name, "-1"),
		labels: labels, proxyless: true, certTTL: certTTL,
	})
	xdstest.Eventually(tb, name+"'s bootstrap and certificates", func() bool {
		for _, f := range []string{p.bootstrap(), p.certFile("cert-chain.pem"), p.certFile("key.pem"), p.certFile("root-cert.pem")} {
			if _, err := os.Stat(f); err != nil {
				return false
			}
		}
		return true
	})
	return p
}

// bootstrap is the gRPC xDS bootstrap pilot-agent writes (GRPC_XDS_BOOTSTRAP's
// default, ./etc/istio/proxy/grpc-bootstrap.json; the template points the
// application containers at it).
func (p *pod) bootstrap() string { return p.path("etc/istio/proxy/grpc-bootstrap.json") }

// certFile is a file of the certificates pilot-agent writes for the
// application (OUTPUT_CERTS, /var/lib/istio/data in the template).
func (p *pod) certFile(name string) string { return p.path("var/lib/istio/data", name) }

// serial is the serial number of the pod's certificate file.
func (p *pod) serial(tb testing.TB) string {
	tb.Helper()
	pair, err := tls.LoadX509KeyPair(p.certFile("cert-chain.pem"), p.certFile("key.pem"))
	if err != nil {
		return "" // between pilot-agent's writes of the two files
	}
	return pair.Leaf.SerialNumber.String()
}

// startGreeter runs the demo greeter as the pod's application container
// (grpc-agent.yaml gives it GRPC_XDS_BOOTSTRAP and
// GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT) on addr, and waits until
// discovery has let its xDS-enabled server serve.
func startGreeter(tb testing.TB, p *pod, version, addr string) {
	tb.Helper()
	g := proc.StartIn(tb, "greeter-"+version, p.dir, []string{"GRPC_XDS_BOOTSTRAP=" + p.bootstrap(), "GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT=true"},
		filepath.Join(binDir, "flotilla-demo"), "greeter", "--xds", "--version", version, "--address", addr)
	g.Out.WaitFor(tb, "mode=SERVING")
}

// xdsClient is a grpc-go xDS client in the test with only what the pod's
// pilot-agent wrote: its bootstrap (xDS through pilot-agent's socket) and,
// named there, its certificate files.
func (p *pod) xdsClient(tb testing.TB, target string) testgrpc.TestServiceClient {
	tb.Helper()
	bootstrap, err := os.ReadFile(p.bootstrap())
	if err != nil {
		tb.Fatal(err)
	}
	r, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		tb.Fatalf("grpc-go refuses pilot-agent's bootstrap: %v", err)
	}
	// No fallback: a call that does not get mTLS from discovery fails.
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: failing{}})
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := grpc.NewClient(target, grpc.WithResolvers(r), grpc.WithTransportCredentials(creds))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// failing is transport credentials that refuse every handshake.
type failing struct{}

func (failing) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("no mTLS from discovery for this connection")
}

func (failing) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("a client's credentials")
}

func (failing) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "failing"}
}

func (f failing) Clone() credentials.TransportCredentials { return f }

func (failing) OverrideServerName(string) error { return nil }

// answer is what one call tells: the version that answered, the caller's
// identity as the greeter read it from the connection and the greeter's
// identity as the client read it.
type answer struct {
	version, caller, server string
}

func call(ctx context.Context, c testgrpc.TestServiceClient) (answer, error) {
	var pr peer.Peer
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{}, grpc.Peer(&pr), grpc.WaitForReady(true))
	if err != nil {
		return answer{}, err
	}
	a := answer{version: resp.GetHostname(), caller: resp.GetUsername()}
	if info, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(info.State.PeerCertificates) > 0 && len(info.State.PeerCertificates[0].URIs) > 0 {
		a.server = info.State.PeerCertificates[0].URIs[0].String()
	}
	return a, nil
}

// TestIstiosAgentServesItsPodProxylessEndToEnd runs ca, discovery (the
// demo's mesh) and Istio's pilot-agent injected with Istio's proxyless
// template for four pods: the greeter's two versions, the demo client and
// an intruder of another service account, all as processes. The greeters
// are the demo's, xDS-enabled gRPC servers; the clients are grpc-go's xDS
// client in the test. Each uses only the bootstrap and certificates its
// pilot-agent wrote, pilot-agent having got the certificate from
// discovery's port with the pod's token and relaying xDS to it: calls
// split 80/20, over mTLS with each side's SPIFFE identity; the intruder
// is denied by the AuthorizationPolicy; short-lived certificates are
// renewed into the files while calls go on.
func TestIstiosAgentServesItsPodProxylessEndToEnd(t *testing.T) {
	v1Addr, v2Addr := proc.FreeAddr(t), proc.FreeAddr(t)
	m := startMesh(t, greeterConfig(t, v1Addr, v2Addr))
	// Renewed at half their life (SECRET_GRACE_PERIOD_RATIO's default).
	const ttl = 30 * time.Second
	v1 := proxylessPod(t, m, "greeter-v1-1", "greeter-v1", map[string]string{"app": "greeter", "version": "v1", "security.istio.io/tlsMode": "istio"}, ttl)
	v2 := proxylessPod(t, m, "greeter-v2-1", "greeter-v2", map[string]string{"app": "greeter", "version": "v2", "security.istio.io/tlsMode": "istio"}, ttl)
	client := proxylessPod(t, m, "greeter-client-1", "greeter-client", map[string]string{"app": "greeter-client"}, ttl)
	intruder := proxylessPod(t, m, "greeter-intruder-1", "greeter-intruder", map[string]string{"app": "greeter-intruder"}, ttl)
	startGreeter(t, v1, "v1", v1Addr)
	startGreeter(t, v2, "v2", v2Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 80/20, each version over mTLS as its own service account, the
	// client as its own.
	c := client.xdsClient(t, "xds:///greeter.demo.svc.cluster.local:50051")
	counts := map[string]int{}
	for i := range 400 {
		a, err := call(ctx, c)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if a.caller != "spiffe://cluster.local/ns/demo/sa/greeter-client" || a.server != "spiffe://cluster.local/ns/demo/sa/greeter-"+a.version {
			t.Fatalf("call %d answered by %s: the greeter read the caller as %q, the client reached %q", i, a.version, a.caller, a.server)
		}
		counts[a.version]++
	}
	if share := counts["v1"] * 100 / (counts["v1"] + counts["v2"]); share < 70 || share > 90 {
		t.Fatalf("v1 got %d%% of the calls (%v), want about 80%%", share, counts)
	}
	t.Logf("split over 400 calls: %v", counts)

	// The intruder has a certificate of its own account: mTLS succeeds,
	// and the greeters' RBAC refuses it.
	if _, err := call(ctx, intruder.xdsClient(t, "xds:///greeter.demo.svc.cluster.local:50051")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the intruder's call: %v, want PermissionDenied", err)
	}

	// discovery knows the four as proxyless gRPC (the generator
	// pilot-agent puts in the bootstrap), as their service accounts, at
	// Istio's version, each having taken what it was sent.
	accounts := map[string]string{}
	for _, p := range []*pod{v1, v2, client, intruder} {
		accounts["sidecar~127.0.0.1~"+p.spec.name+".demo~demo.svc.cluster.local"] = p.spec.account
	}
	xdstest.Eventually(t, "the four pods synced in flotilla proxy-status", func() bool {
		n := 0
		for _, p := range proxyStatus(t, m) {
			account, ok := accounts[p.ID]
			if ok && p.Generator == "grpc" && p.IstioVersion == istioVersion && p.Identity == "spiffe://cluster.local/ns/demo/sa/"+account && synced(p) {
				n++
			}
		}
		return n == len(accounts)
	})

	// pilot-agent renews each certificate into its files before it
	// expires; calls go on meanwhile. grpc-go reads the files again only
	// every 15 minutes (the refresh_interval of pilot-agent's bootstrap),
	// so open connections keep their first certificates.
	first := map[*pod]string{v1: v1.serial(t), v2: v2.serial(t), client: client.serial(t)}
	calls := 0
	for renewed := 0; renewed < len(first); {
		if _, err := call(ctx, c); err != nil {
			t.Fatalf("call %d while the certificates are renewed: %v", calls, err)
		}
		calls++
		time.Sleep(20 * time.Millisecond)
		renewed = 0
		for p, serial := range first {
			if s := p.serial(t); s != "" && s != serial {
				renewed++
			}
		}
	}
	t.Logf("%d calls while the three certificates were renewed, none failed", calls)
}
