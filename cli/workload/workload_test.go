package workload

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

const group = `apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata:
  name: legacy
  namespace: vm
  annotations:
    proxy.istio.io/config: '{"proxyMetadata": {"FROM_GROUP": "yes"}, "concurrency": 2}'
spec:
  metadata:
    labels: {app: legacy, version: v3}
  template:
    serviceAccount: legacy
    network: vm-net
    ports: {http: 8080, grpc: 9090}
  probe:
    periodSeconds: 5
    httpGet: {path: /ready, port: 8080}
`

// cluster is what the control plane keeps in the cluster that the files
// are made of: the mesh configuration and the injection values in
// istio-system, the roots and the group's service account in ns.
func cluster(t *testing.T, client kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := context.Background()
	system, err := env.CreateNamespace(ctx, "flotilla-system")
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "istio", Namespace: system}, Data: map[string]string{"mesh": `trustDomain: example.org
defaultConfig:
  discoveryAddress: flotilla-discovery.` + system + `.svc:15012
  meshId: mesh1
  proxyMetadata: {FROM_MESH: "yes"}
`}},
		{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-sidecar-injector", Namespace: system}, Data: map[string]string{"values": `clusterID: east
discoveryAddress: flotilla-discovery.` + system + `.svc:15012
caAddress: flotilla-ca.` + system + `.svc:15013
trustDomain: example.org
`}},
		{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert", Namespace: ns}, Data: map[string]string{"root-cert.pem": "-----BEGIN CERTIFICATE-----\nroots\n-----END CERTIFICATE-----\n"}},
	} {
		if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.CreateServiceAccount(ctx, ns, "legacy"); err != nil {
		t.Fatal(err)
	}
	return system
}

// readEnv parses cluster.env as a shell would read its quoted values.
func readEnv(t *testing.T, data []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("cluster.env line %q", line)
		}
		if strings.HasPrefix(v, "'") {
			v = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'"), `'"'"'`, "'")
		}
		out[k] = v
	}
	return out
}

