package galley_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// unitCommand is a command line of deploy/vm/flotilla-agent.service (key
// ExecStartPre or ExecStart), its ${VAR}s expanded from env as systemd
// expands them, split into words.
func unitCommand(t *testing.T, key string, env map[string]string) []string {
	t.Helper()
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "deploy", "vm", "flotilla-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := regexp.MustCompile(`\$\{([A-Z_]+)\}`)
	s := bufio.NewScanner(f)
	for s.Scan() {
		line, ok := strings.CutPrefix(s.Text(), key+"=")
		if !ok {
			continue
		}
		line = strings.TrimPrefix(line, "+") // as root
		line = vars.ReplaceAllStringFunc(line, func(v string) string { return env[v[2:len(v)-1]] })
		return strings.Fields(line)
	}
	t.Fatalf("the unit has no %s", key)
	return nil
}

// readClusterEnv reads cluster.env as systemd's EnvironmentFile does
// (KEY=value, single-quoted values).
func readClusterEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		if strings.HasPrefix(v, "'") {
			v = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'"), `'"'"'`, "'")
		}
		out[k] = v
	}
	return out
}

// TestAVMAgentFromItsConfigureFilesJoinsRegistersAndReportsItsProbe is a
// VM joining the mesh as deploy/vm says, as processes on a real
// apiserver: `flotilla x workload entry configure` writes the files for
// a WorkloadGroup from the cluster; the unit's capture command takes
// cluster.env's values; flotilla-agent, run as the unit runs it with
// only cluster.env's environment and mesh.yaml, relays its (stand-in)
// Envoy's stream to discovery over mTLS; discovery has galley register
// the WorkloadEntry, and the agent's probe of the workload (the group's)
// becomes the entry's Healthy condition, True while the workload listens
// and False once it stops. The workload's certificate is mounted (Istio's
// /etc/certs) rather than got from ca with the token: the token's way is
// the pods' (test/ca), and cli/workload checks the token's claims.
func TestAVMAgentFromItsConfigureFilesJoinsRegistersAndReportsItsProbe(t *testing.T) {
	ctx := context.Background()
	m := newGatewayMesh(t, map[string]string{"vm": "unused"})
	ns := m.namespaces["vm"]
	m.startDiscovery(t, "--replica-name", "discovery-a")
	app, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	appPort := app.Addr().(*net.TCPAddr).Port

	// What the control plane keeps in the cluster, as the chart and ca do.
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: m.system}, Data: map[string]string{"mesh": "trustDomain: cluster.local\ndefaultConfig:\n  discoveryAddress: " + m.secure + "\n"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-sidecar-injector", Namespace: m.system}, Data: map[string]string{"values": "clusterID: east\ncaAddress: flotilla-ca." + m.system + ".svc:15013\n"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert", Namespace: ns}, Data: map[string]string{"root-cert.pem": string(m.ca.CertPEM)}},
	} {
		if _, err := env.Client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.CreateServiceAccount(ctx, ns, "legacy"); err != nil {
		t.Fatal(err)
	}
	group := `apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: legacy, namespace: ` + ns + `}
spec:
  metadata: {labels: {app: legacy}}
  template: {serviceAccount: legacy, ports: {http: 8080}}
  probe: {periodSeconds: 1, tcpSocket: {host: 127.0.0.1, port: ` + strconv.Itoa(appPort) + `}}
`
	js, err := yaml.YAMLToJSON([]byte(group))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Discovery().RESTClient().Post().AbsPath("/apis/networking.istio.io/v1/namespaces", ns, "workloadgroups").
		SetHeader("Content-Type", "application/json").Body(js).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}

	// The files, from the cluster.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	files, err := os.MkdirTemp("", "vm") // short: the agent's sockets go near it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(files) })
	out, err := exec.Command(filepath.Join(binDir, "flotilla"), "x", "workload", "entry", "configure", "--kubeconfig", kubeconfig,
		"--istio-namespace", m.system, "--name", "legacy", "--namespace", ns, "-o", filepath.Join(files, "etc"),
		"--autoregister", "--capture-dns=false", "--internalIP", "10.9.0.7", "--ingressIP", "127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("configure: %v\n%s", err, out)
	}
	clusterEnv := readClusterEnv(t, filepath.Join(files, "etc", "cluster.env"))
	if clusterEnv["DISCOVERY_ADDRESS"] != m.secure || clusterEnv["ISTIO_META_AUTO_REGISTER_GROUP"] != "legacy" || clusterEnv["ISTIO_SVC_IP"] != "10.9.0.7" {
		t.Fatalf("cluster.env %v", clusterEnv)
	}

	// The unit's capture, with cluster.env's values (printed, not
	// installed: the test does not own this machine's network).
	capture := unitCommand(t, "ExecStartPre", clusterEnv)
	cmd := exec.Command(filepath.Join(binDir, "flotilla-agent"), append(capture[1:], "--dry-run")...)
	for k, v := range clusterEnv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	rules, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(rules), "8080") {
		t.Fatalf("the unit's capture with cluster.env's values: %v\n%s", err, rules)
	}

	// The workload's mounted certificate (Istio's /etc/certs).
	certs := filepath.Join(files, "certs")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	id := m.ca.IssueFiles(t, "legacy", "spiffe://cluster.local/ns/"+ns+"/sa/legacy")
	for name, from := range map[string]string{"cert-chain.pem": id.Cert, "key.pem": id.Key} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		xdstest.WriteFile(t, certs, name, string(b))
	}
	xdstest.WriteFile(t, certs, "root-cert.pem", string(m.ca.CertPEM))

	// The agent as the unit runs it, with only cluster.env's environment;
	// what differs on this machine (paths, the stand-in Envoy) after.
	xdsSocket, envoyConfig, envoyAdmin := filepath.Join(files, "XDS"), filepath.Join(files, "envoy-rev.json"), proc.FreeAddr(t)
	run := unitCommand(t, "ExecStart", clusterEnv)
	var agentEnv []string
	for k, v := range clusterEnv {
		agentEnv = append(agentEnv, k+"="+v)
	}
	agentEnv = append(agentEnv, "FAKE_ENVOY_ADMIN="+envoyAdmin, "FAKE_ENVOY_RECORD="+filepath.Join(files, "record"))
	proc.StartIn(t, "vm-agent", files, agentEnv, filepath.Join(binDir, "flotilla-agent"), append(run[1:],
		"--mesh-config-file", filepath.Join(files, "etc", "mesh.yaml"), "--certs-dir", certs, "--discovery-server-name", "127.0.0.1",
		"--admin-address", proc.FreeAddr(t), "--sds-socket", filepath.Join(files, "SDS"), "--xds-socket", xdsSocket,
		"--envoy-binary", filepath.Join(binDir, "fakeenvoy"), "--envoy-config", envoyConfig, "--envoy-admin", envoyAdmin,
	)...)

	// The stand-in Envoy's stream, with the node of the bootstrap the
	// agent wrote (as Envoy would send it).
	var node *corev3.Node
	xdstest.EventuallyWithin(t, 60*time.Second, "the bootstrap written", func() bool {
		b, err := os.ReadFile(envoyConfig)
		if err != nil {
			return false
		}
		var boot struct {
			Node json.RawMessage `json:"node"`
		}
		node = &corev3.Node{}
		return json.Unmarshal(b, &boot) == nil && (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(boot.Node, node) == nil
	})
	xdstest.EventuallyWithin(t, 30*time.Second, "the xDS socket", func() bool { _, err := os.Stat(xdsSocket); return err == nil })
	cc, err := grpc.NewClient("unix://"+xdsSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("the VM's stream through its agent: %v", err)
	}
	go func() { // Envoy reads on
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()

	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	healthy := func(we *networkingv1.WorkloadEntry) string {
		for _, c := range we.Status.GetConditions() {
			if c.GetType() == "Healthy" {
				return c.GetStatus() + " " + c.GetMessage()
			}
		}
		return ""
	}
	var we *networkingv1.WorkloadEntry
	waitEntry := func(what string, ok func(*networkingv1.WorkloadEntry) bool) {
		t.Helper()
		xdstest.EventuallyWithin(t, 60*time.Second, what, func() bool {
			var err error
			we, err = ic.NetworkingV1().WorkloadEntries(ns).Get(ctx, "legacy-10.9.0.7", metav1.GetOptions{})
			return err == nil && ok(we)
		})
	}
	waitEntry("the VM's entry, healthy", func(we *networkingv1.WorkloadEntry) bool { return strings.HasPrefix(healthy(we), "True") })
	if we.Annotations["istio.io/autoRegistrationGroup"] != "legacy" || we.Annotations["proxy.istio.io/health-checks-enabled"] != "true" ||
		we.Spec.GetServiceAccount() != "legacy" || we.Spec.GetLabels()["app"] != "legacy" {
		t.Fatalf("the entry %v %v", we.Annotations, &we.Spec)
	}
	app.Close() // the workload stops listening
	waitEntry("the VM's entry, unhealthy", func(we *networkingv1.WorkloadEntry) bool {
		return strings.HasPrefix(healthy(we), "False") && strings.Contains(healthy(we), "refused")
	})
}
