// Package istioagent_test runs Istio's own agent, pilot-agent (the agent of
// Istio's proxyv2 sidecar image; make builds it into bin/tools from the
// Istio module tools/istio pins), against Flotilla's control plane, all as
// processes on loopback. Each pilot-agent runs in a directory of its own
// that stands for its pod's filesystem (pilot-agent's paths are relative
// to its working directory: the token, the root certificate, its sockets)
// and with only the environment Istio's injection templates give an
// injected pod, its addresses pointed at loopback.
package istioagent_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var (
	binDir string
	// istioVersion is the version pilot-agent reports (in its node's
	// ISTIO_VERSION): what make stamps it with, as Istio's Makefile stamps
	// a build of its tree (its VERSION file and "-dev").
	istioVersion string
	// pilotAgent is bin/tools/pilot-agent, built by make (istio-agent);
	// envoyTemplate the Envoy bootstrap template Istio's proxyv2 image
	// holds for it, copied there beside it.
	pilotAgent, envoyTemplate string
)

func TestMain(m *testing.M) {
	root, err := build.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Missing, the tests fail rather than skip: make test builds it first.
	pilotAgent = filepath.Join(root, "bin", "tools", "pilot-agent")
	envoyTemplate = filepath.Join(root, "bin", "tools", "envoy_bootstrap_tmpl.json")
	for _, f := range []string{pilotAgent, envoyTemplate} {
		if _, err := os.Stat(f); err != nil {
			fmt.Fprintf(os.Stderr, "Istio's pilot-agent: %v (make istio-agent builds it)\n", err)
			os.Exit(1)
		}
	}
	out, err := exec.Command(pilotAgent, "version", "-o", "json").Output()
	var v struct {
		ClientVersion struct {
			Version string `json:"version"`
		} `json:"clientVersion"`
	}
	if err == nil {
		err = json.Unmarshal(out, &v)
	}
	if istioVersion = v.ClientVersion.Version; err != nil || istioVersion == "" {
		fmt.Fprintf(os.Stderr, "pilot-agent version: %v\n%s", err, out)
		os.Exit(1)
	}
	os.Exit(build.Main(m, &binDir, nil, "flotilla-ca", "flotilla-discovery", "flotilla-demo", "flotilla", "standinenvoy"))
}

// mesh is ca and one discovery replica serving the Istio YAML of a
// directory, discovery with its certificate from ca.
type mesh struct {
	s *proc.Signer
	// roots is ca's roots.pem: what Istio's istio-ca-root-cert ConfigMap
	// holds for a pod.
	roots string
	// secureXDS is discovery's TLS xDS port, the one pilot-agent talks to
	// (istiod's 15012); admin its admin port.
	secureXDS, admin string
	// config is discovery's --config-dir.
	config string
	// ca is ca's address (the flotilla CLI gets its certificate there).
	ca string
}

// startMesh runs ca and discovery serving config.
func startMesh(tb testing.TB, config string) *mesh {
	tb.Helper()
	s := proc.NewSigner(tb)
	state := tb.TempDir()
	caAddr, caAdmin := proc.FreeAddr(tb), proc.FreeAddr(tb)
	proc.Start(tb, "ca", filepath.Join(binDir, "flotilla-ca"), "--address", caAddr, "--admin-address", caAdmin,
		"--state-dir", state, "--jwks-file", s.JWKS, "--jwt-issuer", proc.SignerIssuer)
	proc.WaitReady(tb, "http://"+caAdmin+"/readyz")
	m := &mesh{s: s, roots: filepath.Join(state, "roots.pem"), secureXDS: proc.FreeAddr(tb), admin: proc.FreeAddr(tb), config: config, ca: caAddr}
	token := filepath.Join(tb.TempDir(), "token")
	if err := os.WriteFile(token, []byte(s.Token(tb, "istio-system", "flotilla-discovery")), 0o600); err != nil {
		tb.Fatal(err)
	}
	proc.Start(tb, "discovery", filepath.Join(binDir, "flotilla-discovery"), "--config-dir", config,
		"--xds-address", proc.FreeAddr(tb), "--secure-xds-address", m.secureXDS, "--admin-address", m.admin, "--debounce-quiet", "20ms",
		"--ca-address", caAddr, "--ca-roots-file", m.roots, "--token-file", token)
	proc.WaitReady(tb, "http://"+m.admin+"/readyz")
	return m
}