func TestConfigureWritesIstiosVMFilesForAGroupInTheCluster(t *testing.T) {
	ctx := context.Background()
	client, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "vm")
	if err != nil {
		t.Fatal(err)
	}
	system := cluster(t, client, ns)
	// The group from the cluster, as --name and --namespace read it.
	js, err := sigsyaml.YAMLToJSON([]byte(strings.Replace(group, "namespace: vm", "namespace: "+ns, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Discovery().RESTClient().Post().AbsPath("/apis/networking.istio.io/v1/namespaces", ns, "workloadgroups").
		SetHeader("Content-Type", "application/json").Body(js).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var warn bytes.Buffer
	err = Configure(ctx, client, system, Options{
		Name: "legacy", Namespace: ns, Output: out, TokenDuration: 600,
		IngressService: "istio-eastwestgateway", IngressIP: "203.0.113.7", AutoRegister: true, CaptureDNS: true,
	}, &warn)
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	ce := readEnv(t, read(ClusterEnv))
	labels := map[string]string{}
	if err := json.Unmarshal([]byte(ce["ISTIO_METAJSON_LABELS"]), &labels); err != nil {
		t.Fatalf("ISTIO_METAJSON_LABELS %q: %v", ce["ISTIO_METAJSON_LABELS"], err)
	}
	for k, want := range map[string]string{
		"ISTIO_INBOUND_PORTS": "8080,9090", "ISTIO_LOCAL_EXCLUDE_PORTS": "22,15090,15021,15020", "ISTIO_SERVICE_CIDR": "*",
		"ISTIO_NAMESPACE": ns, "ISTIO_SERVICE": "legacy." + ns, "SERVICE_ACCOUNT": "legacy", "POD_NAMESPACE": ns, "TRUST_DOMAIN": "example.org",
		"CANONICAL_SERVICE": "legacy", "CANONICAL_REVISION": "v3", "ISTIO_META_CLUSTER_ID": "east", "CLUSTER_ID": "east",
		"ISTIO_META_MESH_ID": "mesh1", "ISTIO_META_NETWORK": "vm-net", "ISTIO_META_WORKLOAD_NAME": "legacy",
		"ISTIO_META_POD_PORTS":           `[{"name":"grpc","containerPort":9090},{"name":"http","containerPort":8080}]`,
		"ISTIO_META_AUTO_REGISTER_GROUP": "legacy", "ISTIO_META_DNS_CAPTURE": "true", "FROM_MESH": "yes", "FROM_GROUP": "yes",
		"DISCOVERY_ADDRESS": "flotilla-discovery." + system + ".svc:15012", "CA_ADDRESS": "flotilla-ca." + system + ".svc:15013",
	} {
		if ce[k] != want {
			t.Errorf("cluster.env %s=%q, want %q", k, ce[k], want)
		}
	}
	if labels["app"] != "legacy" || labels["version"] != "v3" || labels["service.istio.io/canonical-name"] != "legacy" {
		t.Errorf("labels %v", labels)
	}

	mesh, err := istio.ParseMeshConfig(read(MeshYAML))
	if err != nil {
		t.Fatalf("mesh.yaml does not read as a mesh configuration: %v", err)
	}
	pc := mesh.GetDefaultConfig()
	if pc.GetDiscoveryAddress() != ce["DISCOVERY_ADDRESS"] || pc.GetConcurrency().GetValue() != 2 || pc.GetMeshId() != "mesh1" ||
		pc.GetReadinessProbe().GetHttpGet().GetPath() != "/ready" || pc.GetReadinessProbe().GetPeriodSeconds() != 5 ||
		pc.GetProxyMetadata()["ISTIO_META_AUTO_REGISTER_GROUP"] != "legacy" {
		t.Errorf("mesh.yaml's defaultConfig: %v", pc)
	}

	if got := string(read(Hosts)); got != "203.0.113.7 flotilla-discovery."+system+".svc flotilla-ca."+system+".svc\n" {
		t.Errorf("hosts %q", got)
	}
	if !bytes.Contains(read(RootCert), []byte("roots")) {
		t.Errorf("root-cert.pem %q", read(RootCert))
	}
	// The token's claims (the apiserver signed it; ca checks that).
	parts := strings.Split(string(read(Token)), ".")
	var claims struct {
		Aud []string `json:"aud"`
		Sub string   `json:"sub"`
	}
	if len(parts) != 3 {
		t.Fatalf("istio-token is no JWT: %q", read(Token))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(payload, &claims) != nil {
		t.Fatalf("istio-token's claims %q: %v", payload, err)
	}
	if len(claims.Aud) != 1 || claims.Aud[0] != "istio-ca" || claims.Sub != "system:serviceaccount:"+ns+":legacy" {
		t.Errorf("the token is for %v, %q; want istio-ca, the group's service account", claims.Aud, claims.Sub)
	}
	if !strings.Contains(warn.String(), "a token of service account "+ns+"/legacy") {
		t.Errorf("no warning of the token: %q", warn.String())
	}
}

func TestConfigureRefusesWhatCannotMakeTheFiles(t *testing.T) {
	ctx := context.Background()
	client, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "vm-refused")
	if err != nil {
		t.Fatal(err)
	}
	system := cluster(t, client, ns)
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"a group that does not validate", Options{File: write("bad.yaml", strings.Replace(group, "port: 8080}", "port: 0}", 1))}, "port"},
		{"no group in the file", Options{File: write("none.yaml", "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: x}\nspec: {address: 10.0.0.1}\n")}, "want one WorkloadGroup, found 0"},
		{"not Istio YAML", Options{File: write("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")}, "unsupported kind"},
		{"an oversized file", Options{File: write("big.yaml", group+strings.Repeat("#", maxGroupBytes))}, "more than"},
		{"a group not in the cluster", Options{Name: "missing", Namespace: ns}, "missing"},
		{"a service account that does not exist", Options{File: write("sa.yaml", strings.Replace(group, "serviceAccount: legacy", "serviceAccount: ghost", 1))}, "ghost"},
		{"a revision without injection values", Options{File: write("ok.yaml", group), Revision: "canary"}, "flotilla-sidecar-injector-canary"},
	} {
		c.o.Output, c.o.TokenDuration = filepath.Join(dir, "out-"+strings.ReplaceAll(c.name, " ", "-")), 600
		if c.o.File != "" {
			c.o.Namespace = ns
		}
		err := Configure(ctx, client, system, c.o, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if _, err := os.Stat(c.o.Output); err == nil {
			t.Errorf("%s: the output directory was written", c.name)
		}
	}
	if _, err := Files(Inputs{Group: &istio.Object{Kind: istio.Kinds()[0]}, InternalIP: "10.0.0.1", ExternalIP: "1.2.3.4"}); err == nil {
		t.Error("a Files call with the wrong kind was accepted")
	}
}
