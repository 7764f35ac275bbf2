// Package dashboards_test checks the Grafana dashboards the chart ships
// against a real Prometheus (bin/tools/prometheus, pinned in
// tools/prometheus): it scrapes the control plane `make run` starts, while
// proxies, webhook callers and certificate clients use it, and every query
// of every panel must return data.
package dashboards_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, nil, "devrun", "flotilla-galley", "flotilla-discovery", "flotilla-ca", "flotilla-injector"))
}

// The control plane's ports as make run binds them (internal/dev/cmd/devrun),
// before --port-offset.
const (
	caGRPC, caAdmin                       = 15013, 15018
	galleyWebhook, galleyAdmin            = 15017, 15015
	discovery1, discovery1Admin           = 15010, 15014
	discovery2, discovery2Admin           = 15110, 15114
	injectorWebhook, injectorAdmin        = 15016, 15022
	galleyMCP, secure1, secure2           = 15019, 15012, 15112
	galleyName, injectorName, systemAdmin = "flotilla-galley.istio-system.svc", "flotilla-injector.istio-system.svc", "default"
)

// TestEveryPanelOfTheShippedDashboardsShowsData runs make run's control
// plane (two discovery replicas, galley with its webhook, ca, the
// injector) on moved ports, and uses it as a mesh does: proxyless clients
// on each replica follow a routing change, one proxy rejects what it is
// sent, the validating webhook passes and refuses objects, the injector
// injects, skips and refuses, and ca signs, refuses a caller without a
// token and a broken CSR. A real Prometheus scrapes every service's admin
// port; each query of each panel of deploy/helm/flotilla/dashboards is
// asked of it (Grafana's $__rate_interval as a window covering the run)
// and must return at least one series with a number.
func TestEveryPanelOfTheShippedDashboardsShowsData(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	prometheus := filepath.Join(root, "bin", "tools", "prometheus")
	if _, err := os.Stat(prometheus); err != nil {
		t.Fatalf("%v: run `make tools` (prometheus is pinned in tools/prometheus)", err)
	}
	panels := shippedQueries(t, filepath.Join(root, "deploy", "helm", "flotilla", "dashboards"))

	offset := freeOffset(t)
	at := func(port int) string { return "127.0.0.1:" + strconv.Itoa(port+offset) }
	config, state := t.TempDir(), t.TempDir()
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	xdstest.WriteFile(t, config, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, config, "routing.yaml", xdstest.Routing(80, 20))
	stack := proc.StartCommand(t, "devrun", filepath.Join(binDir, "devrun"), "--bin", binDir, "--config-dir", config, "--state-dir", state,
		"--port-offset", strconv.Itoa(offset), "--services", "ca,galley,discovery-1,discovery-2,injector")
	stack.Out.WaitForCount(t, "msg=serving service=flotilla-discovery source=galley:"+at(galleyMCP), 2)
	stack.Out.WaitFor(t, "msg=serving service=flotilla-injector")

	prom := startPrometheus(t, prometheus, map[string]string{
		"galley": at(galleyAdmin), "discovery-1": at(discovery1Admin), "discovery-2": at(discovery2Admin),
		"ca": at(caAdmin), "injector": at(injectorAdmin),
	})

	// Proxies on both replicas, one of which rejects what it is sent.
	var clients []testgrpc.TestServiceClient
	for i, replica := range []int{discovery1, discovery2} {
		c := xdstest.Client(t, fmt.Sprintf("sidecar~127.0.0.%d~client-%d.default~default.svc.cluster.local", i+2, i), xdstest.Target, at(replica))
		xdstest.Eventually(t, "calls routed by discovery", func() bool { return xdstest.Count(t, c, 10)["v1"] > 0 })
		clients = append(clients, c)
	}
	rejectingProxy(t, at(discovery1))
	roots := filepath.Join(state, "roots.pem")
	// Twice, seconds apart: Prometheus' rate() counts what a series gained
	// between scrapes, so a histogram born with its first observation
	// shows no rate until its second.
	for round := range 2 {
		xdstest.WriteFile(t, config, "routing.yaml", xdstest.Routing(100*round, 100-100*round))
		for _, c := range clients {
			xdstest.Eventually(t, "the routing change", func() bool { return xdstest.Count(t, c, 10)["v"+strconv.Itoa(2-round)] == 10 })
		}
		validations(t, "https://"+at(galleyWebhook)+"/validate", roots)
		injections(t, "https://"+at(injectorWebhook)+"/inject", roots)
		certificates(t, at(caGRPC), roots, state)
		time.Sleep(3 * time.Second)
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing []string
		for _, q := range panels {
			// A window covering the whole run: every event above is in it.
			expr := strings.ReplaceAll(q.expr, "$__rate_interval", "10m")
			if why := prom.noData(t, expr); why != "" {
				missing = append(missing, fmt.Sprintf("panel %q, %s: %s", q.panel, q.expr, why))
			}
		}
		if len(missing) == 0 {
			t.Logf("%d queries of %s answered", len(panels), "deploy/helm/flotilla/dashboards")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d queries returned no data:\n%s", len(missing), len(panels), strings.Join(missing, "\n"))
		}
		time.Sleep(2 * time.Second)
	}
}

