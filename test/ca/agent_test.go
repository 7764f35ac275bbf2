package ca_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// meshWithDiscovery runs galley (a directory with a backend) and
// discovery with its certificate from c, and returns discovery's mTLS xDS
// and admin addresses.
func meshWithDiscovery(tb testing.TB, c *ca, s *proc.Signer) (secureXDS, admin string) {
	tb.Helper()
	dir := tb.TempDir()
	xdstest.WriteFile(tb, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(xdstest.StartBackend(tb, "v1"), "v1")))
	return meshServing(tb, c, s, dir)
}

// meshServing runs galley serving the Istio YAML in dir, and discovery,
// both with certificates from c; it returns discovery's mTLS xDS and
// admin addresses.
func meshServing(tb testing.TB, c *ca, s *proc.Signer, dir string) (secureXDS, admin string) {
	tb.Helper()
	secureXDS, admin, _ = meshProcesses(tb, c, s, dir)
	return secureXDS, admin
}

// meshProcesses is meshServing, with discovery's process.
func meshProcesses(tb testing.TB, c *ca, s *proc.Signer, dir string) (secureXDS, admin string, discovery *proc.Process) {
	tb.Helper()
	rootsFile := filepath.Join(c.state, "roots.pem")
	token := func(sa string) string {
		path := filepath.Join(tb.TempDir(), sa)
		if err := os.WriteFile(path, []byte(s.Token(tb, "istio-system", sa)), 0o600); err != nil {
			tb.Fatal(err)
		}
		return path
	}
	mcpAddr, galleyAdmin := proc.FreeAddr(tb), proc.FreeAddr(tb)
	proc.Start(tb, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcpAddr,
		"--admin-address", galleyAdmin, "--webhook-address", proc.FreeAddr(tb),
		"--ca-address", c.addr, "--ca-roots-file", rootsFile, "--token-file", token("flotilla-galley"))
	proc.WaitReady(tb, "http://"+galleyAdmin+"/readyz")
	secureXDS, admin = proc.FreeAddr(tb), proc.FreeAddr(tb)
	discovery = proc.Start(tb, "discovery", filepath.Join(binDir, "flotilla-discovery"), "--galley-address", mcpAddr,
		"--xds-address", proc.FreeAddr(tb), "--secure-xds-address", secureXDS, "--admin-address", admin,
		"--ca-address", c.addr, "--ca-roots-file", rootsFile, "--token-file", token("flotilla-discovery"))
	proc.WaitReady(tb, "http://"+admin+"/readyz")
	return secureXDS, admin, discovery
}

// pod is an agent process with a stand-in Envoy, as the injected proxy
// container runs it.
type pod struct {
	agent              *proc.Process
	sds, xds, admin    string
	envoyAdmin, record string
}

// podDir is a pod's directory (short: Unix socket paths are) holding the
// projected token of namespace/account, and the token file's path.
func podDir(tb testing.TB, s *proc.Signer, namespace, account string) (dir, tokenFile string) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "pod")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	tokenFile = filepath.Join(dir, "istio-token")
	if err := os.WriteFile(tokenFile, []byte(s.Token(tb, namespace, account)), 0o600); err != nil {
		tb.Fatal(err)
	}
	return dir, tokenFile
}

