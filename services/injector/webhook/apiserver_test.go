package webhook

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	admregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) { os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{})) }

// serve runs the webhook with an injection configuration on 127.0.0.1
// and registers it for pods in the test's namespaces (those with the test
// label).
func serve(t *testing.T, ctx context.Context, label string, def inject.Config) {
	t.Helper()
	h, err := Handler(Options{
		Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t"),
		Config: func() inject.Config { return def },
		Policy: inject.Policy{SystemNamespace: "istio-system"},
		NamespaceLabels: func(ctx context.Context, ns string) (map[string]string, error) {
			n, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return n.Labels, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	client := kubeenv.ServeWebhook(t, h, Path)
	err = env.RegisterMutating(ctx, "flotilla-injector-"+label, kubeenv.Webhook{
		Name: "injection.flotilla.io", Client: client,
		Rules: []admregv1.RuleWithOperations{{
			Operations: []admregv1.OperationType{admregv1.Create},
			Rule:       admregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"flotilla-test": label}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func namespace(t *testing.T, ctx context.Context, prefix, label string, labels map[string]string) string {
	t.Helper()
	ns, err := env.CreateNamespace(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	n, err := env.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["flotilla-test"] = label
	for k, v := range labels {
		n.Labels[k] = v
	}
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func podIn(ns, name string, mut func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

func containerNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

func TestTheAPIServerInjectsThePodsThePolicySelects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const label = "inject" // one apiserver per test binary: each test registers for its own label
	serve(t, ctx, label, inject.DefaultConfig(controlplane.DefaultRevision))
	enabled := namespace(t, ctx, "inj-on", label, map[string]string{inject.NamespaceLabel: "enabled"})
	plain := namespace(t, ctx, "inj-off", label, nil)

	create := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		// The webhook configuration takes effect through an informer: retry
		// until a pod that must be injected is.
		got, err := env.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s/%s: %v", p.Namespace, p.Name, err)
		}
		return got
	}
	// Wait for the webhook to be live.
	for i := 0; ; i++ {
		probe, err := env.Client.CoreV1().Pods(enabled).Create(ctx, podIn(enabled, "probe", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && slices.Contains(containerNames(probe), inject.ProxyContainer) {
			break
		}
		if i > 200 {
			t.Fatalf("the webhook never took effect: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	injected := create(podIn(enabled, "app", nil))
	if !slices.Equal(containerNames(injected), []string{"app", inject.ProxyContainer}) || injected.Spec.InitContainers[0].Name != inject.InitContainer {
		t.Fatalf("in a labelled namespace: containers %v", containerNames(injected))
	}
	var st inject.Status
	if err := json.Unmarshal([]byte(injected.Annotations[inject.StatusAnnotation]), &st); err != nil || len(st.Volumes) != 5 {
		t.Fatalf("status annotation %q", injected.Annotations[inject.StatusAnnotation])
	}
	hasVolume := func(p *corev1.Pod, name string) bool {
		return slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	}
	if !hasVolume(injected, "istio-token") || !hasVolume(injected, "istio-ca-root-cert") || injected.Labels[inject.TLSModeLabel] != "istio" {
		t.Fatal("volumes or label missing")
	}

	// The application's probes now go to the agent, which gets the
	// originals (Istio's rewriteAppHTTPProbers).
	probed := create(podIn(enabled, "probed", func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")},
		}}
	}))
	if get := probed.Spec.Containers[0].ReadinessProbe.HTTPGet; get == nil || get.Path != "/app-health/app/readyz" || get.Port.IntValue() != 15020 {
		t.Fatalf("the stored pod's readiness probe: %+v", probed.Spec.Containers[0].ReadinessProbe)
	}
	if env := probed.Spec.Containers[1].Env; !slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
		return e.Name == "ISTIO_KUBE_APP_PROBERS" && strings.Contains(e.Value, `"path":"/ready"`) && strings.Contains(e.Value, `"port":8080`)
	}) {
		t.Fatalf("the proxy's environment lacks the original probe: %v", env)
	}

	for name, p := range map[string]*corev1.Pod{
		"unlabelled namespace": podIn(plain, "plain", nil),
		"opted out":            podIn(enabled, "optout", func(p *corev1.Pod) { p.Labels[inject.InjectLabel] = "false" }),
		"host network":         podIn(enabled, "hostnet", func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
	} {
		if got := create(p); len(got.Spec.Containers) != 1 {
			t.Errorf("%s: injected: %v", name, containerNames(got))
		}
	}
	if got := create(podIn(plain, "optin", func(p *corev1.Pod) { p.Labels[inject.InjectLabel] = "true" })); len(got.Spec.Containers) != 2 {
		t.Errorf("opted in in an unlabelled namespace: %v", containerNames(got))
	}
	// A pod that is already injected (as kube-inject writes it) is left
	// alone: injecting twice equals injecting once.
	tmpl, err := inject.ParseTemplate(inject.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	again, err := tmpl.Inject(podIn(enabled, "again", nil), inject.DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	got := create(again)
	if len(got.Spec.Containers) != 2 || len(got.Spec.InitContainers) != 1 {
		t.Fatalf("an injected pod was injected again: %v, %d init", containerNames(got), len(got.Spec.InitContainers))
	}
}

// TestTheAPIServerAcceptsPodsInjectedWithIstiosProxyV2 has the apiserver
// validate and store what the proxyv2 templates add (Istio's sidecar and
// its grpc-agent flavour): every field must be one Kubernetes accepts.
func TestTheAPIServerAcceptsPodsInjectedWithIstiosProxyV2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const label = "proxyv2"
	cfg, err := inject.ParseConfig(controlplane.DefaultRevision, "", "sidecar: proxyv2\n")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ctx, label, cfg)
	ns := namespace(t, ctx, "inj-proxyv2", label, map[string]string{inject.NamespaceLabel: "enabled"})
	for i := 0; ; i++ {
		probe, err := env.Client.CoreV1().Pods(ns).Create(ctx, podIn(ns, "probe", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && slices.Contains(containerNames(probe), inject.ProxyContainer) {
			break
		}
		if i > 200 {
			t.Fatalf("the webhook never took effect: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	got, err := env.Client.CoreV1().Pods(ns).Create(ctx, podIn(ns, "app", func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m:1"}}
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		p.Spec.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/live", Port: intstr.FromString("http")},
		}}
		p.Annotations = map[string]string{inject.AnnotationExcludeInbound: "9090", inject.AnnotationProxyConfig: "holdApplicationUntilProxyStarts: true"}
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the apiserver refused the injected pod: %v", err)
	}
	if !slices.Equal(containerNames(got), []string{inject.ProxyContainer, "app"}) || len(got.Spec.InitContainers) != 2 || got.Spec.InitContainers[1].Name != inject.ProxyV2InitContainer {
		t.Fatalf("containers %v, init containers %+v", containerNames(got), got.Spec.InitContainers)
	}
	if args := strings.Join(got.Spec.InitContainers[1].Args, " "); !strings.Contains(args, "-d 15090,15021,9090,15020") {
		t.Errorf("istio-init args %s", args)
	}
	proxy := got.Spec.Containers[0]
	if proxy.Image != inject.ProxyV2Image || proxy.Lifecycle == nil || proxy.Lifecycle.PostStart == nil {
		t.Errorf("istio-proxy %s, lifecycle %+v", proxy.Image, proxy.Lifecycle)
	}
	if !slices.ContainsFunc(proxy.Env, func(e corev1.EnvVar) bool {
		return e.Name == "ISTIO_KUBE_APP_PROBERS" && strings.Contains(e.Value, `"path":"/live"`) && strings.Contains(e.Value, `"port":8080`)
	}) {
		t.Errorf("istio-proxy's environment lacks the original probe: %v", proxy.Env)
	}
	if get := got.Spec.Containers[1].LivenessProbe.HTTPGet; get.Path != "/app-health/app/livez" || get.Port.IntValue() != 15020 {
		t.Errorf("the stored liveness probe %+v", get)
	}

	proxyless, err := env.Client.CoreV1().Pods(ns).Create(ctx, podIn(ns, "greeter", func(p *corev1.Pod) {
		p.Annotations = map[string]string{inject.AnnotationTemplates: inject.TemplateGRPCAgent}
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the apiserver refused the injected proxyless pod: %v", err)
	}
	if len(proxyless.Spec.InitContainers) != 0 || !slices.Equal(containerNames(proxyless), []string{"app", inject.ProxyContainer}) {
		t.Fatalf("proxyless: containers %v, init %d", containerNames(proxyless), len(proxyless.Spec.InitContainers))
	}
	if !slices.ContainsFunc(proxyless.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "GRPC_XDS_BOOTSTRAP" }) {
		t.Errorf("the application's environment %v", proxyless.Spec.Containers[0].Env)
	}
}