// query is one target of one panel of a shipped dashboard.
type query struct{ panel, expr string }

// shippedQueries reads every target's expression from the dashboards in dir.
func shippedQueries(t *testing.T, dir string) []query {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dir, err)
	}
	var out []query
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Type, Title string
				Targets     []struct{ Expr string }
			}
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, query{p.Title, tg.Expr})
			}
		}
	}
	return out
}

// freeOffset is a --port-offset whose control-plane ports are all free
// here, so the stack runs beside make run's tests: 5000 to 8000, whose
// ports are below the kernel's ephemeral range (where outgoing
// connections take theirs) and below proc.FreeAddr's.
func freeOffset(t *testing.T) int {
	t.Helper()
	ports := []int{
		caGRPC, caAdmin, galleyWebhook, galleyAdmin, galleyMCP, discovery1, discovery1Admin, secure1,
		discovery2, discovery2Admin, secure2, injectorWebhook, injectorAdmin,
	}
	for offset := 5000; offset <= 8000; offset += 1000 {
		free := true
		for _, p := range ports {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+offset))
			if err != nil {
				free = false
				break
			}
			_ = l.Close()
		}
		if free {
			return offset
		}
	}
	t.Fatal("no port offset with every control-plane port free")
	return 0
}

type prometheusServer struct{ url string }

// startPrometheus runs Prometheus scraping each named admin address's
// /metrics every second, and waits until every target is up.
func startPrometheus(t *testing.T, path string, targets map[string]string) prometheusServer {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n")
	for job, addr := range targets {
		fmt.Fprintf(&cfg, "- job_name: %s\n  static_configs: [{targets: [%q]}]\n", job, addr)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := proc.FreeAddr(t)
	proc.StartCommand(t, "prometheus", path, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	p := prometheusServer{url: "http://" + addr}
	proc.WaitReady(t, p.url+"/-/ready")
	xdstest.Eventually(t, "Prometheus scraping every service", func() bool {
		return p.noData(t, fmt.Sprintf("count(up == 1) == %d", len(targets))) == ""
	})
	return p
}

// noData asks expr of Prometheus at this instant; it returns "" when at
// least one series has a number, else what came back.
func (p prometheusServer) noData(t *testing.T, expr string) string {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr)) //nolint:noctx // the test's Prometheus on loopback
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Status, Error string
		Data          struct {
			Result []struct {
				Value [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		// A query Prometheus refuses is the dashboard's bug: say it at once.
		t.Fatalf("query %s: HTTP %d, %s (%v)", expr, resp.StatusCode, body, err)
	}
	for _, s := range r.Data.Result {
		if v, ok := s.Value[1].(string); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
				return ""
			}
		}
	}
	if len(r.Data.Result) == 0 {
		return "no series"
	}
	return fmt.Sprintf("%d series, none a number: %s", len(r.Data.Result), body)
}

