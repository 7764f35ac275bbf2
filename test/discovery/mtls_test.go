package discovery_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestGalleyToDiscoveryAndDiscoveryToProxiesOverMTLS: discovery subscribes
// to galley with a client certificate, and serves xDS on its mTLS port to
// clients with a certificate from the mesh CA only.
func TestGalleyToDiscoveryAndDiscoveryToProxiesOverMTLS(t *testing.T) {
	ca, err := testpki.NewCA("flotilla-test-root")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	galleyID := ca.IssueFiles(t, "galley", "spiffe://cluster.local/ns/istio-system/sa/flotilla-galley")
	discoveryID := ca.IssueFiles(t, "discovery", "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery")
	proxyID := ca.IssueFiles(t, "proxy", "spiffe://cluster.local/ns/default/sa/app")

	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(1234, "v1")))
	mcpAddr, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	galley := proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"),
		"--config-dir", dir, "--mcp-address", mcpAddr, "--admin-address", galleyAdmin,
		"--mcp-tls-cert-file", galleyID.Cert, "--mcp-tls-key-file", galleyID.Key, "--mcp-tls-ca-file", caFile)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")

	secure, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	disc := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--galley-address", mcpAddr, "--xds-address", proc.FreeAddr(t), "--admin-address", admin,
		"--galley-tls-cert-file", discoveryID.Cert, "--galley-tls-key-file", discoveryID.Key, "--galley-tls-ca-file", caFile,
		"--secure-xds-address", secure,
		"--xds-tls-cert-file", discoveryID.Cert, "--xds-tls-key-file", discoveryID.Key, "--xds-tls-ca-file", caFile)
	proc.WaitReady(t, "http://"+admin+"/readyz") // ready only once it has galley's collections: the mTLS hop works
	galley.Out.WaitFor(t, "subscriber connected")

	fetch := func(cert *tls.Certificate, nodeID string) (int, error) {
		cfg := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		cc, err := grpc.NewClient(secure, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return 0, err
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			return 0, err
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{
			Node:    &corev3.Node{Id: nodeID},
			TypeUrl: resourcev3.ClusterType,
		}); err != nil {
			return 0, err
		}
		resp, err := st.Recv()
		if err != nil {
			return 0, err
		}
		return len(resp.GetResources()), nil
	}
	pair, err := tls.LoadX509KeyPair(proxyID.Cert, proxyID.Key)
	if err != nil {
		t.Fatal(err)
	}
	const app = "sidecar~10.0.0.9~app-1.default~default.svc.cluster.local"
	n, err := fetch(&pair, app)
	if err != nil || n < 3 {
		t.Fatalf("over mTLS with a mesh certificate: %d clusters, %v", n, err)
	}
	// A workload of default cannot ask for another namespace's config.
	if _, err := fetch(&pair, "sidecar~10.0.0.9~app-1.bank~bank.svc.cluster.local"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node claiming another namespace than its certificate: %v, want PermissionDenied", err)
	}
	if _, err := fetch(nil, app); err == nil {
		t.Fatal("the mTLS port served a client without a certificate")
	}
	other, err := testpki.NewCA("someone-else")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Issue(testpki.Request{CommonName: "stranger"})
	if err != nil {
		t.Fatal(err)
	}
	strangerPair, err := stranger.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fetch(&strangerPair, app); err == nil {
		t.Fatal("the mTLS port served a client whose certificate another CA signed")
	}
	_ = disc
}

// TestDiscoveryMetricsAreExported checks the push, proxy and convergence
// metrics reach /metrics.
func TestDiscoveryMetricsAreExported(t *testing.T) {
	v1 := xdstest.StartBackend(t, "v1")
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
	g := startGalley(t, dir, proc.FreeAddr(t))
	d := startDiscovery(t, g.mcp)
	c := xdstest.Client(t, "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local", xdstest.Target, d.xds)
	if got := xdstest.Count(t, c, 10); got["v1"] != 10 {
		t.Fatalf("calls: %v", got)
	}
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	xdstest.Eventually(t, "the change", func() bool { return xdstest.Count(t, c, 5)["error: "] == 0 && len(d.syncz(t)) == 1 })
	want := []string{
		"flotilla_discovery_proxies_connected", "flotilla_discovery_pushes_total", "flotilla_discovery_xds_responses_total",
		"flotilla_discovery_push_duration_seconds_bucket", "flotilla_discovery_convergence_seconds_bucket",
		"flotilla_discovery_push_context_build_seconds_bucket", "flotilla_discovery_debounce_delay_seconds_bucket",
		"flotilla_discovery_debounce_merged_bucket",
	}
	xdstest.Eventually(t, "the metrics", func() bool {
		resp, err := http.Get("http://" + d.admin + "/metrics") //nolint:noctx // test-local
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, w := range want {
			if !strings.Contains(string(body), w) {
				return false
			}
		}
		return true
	})
}