// startAgent runs `flotilla-agent proxy sidecar` for shop/cart-1 with the
// pod environment the injector sets and a token of tokenAccount.
func startAgent(tb testing.TB, c *ca, s *proc.Signer, secureXDS, tokenAccount string, extra ...string) *pod {
	tb.Helper()
	dir, tokenFile := podDir(tb, s, "shop", tokenAccount)
	p := &pod{
		sds: filepath.Join(dir, "sds"), xds: filepath.Join(dir, "XDS"), admin: proc.FreeAddr(tb),
		envoyAdmin: proc.FreeAddr(tb), record: filepath.Join(dir, "envoy-record"),
	}
	for k, v := range map[string]string{
		"POD_NAME": "cart-1", "POD_NAMESPACE": "shop", "INSTANCE_IP": "127.0.0.1", "SERVICE_ACCOUNT": "cart",
		"TRUST_DOMAIN": "cluster.local", "CLUSTER_ID": "Kubernetes", "DISCOVERY_ADDRESS": secureXDS, "CA_ADDRESS": c.addr,
		"PROXY_CONFIG":     `{"terminationDrainDuration": "1s", "concurrency": 1}`,
		"FAKE_ENVOY_ADMIN": p.envoyAdmin, "FAKE_ENVOY_RECORD": p.record,
		// A rewritten probe: a TCP check of the agent's own admin port.
		"ISTIO_KUBE_APP_PROBERS": `{"/app-health/app/livez": {"tcpSocket": {"port": ` + strings.TrimPrefix(p.admin[strings.LastIndex(p.admin, ":"):], ":") + `}}}`,
	} {
		tb.Setenv(k, v)
	}
	p.agent = proc.Start(tb, "agent", filepath.Join(binDir, "flotilla-agent"), append([]string{
		"proxy", "sidecar",
		"--admin-address", p.admin, "--ca-roots-file", filepath.Join(c.state, "roots.pem"), "--token-file", tokenFile,
		"--discovery-server-name", "flotilla-discovery.istio-system.svc",
		"--certs-dir", filepath.Join(dir, "no-certs"), "--sds-socket", p.sds, "--xds-socket", p.xds,
		"--envoy-binary", filepath.Join(binDir, "fakeenvoy"), "--envoy-config", filepath.Join(dir, "envoy-rev.json"),
		"--envoy-admin", p.envoyAdmin,
	}, extra...)...)
	return p
}

func unixConn(tb testing.TB, path string) *grpc.ClientConn {
	tb.Helper()
	xdstest.Eventually(tb, path, func() bool { _, err := os.Stat(path); return err == nil })
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// secrets opens an SDS stream on the pod's socket asking for names.
func (p *pod) secrets(tb testing.TB, ctx context.Context, names ...string) secretv3.SecretDiscoveryService_StreamSecretsClient {
	tb.Helper()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(unixConn(tb, p.sds)).StreamSecrets(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy"}, TypeUrl: resourcev3.SecretType, ResourceNames: names}); err != nil {
		tb.Fatal(err)
	}
	return stream
}

// clusters opens an ADS stream on the pod's xDS socket as the node
// cart-1.shop claiming service account cart, asks for clusters and
// returns the answer or the error that ended the stream.
func (p *pod) clusters(tb testing.TB, ctx context.Context) (*discoveryv3.DiscoveryResponse, error) {
	tb.Helper()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(unixConn(tb, p.xds)).StreamAggregatedResources(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"SERVICE_ACCOUNT": "cart"})
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~127.0.0.1~cart-1.shop~shop.svc.cluster.local", Metadata: md}, TypeUrl: resourcev3.ClusterType}); err != nil {
		tb.Fatal(err)
	}
	return ads.Recv() // the test reads the status
}

// workloadSecret reads the "default" secret over the pod's SDS socket and
// returns its leaf certificate's SPIFFE ID and serial.
func workloadSecret(tb testing.TB, stream secretv3.SecretDiscoveryService_StreamSecretsClient) (id, serial string) {
	tb.Helper()
	resp, err := stream.Recv()
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range resp.GetResources() {
		s := &tlsv3.Secret{}
		if err := r.UnmarshalTo(s); err != nil {
			tb.Fatal(err)
		}
		if s.GetName() != "default" {
			continue
		}
		tc := s.GetTlsCertificate()
		cert, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
		if err != nil {
			tb.Fatal(err)
		}
		return cert.Leaf.URIs[0].String(), cert.Leaf.SerialNumber.String()
	}
	tb.Fatalf("no default secret in %d resources", len(resp.GetResources()))
	return "", ""
}

