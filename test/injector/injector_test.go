// Package injector_test runs galley (watching the real apiserver) and
// flotilla-injector as processes, registers the injector as the
// apiserver's mutating webhook, and creates pods: the injector decides
// from the namespace labels galley streams it, watching nothing itself.
package injector_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1beta1 "istio.io/client-go/pkg/apis/networking/v1beta1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	admregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var (
	binDir string
	env    *kubeenv.Env
)

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, &env, "flotilla-galley", "flotilla-injector", "flotilla"))
}

// cluster is where a test's control plane runs.
type cluster struct {
	system     string // the control-plane namespace
	kubeconfig string // a kubeconfig file of the test apiserver
	mcpAddr    string // galley's MCP address
}

// startGalley installs Istio's CRDs, makes a control-plane namespace and
// starts a ready galley process watching the test apiserver.
func startGalley(t *testing.T, ctx context.Context) (*proc.Process, cluster) {
	t.Helper()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	system, err := env.CreateNamespace(ctx, "flotilla-system")
	if err != nil {
		t.Fatal(err)
	}
	c := cluster{system: system, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig"), mcpAddr: proc.FreeAddr(t)}
	if err := env.WriteKubeconfig(c.kubeconfig); err != nil {
		t.Fatal(err)
	}
	admin := proc.FreeAddr(t)
	galley := proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--kubeconfig", c.kubeconfig, "--mcp-address", c.mcpAddr,
		"--admin-address", admin, "--system-namespace", system)
	proc.WaitReady(t, "http://"+admin+"/readyz")
	return galley, c
}

func TestPodsInALabelledNamespaceGetTheSidecarThroughTheInjectorProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	galley, c := startGalley(t, ctx)
	system, mcpAddr := c.system, c.mcpAddr

	ca, err := testpki.NewCA("injector CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "injector", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := leaf.WriteFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hook, injAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	inj := proc.Start(t, "injector", filepath.Join(binDir, "flotilla-injector"), "--galley-address", mcpAddr, "--admin-address", injAdmin,
		"--webhook-address", hook, "--webhook-tls-cert-file", cert, "--webhook-tls-key-file", key, "--system-namespace", system)
	proc.WaitReady(t, "http://"+injAdmin+"/readyz")

	register(t, ctx, "flotilla-injector", hook, system, ca.CertPEM)

	app := labelledNamespace(t, ctx)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cart", Namespace: app},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "cart:1"}}},
	}
	// The label reaches the injector through galley: retry (dry run) until
	// it does.
	var got *corev1.Pod
	xdstest.Eventually(t, "an injected pod", func() bool {
		got, err = env.Client.CoreV1().Pods(app).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(got.Spec.Containers) == 2
	})
	if got.Spec.Containers[1].Name != "istio-proxy" || got.Spec.InitContainers[0].Name != "flotilla-init" ||
		!slices.ContainsFunc(got.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "istio-token" }) {
		t.Fatalf("injected pod: containers %v", got.Spec.Containers)
	}
	inj.Out.WaitFor(t, "msg=injected")

	// kube-inject on a Deployment of the same pod adds the same sidecar.
	deployment := filepath.Join(t.TempDir(), "deployment.yaml")
	if err := os.WriteFile(deployment, []byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: cart, namespace: `+app+`}