// podSpec is what an injected pod's pilot-agent is told about its pod.
type podSpec struct {
	name, namespace, account string
	// workload is the pod's Deployment (the template's
	// ISTIO_META_WORKLOAD_NAME and ISTIO_META_OWNER).
	workload string
	labels   map[string]string
	// proxyless injects with Istio's grpc-agent template (proxyless gRPC)
	// rather than the sidecar template.
	proxyless bool
	// certTTL is the workload certificates' lifetime (SECRET_TTL).
	certTTL time.Duration
	// dnsCapture turns on the agent's DNS proxy as the mesh's
	// proxyMetadata does (ISTIO_META_DNS_CAPTURE), at the pod's dns
	// address (DNS_PROXY_ADDR; 15053 in a pod).
	dnsCapture bool
}

// pod is a pilot-agent running in its pod's directory.
type pod struct {
	spec  podSpec
	dir   string
	agent *proc.Process
	// status is pilot-agent's status port (15020 in a pod); envoyAdmin
	// Envoy's admin port (15000), a sidecar's only; dns its DNS proxy's
	// address, with dnsCapture.
	status, envoyAdmin, dns string
}

// envoyAdminPort reserves the port of Envoy's admin.
func (p *pod) envoyAdminPort(tb testing.TB) int {
	tb.Helper()
	p.envoyAdmin = proc.FreeAddr(tb)
	n, err := strconv.Atoi(port(p.envoyAdmin))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// path is a path of the pod's filesystem: Istio's absolute paths are
// under the pod's directory here.
func (p *pod) path(elem ...string) string { return filepath.Join(append([]string{p.dir}, elem...)...) }

// startPod writes what the kubelet mounts into an injected pod (the
// projected token, the istiod-ca-cert ConfigMap's root certificate, the
// downward API's labels and annotations) into a directory of its own and
// runs pilot-agent there as the injected istio-proxy container runs it:
// Istio's arguments and only the environment the injection template
// renders.
func startPod(tb testing.TB, m *mesh, spec podSpec) *pod {
	tb.Helper()
	// Short: the pod's Unix sockets live under it.
	dir, err := os.MkdirTemp("", "pod")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := &pod{spec: spec, dir: dir, status: proc.FreeAddr(tb)}
	roots, err := os.ReadFile(m.roots)
	if err != nil {
		tb.Fatal(err)
	}
	template, err := os.ReadFile(envoyTemplate)
	if err != nil {
		tb.Fatal(err)
	}
	for name, content := range map[string]string{
		"var/run/secrets/tokens/istio-token":  m.s.Token(tb, spec.namespace, spec.account),
		"var/run/secrets/istio/root-cert.pem": string(roots),
		"etc/istio/pod/labels":                downwardAPI(spec.labels),
		"etc/istio/pod/annotations":           downwardAPI(map[string]string{"istio.io/rev": "default"}),
		// The proxyv2 image's.
		"var/lib/istio/envoy/envoy_bootstrap_tmpl.json": string(template),
	} {
		writeFile(tb, p.path(name), content)
	}
	// The templates' emptyDir volumes, which exist before the container
	// starts.
	for _, volume := range []string{"etc/istio/proxy", "var/lib/istio/data", "var/run/secrets/workload-spiffe-uds", "var/run/secrets/workload-spiffe-credentials"} {
		if err := os.MkdirAll(p.path(volume), 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	args := []string{
		"proxy", "sidecar", "--domain", spec.namespace + ".svc.cluster.local",
		"--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error", "--log_output_level=default:info",
	}
	p.agent = proc.StartIn(tb, "pilot-agent-"+spec.name, dir, p.env(tb, m), pilotAgent, args...)
	return p
}

// env is the istio-proxy container's environment as Istio's injection
// templates (grpc-agent.yaml for proxyless, injection-template.yaml for a
// sidecar) render it, with the pod's fields filled in as the kubelet
// would, and the addresses pointed at loopback.
func (p *pod) env(tb testing.TB, m *mesh) []string {
	tb.Helper()
	status, err := strconv.Atoi(port(p.status))
	if err != nil {
		tb.Fatal(err)
	}
	// istiod.istio-system.svc:15012 in a cluster. "localhost": pilot-agent
	// then checks discovery's certificate for istiod.istio-system.svc (as
	// pilot/pkg/grpc/tls.go's getTLSDialOption does for a port-forward).
	discovery := "localhost:" + port(m.secureXDS)
	// The mesh's proxyMetadata, rendered by both templates as variables
	// of their own as well: no metadata server to probe for a cloud
	// platform (only loopback here), and the certificates' lifetime.
	metadata := map[string]string{"CLOUD_PLATFORM": "none", "SECRET_TTL": p.spec.certTTL.String()}
	if p.spec.dnsCapture {
		metadata["ISTIO_META_DNS_CAPTURE"] = "true"
	}
	// The injected ProxyConfig (the template's protoToJSON .ProxyConfig,
	// the mesh's defaults with the pod's proxy.istio.io/config): the
	// status port each pod's own (they share one host here), and the
	// configuration directory the pod's: pilot-agent names its xDS socket
	// in the bootstraps by that path.
	config := map[string]any{
		"discoveryAddress": discovery,
		"configPath":       p.path("etc/istio/proxy"),
		"statusPort":       status,
		"proxyMetadata":    metadata,
	}
	if !p.spec.proxyless {
		// Envoy: the stand-in, its admin port the pod's own, and a short
		// drain.
		config["binaryPath"] = filepath.Join(binDir, "standinenvoy")
		config["proxyAdminPort"] = p.envoyAdminPort(tb)
		config["terminationDrainDuration"] = "1s"
	}
	proxyConfig, err := json.Marshal(config)
	if err != nil {
		tb.Fatal(err)
	}
	env := map[string]string{
		"PILOT_CERT_PROVIDER": "istiod",
		// Both templates set CA_ADDR to istiod's address, the discovery
		// address: certificates come from discovery's port too.
		"CA_ADDR":                   discovery,
		"POD_NAME":                  p.spec.name,
		"POD_NAMESPACE":             p.spec.namespace,
		"INSTANCE_IP":               "127.0.0.1",
		"SERVICE_ACCOUNT":           p.spec.account,
		"HOST_IP":                   "127.0.0.1",
		"PROXY_CONFIG":              string(proxyConfig),
		"ISTIO_META_APP_CONTAINERS": "app",
		"ISTIO_META_CLUSTER_ID":     "Kubernetes",
		"ISTIO_META_NODE_NAME":      "node-1",
		"ISTIO_META_WORKLOAD_NAME":  p.spec.workload,
		"ISTIO_META_OWNER":          "kubernetes://apis/apps/v1/namespaces/" + p.spec.namespace + "/deployments/" + p.spec.workload,
		"ISTIO_META_MESH_ID":        "cluster.local",
		"TRUST_DOMAIN":              "cluster.local",
	}
	maps.Copy(env, metadata)
	if p.spec.dnsCapture {
		p.dns = proc.FreeAddr(tb)
		env["DNS_PROXY_ADDR"] = p.dns
	}
	if p.spec.proxyless {
		env["ISTIO_META_GENERATOR"] = "grpc"
		env["OUTPUT_CERTS"] = p.path("var/lib/istio/data")
		env["ISTIO_META_DNS_CAPTURE"] = "false"
		env["DISABLE_ENVOY"] = "true"
	} else {
		env["ISTIO_META_INTERCEPTION_MODE"] = "REDIRECT"
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// downwardAPI is the downward API's file format of a map (key="value"
// lines), as the istio-podinfo volume holds a pod's labels.
func downwardAPI(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}

// port is the port of a host:port address.
func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

func writeFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
}