func httpGet(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test-local URL
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestTheAgentServesThePodsIdentityAndRelaysItsXDS runs ca, galley,
// discovery and the agent (with a stand-in Envoy, Envoy itself not being
// installable here) as processes: the certificate over SDS is the pod's,
// rotated on the open stream; Envoy's ADS reaches discovery over mTLS as
// that identity; the agent is ready, merges the metrics, and drains Envoy
// on SIGTERM.
func TestTheAgentServesThePodsIdentityAndRelaysItsXDS(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, _ := meshWithDiscovery(t, c, s)
	p := startAgent(t, c, s, secureXDS, "cart", "--cert-ttl", "6s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	sds := p.secrets(t, ctx, "default", "ROOTCA")
	id, first := workloadSecret(t, sds)
	if id != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("the pod's certificate is %s", id)
	}
	// A short lifetime: the renewal arrives on the open stream.
	_, second := workloadSecret(t, sds)
	if second == first {
		t.Fatal("the pushed certificate is the same one")
	}

	cds, err := p.clusters(t, ctx)
	if err != nil || len(cds.GetResources()) == 0 {
		t.Fatalf("clusters through the agent: %v, %v", cds, err)
	}
	// discovery's syncz over its mTLS port, to a debug client with a
	// certificate from ca: the system namespace sees the proxy, with the
	// identity its agent presented; the proxy's namespace too; another
	// namespace does not.
	if proxies := debugSyncz(t, c, s, secureXDS, "istio-system", "flotilla-cli"); len(proxies) != 1 || proxies[0].Identity != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("discovery's syncz to the system namespace: %+v", proxies)
	}
	if proxies := debugSyncz(t, c, s, secureXDS, "shop", "ops"); len(proxies) != 1 {
		t.Fatalf("discovery's syncz to the proxy's namespace: %+v", proxies)
	}
	if proxies := debugSyncz(t, c, s, secureXDS, "bank", "ops"); len(proxies) != 0 {
		t.Fatalf("discovery's syncz to another namespace: %+v", proxies)
	}
	// The CLI the same way: a token shown to ca for a certificate, then
	// discovery's mTLS port.
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(s.Token(t, "istio-system", "flotilla-cli")), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "context.yaml") // the flags say it all
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cli := exec.Command(filepath.Join(binDir, "flotilla"), "proxy-status", "--context-file", empty,
		"--discovery-address", secureXDS, "--ca-address", c.addr, "--token-file", token, "--cacert", filepath.Join(c.state, "roots.pem"))
	if out, err := cli.CombinedOutput(); err != nil || !strings.Contains(string(out), "cart-1.shop   STALE") { // the test's stream does not ACK
		t.Fatalf("flotilla proxy-status over mTLS with a certificate from ca: %v\n%s", err, out)
	}
	// A token ca refuses ends the command at once, saying so, rather than
	// after --timeout.
	forged := filepath.Join(t.TempDir(), "forged")
	if err := os.WriteFile(forged, []byte("not.a.token"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused := exec.Command(filepath.Join(binDir, "flotilla"), "proxy-status", "--context-file", empty, "--timeout", "60s",
		"--discovery-address", secureXDS, "--ca-address", c.addr, "--token-file", forged, "--cacert", filepath.Join(c.state, "roots.pem"))
	if out, err := refused.CombinedOutput(); err == nil || !strings.Contains(string(out), "no certificate from ca at "+c.addr+": ") ||
		!strings.Contains(string(out), "the token was refused") || strings.Contains(string(out), "in time") {
		t.Fatalf("flotilla proxy-status with a token ca refuses: %v\n%s", err, out)
	}
	// The bootstrap the agent wrote for Envoy, from its status port.
	boot := exec.Command(filepath.Join(binDir, "flotilla"), "proxy-config", "bootstrap", "cart-1.shop", "--context-file", empty, "--agent-address", p.admin, "-o", "yaml")
	if out, err := boot.CombinedOutput(); err != nil || !strings.Contains(string(out), "id: sidecar~127.0.0.1~cart-1.shop~shop.svc.cluster.local") || !strings.Contains(string(out), "xds-grpc") {
		t.Fatalf("flotilla proxy-config bootstrap: %v\n%s", err, out)
	}
	xdstest.Eventually(t, "the agent ready", func() bool { code, _ := httpGet(t, "http://"+p.admin+"/healthz/ready"); return code == 200 })
	// What the proxy itself holds, from Envoy's admin through the agent
	// (fakeenvoy answers from the bootstrap the agent wrote, as an Envoy
	// would before xDS answers): its static clusters, their hosts' health,
	// its loggers' levels changed, its stats.
	fromProxy := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "flotilla"), append(args, "--context-file", empty, "--agent-address", p.admin)...).CombinedOutput()
		if err != nil {
			t.Fatalf("flotilla %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := fromProxy("proxy-config", "cluster", "cart-1.shop", "--source", "proxy"); !regexp.MustCompile(`(?m)^xds-grpc\s+-\s+-\s+-\s+STATIC\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^sds-grpc\s`).MatchString(out) {
		t.Fatalf("the proxy's own clusters:\n%s", out)
	}
	if out := fromProxy("proxy-config", "endpoint", "cart-1.shop", "--source", "proxy", "--cluster", "xds-grpc"); !regexp.MustCompile(`(?m)^unix://` + regexp.QuoteMeta(p.xds) + `\s+HEALTHY\s+OK\s+xds-grpc$`).MatchString(out) {
		t.Fatalf("the proxy's own endpoints:\n%s", out)
	}
	if out := fromProxy("proxy-config", "log", "cart-1.shop", "--level", "warning,http:debug"); !strings.HasPrefix(out, "cart-1.shop:\nactive loggers:\n") ||
		!strings.Contains(out, "  http: debug\n") || !strings.Contains(out, "  router: warning\n") {
		t.Fatalf("the proxy's loggers after --level warning,http:debug:\n%s", out)
	}
	if out := fromProxy("proxy-config", "log", "cart-1.shop"); !strings.Contains(out, "  http: debug\n") {
		t.Fatalf("the proxy's loggers, read again:\n%s", out)
	}
	if out := fromProxy("x", "envoy-stats", "cart-1.shop"); !strings.Contains(out, "server.live: 1") {
		t.Fatalf("the proxy's stats:\n%s", out)
	}
	if out := fromProxy("x", "envoy-stats", "cart-1.shop", "-o", "prom-merged"); !strings.Contains(out, "envoy_server_live 1") || !strings.Contains(out, "flotilla") {
		t.Fatalf("the proxy's merged stats:\n%.2000s", out)
	}
	// The workload's certificate and roots, as Envoy holds them, from the
	// agent; its key never.
	secrets := exec.Command(filepath.Join(binDir, "flotilla"), "proxy-config", "secret", "cart-1.shop", "--context-file", empty, "--agent-address", p.admin,
		"--discovery-address", secureXDS, "--ca-address", c.addr, "--token-file", token, "--cacert", filepath.Join(c.state, "roots.pem"))
	out, err := secrets.CombinedOutput()
	if err != nil || strings.Contains(string(out), "PRIVATE KEY") || strings.Contains(string(out), "not shown") {
		t.Fatalf("flotilla proxy-config secret: %v\n%s", err, out)
	}
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		rows = append(rows, strings.Fields(l))
	}
	if len(rows) != 2 || rows[0][0] != "default" || rows[0][3] != "ACTIVE" || rows[0][4] != "true" || rows[0][8] != "spiffe://cluster.local/ns/shop/sa/cart" ||
		rows[1][0] != "ROOTCA" || rows[1][1] != "ROOTCA" || rows[1][3] != "true" {
		t.Fatalf("flotilla proxy-config secret:\n%s", out)
	}
	if _, stats := httpGet(t, "http://"+p.admin+"/stats/prometheus"); !strings.Contains(stats, "envoy_server_live 1") || !strings.Contains(stats, "flotilla") {
		t.Fatalf("merged stats lack Envoy's or the agent's:\n%.2000s", stats)
	}
	if code, body := httpGet(t, "http://"+p.admin+"/app-health/app/livez"); code != 200 {
		t.Fatalf("the rewritten probe: %d %s", code, body)
	}
	if code, _ := httpGet(t, "http://"+p.admin+"/app-health/other/livez"); code != 404 {
		t.Fatalf("a probe that was not rewritten: %d, want 404", code)
	}
	if out, err := exec.Command(filepath.Join(binDir, "flotilla-agent"), "wait", "--url", "http://"+p.admin+"/healthz/ready", "--timeout", "10s").CombinedOutput(); err != nil {
		t.Fatalf("flotilla-agent wait: %v: %s", err, out)
	}

	// SIGTERM: Envoy's listeners drain first, then Envoy stops, then the
	// agent exits cleanly.
	if err := p.agent.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("the agent's exit: %v\n%s", err, p.agent.Out.String())
	}
	rec, _ := os.ReadFile(p.record)
	if got := string(rec); !strings.Contains(got, "drain graceful&inboundonly\nsignal terminated") {
		t.Fatalf("envoy saw:\n%s", got)
	}
}