spec:
  selector: {matchLabels: {app: cart}}
  template:
    metadata: {labels: {app: cart}}
    spec:
      containers: [{name: app, image: "cart:1"}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "flotilla"), "kube-inject", "-f", deployment).Output()
	if err != nil {
		t.Fatalf("kube-inject: %v", err)
	}
	var dep appsv1.Deployment
	if err := sigsyaml.UnmarshalStrict(out, &dep); err != nil {
		t.Fatal(err)
	}
	offline := dep.Spec.Template.Spec
	summary := func(cs []corev1.Container) []string {
		var s []string
		for _, c := range cs {
			s = append(s, fmt.Sprint(c.Name, c.Image, c.Args, len(c.Env), len(c.VolumeMounts)))
		}
		return s
	}
	hooked := got.DeepCopy()
	// The apiserver adds its own service account token mount; compare
	// what injection added.
	for i := range hooked.Spec.Containers {
		hooked.Spec.Containers[i].VolumeMounts = slices.DeleteFunc(hooked.Spec.Containers[i].VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(m.Name, "kube-api-access") })
	}
	for i := range hooked.Spec.InitContainers {
		hooked.Spec.InitContainers[i].VolumeMounts = slices.DeleteFunc(hooked.Spec.InitContainers[i].VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(m.Name, "kube-api-access") })
	}
	if a, b := summary(offline.Containers), summary(hooked.Spec.Containers); !slices.Equal(a, b) {
		t.Fatalf("kube-inject containers %v, webhook %v", a, b)
	}
	if a, b := summary(offline.InitContainers), summary(hooked.Spec.InitContainers); !slices.Equal(a, b) {
		t.Fatalf("kube-inject init containers %v, webhook %v", a, b)
	}
	if dep.Spec.Template.Annotations["sidecar.istio.io/status"] != got.Annotations["sidecar.istio.io/status"] {
		t.Fatal("kube-inject and the webhook record different status annotations")
	}

	// The injection ConfigMap reaches the injector through galley: its
	// values take effect, a broken edit changes nothing, deleting it
	// brings back the built-in configuration.
	proxyImage := func() string {
		p, err := env.Client.CoreV1().Pods(app).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || len(p.Spec.Containers) != 2 {
			return fmt.Sprint("not injected: ", err)
		}
		return p.Spec.Containers[1].Image
	}
	cms := env.Client.CoreV1().ConfigMaps(system)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-sidecar-injector"},
		Data:       map[string]string{"values": "proxyImage: registry.example/flotilla-agent:9\n"},
	}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the ConfigMap's proxy image", func() bool { return proxyImage() == "registry.example/flotilla-agent:9" })
	cm.Data["template"] = "containers: [{{ .Values.Nope"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	galley.Out.WaitFor(t, "invalid configuration; keeping the last valid one")
	if got := proxyImage(); got != "registry.example/flotilla-agent:9" {
		t.Fatalf("after a broken edit the proxy image is %s", got)
	}
	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the built-in proxy image", func() bool { return proxyImage() == "flotilla-proxy:latest" })
	if inj.Out.Count("refusing galley's injection configuration") > 0 {
		t.Fatal("galley passed on a broken injection ConfigMap")
	}

	// A ProxyConfig of the pod's namespace, through galley: the sidecar
	// gets its concurrency (in PROXY_CONFIG) and its environment.
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pcObj := &networkingv1beta1.ProxyConfig{ObjectMeta: metav1.ObjectMeta{Name: "cart"}}
	pcObj.Spec.Concurrency = wrapperspb.Int32(3)
	pcObj.Spec.EnvironmentVariables = map[string]string{"ISTIO_META_FROM_PROXYCONFIG": "yes"}
	if _, err := ic.NetworkingV1beta1().ProxyConfigs(app).Create(ctx, pcObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the ProxyConfig in the injected sidecar", func() bool {
		got, err := env.Client.CoreV1().Pods(app).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil || len(got.Spec.Containers) != 2 {
			return false
		}
		env := map[string]string{}
		for _, e := range got.Spec.Containers[1].Env {
			env[e.Name] = e.Value
		}
		return env["ISTIO_META_FROM_PROXYCONFIG"] == "yes" && strings.Contains(env["PROXY_CONFIG"], `"concurrency":3`)
	})

	if err := inj.Stop(t, 20*time.Second); err != nil {
		t.Fatalf("injector after SIGTERM: %v", err)
	}
}

// register installs the injector as the apiserver's mutating webhook for
// pods outside the control plane.
func register(t *testing.T, ctx context.Context, name, hook, system string, caBundle []byte) {
	t.Helper()
	url := "https://" + hook + "/inject"
	fail := admregv1.Fail
	none := admregv1.SideEffectClassNone
	timeout := int32(10)
	if _, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admregv1.MutatingWebhook{{
			Name:         "injection.flotilla.io",
			ClientConfig: admregv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			Rules: []admregv1.RuleWithOperations{{
				Operations: []admregv1.OperationType{admregv1.Create},
				Rule:       admregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout,
			// The control plane's own pods never go through it.
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{system, "kube-system"},
			}}},
			AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Other tests share the apiserver: a webhook left behind would fail
	// their pods once its process is gone.
	t.Cleanup(func() {
		if err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting webhook %s: %v", name, err)
		}
	})
}

// labelledNamespace creates a namespace with istio-injection=enabled.
func labelledNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	app, err := env.CreateNamespace(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	n, err := env.Client.CoreV1().Namespaces().Get(ctx, app, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["istio-injection"] = "enabled"
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return app
}

// TestTheCABundleControllerMakesTheDevelopmentCertificateTrusted: an
// injector with no certificate files serves a self-signed one, and its
// caBundle controller puts it into the webhook configuration, after which
// the apiserver calls it.
func TestTheCABundleControllerMakesTheDevelopmentCertificateTrusted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	_, c := startGalley(t, ctx)
	system, kubeconfig, mcpAddr := c.system, c.kubeconfig, c.mcpAddr
	hook, injAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	register(t, ctx, "dev-injector", hook, system, nil) // no caBundle yet
	proc.Start(t, "injector", filepath.Join(binDir, "flotilla-injector"), "--galley-address", mcpAddr, "--admin-address", injAdmin,
		"--webhook-address", hook, "--system-namespace", system, "--kubeconfig", kubeconfig, "--webhook-config", "dev-injector")
	proc.WaitReady(t, "http://"+injAdmin+"/readyz")
	app := labelledNamespace(t, ctx)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cart", Namespace: app}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "cart:1"}}}}
	var last error
	defer func() {
		if t.Failed() {
			t.Logf("last error: %v", last)
		}
	}()
	xdstest.Eventually(t, "an injected pod through the development certificate", func() bool {
		got, err := env.Client.CoreV1().Pods(app).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		last = err
		return err == nil && len(got.Spec.Containers) == 2
	})
}