// rejectingProxy opens an ADS stream as a sidecar, asks for clusters and
// rejects what it gets, as an Envoy does with configuration it cannot
// apply; the stream stays open until the test ends.
func rejectingProxy(t *testing.T, addr string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := structpb.NewStruct(map[string]any{"ISTIO_VERSION": "1.29.1", "NAMESPACE": "default"})
	if err != nil {
		t.Fatal(err)
	}
	const clusters = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	node := &corev3.Node{Id: "sidecar~127.0.0.9~rejecting.default~default.svc.cluster.local", Metadata: meta}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: clusters}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{
		TypeUrl: clusters, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: int32(codes.InvalidArgument), Message: "rejected by the dashboards' test"},
	}); err != nil {
		t.Fatal(err)
	}
}

// webhookClient trusts the roots make run's ca published, as the
// apiserver trusts the webhook configuration's caBundle.
func webhookClient(t *testing.T, rootsFile, serverName string) *http.Client {
	t.Helper()
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: rootPool(t, rootsFile), ServerName: serverName},
	}}
}

func rootPool(t *testing.T, rootsFile string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(rootsFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b) {
		t.Fatalf("%s holds no certificate", rootsFile)
	}
	return roots
}

// review posts an AdmissionReview of object and returns the HTTP status.
func review(t *testing.T, c *http.Client, url string, gvk metav1.GroupVersionKind, resource string, object any) int {
	t.Helper()
	raw, err := json.Marshal(object)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "dashboards", Kind: gvk, Resource: metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource},
			Namespace: "default", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return post(t, c, url, body)
}

func post(t *testing.T, c *http.Client, url string, body []byte) int {
	t.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body)) //nolint:noctx // bounded by the client's timeout
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// validations: galley's webhook passes a VirtualService and refuses one
// whose weights do not add up to 100.
func validations(t *testing.T, url, roots string) {
	t.Helper()
	c := webhookClient(t, roots, galleyName)
	gvk := metav1.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "VirtualService"}
	vs := func(w1, w2 int) map[string]any {
		return map[string]any{
			"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
			"metadata": map[string]any{"name": "reviews", "namespace": "default"},
			"spec": map[string]any{"hosts": []string{"reviews"}, "http": []any{map[string]any{"route": []any{
				map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v1"}, "weight": w1},
				map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v2"}, "weight": w2},
			}}}},
		}
	}
	for _, w := range [][2]int{{80, 20}, {80, 10}} {
		if code := review(t, c, url, gvk, "virtualservices", vs(w[0], w[1])); code != http.StatusOK {
			t.Fatalf("validation review: HTTP %d", code)
		}
	}
}

// injections: the injector injects a pod that asks for it, skips one that
// does not, and refuses a body that is not a review.
func injections(t *testing.T, url, roots string) {
	t.Helper()
	c := webhookClient(t, roots, injectorName)
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	pod := func(inject string) *corev1.Pod {
		return &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "app-" + inject, Namespace: "default", Labels: map[string]string{"sidecar.istio.io/inject": inject}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		}
	}
	for _, inject := range []string{"true", "false"} {
		if code := review(t, c, url, gvk, "pods", pod(inject)); code != http.StatusOK {
			t.Fatalf("injection review: HTTP %d", code)
		}
	}
	if code := post(t, c, url, []byte(`{"apiVersion":`)); code != http.StatusBadRequest {
		t.Fatalf("a broken review: HTTP %d, want 400", code)
	}
}

// certificates: ca signs a CSR for the operator's token, refuses a caller
// without a token and a CSR that does not parse.
func certificates(t *testing.T, addr, roots, state string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, debugapi.ContextFileName))
	if err != nil {
		t.Fatal(err)
	}
	ctxFile, err := debugapi.ParseContext(b)
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(ctxFile.TokenFile)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: rootPool(t, roots), ServerName: "flotilla-ca.istio-system.svc",
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	client := securityv1alpha1.NewIstioCertificateServiceClient(cc)
	for _, c := range []struct {
		token, csr string
		want       codes.Code
	}{
		{strings.TrimSpace(string(token)), csr, codes.OK},
		{"", csr, codes.Unauthenticated},
		{strings.TrimSpace(string(token)), "-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgQ1NS\n-----END CERTIFICATE REQUEST-----\n", codes.InvalidArgument},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c.token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
		}
		_, err := client.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: c.csr, ValidityDuration: 3600})
		cancel()
		if status.Code(err) != c.want {
			t.Fatalf("CreateCertificate: %v, want %s", err, c.want)
		}
	}
}