// TestATokenOfAnotherAccountGetsThatAccountsIdentity: ca decides the
// identity from the token, not from the pod's environment, and discovery
// then refuses the proxy's claim to be the environment's account.
func TestATokenOfAnotherAccountGetsThatAccountsIdentity(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, _ := meshWithDiscovery(t, c, s)
	p := startAgent(t, c, s, secureXDS, "intruder")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if id, _ := workloadSecret(t, p.secrets(t, ctx, "default")); id != "spiffe://cluster.local/ns/shop/sa/intruder" {
		t.Fatalf("with intruder's token the pod got %s", id)
	}
	if _, err := p.clusters(t, ctx); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a proxy claiming cart with intruder's certificate: %v, want PermissionDenied", err)
	}
}

// TestTheHeldCertificateIsServedWhileCAIsAwayAndRenewedWhenItReturns: ca
// stops; the pod keeps serving the certificate it holds; ca comes back
// (same address and state) and the renewal reaches the open SDS stream.
func TestTheHeldCertificateIsServedWhileCAIsAwayAndRenewedWhenItReturns(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, _ := meshWithDiscovery(t, c, s)
	p := startAgent(t, c, s, secureXDS, "cart", "--cert-ttl", "20s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stream := p.secrets(t, ctx, "default")
	_, held := workloadSecret(t, stream)
	c.p.Kill(t)
	// While ca is away, a new stream (an Envoy restarting) still gets the
	// held certificate.
	if _, serial := workloadSecret(t, p.secrets(t, ctx, "default")); serial != held {
		t.Fatalf("with ca away the pod serves %s, want the held %s", serial, held)
	}
	p.agent.Out.WaitFor(t, "getting a certificate from ca failed; retrying")
	startCAAt(t, c.addr, c.state, s)
	if _, renewed := workloadSecret(t, stream); renewed == held {
		t.Fatal("the push after ca returned holds the same certificate")
	}
}

// TestMountedCertificatesAreServedInsteadOfCAsAndReloaded: Istio's
// file-mounted mode — with cert-chain.pem, key.pem and root-cert.pem in
// the certs directory, the agent serves them, and a replaced set is
// pushed.
func TestMountedCertificatesAreServedInsteadOfCAsAndReloaded(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	mesh, err := testpki.NewCA("mounted")
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	mount := func(uri string) {
		leaf, err := mesh.Issue(testpki.Request{CommonName: "w", URIs: []string{uri}})
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"key.pem": leaf.KeyPEM, "cert-chain.pem": leaf.CertPEM, "root-cert.pem": mesh.CertPEM} {
			if err := os.WriteFile(filepath.Join(certs, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	mount("spiffe://cluster.local/ns/shop/sa/mounted")
	p := startAgent(t, c, s, proc.FreeAddr(t), "cart", "--certs-dir", certs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream := p.secrets(t, ctx, "default")
	if id, _ := workloadSecret(t, stream); id != "spiffe://cluster.local/ns/shop/sa/mounted" {
		t.Fatalf("the pod serves %s, want the mounted certificate", id)
	}
	mount("spiffe://cluster.local/ns/shop/sa/remounted")
	if id, _ := workloadSecret(t, stream); id != "spiffe://cluster.local/ns/shop/sa/remounted" {
		t.Fatalf("after the files changed the pod serves %s", id)
	}
	if p.agent.Out.Count("certificate from ca") > 0 {
		t.Fatal("the agent asked ca although certificates are mounted")
	}
}
