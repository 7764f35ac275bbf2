package ca_test

import (
	"context"
	"errors"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestTheCLIFindsTheReplicasInAClusterThroughTheirEndpointSlices runs
// flotilla proxy-status --kubeconfig against the real apiserver: the
// replicas are the ready pods behind flotilla-discovery's EndpointSlices,
// ca one behind flotilla-ca's, the roots the istio-ca-root-cert
// ConfigMap, and the token the apiserver's TokenRequest. The last step,
// the apiserver's port-forward, needs a kubelet, which this machine has
// not: the test shows the CLI gets as far as asking the apiserver to
// forward to the first ready replica, and reports the apiserver's answer.
func TestTheCLIFindsTheReplicasInAClusterThroughTheirEndpointSlices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := env.CreateNamespace(ctx, "flotilla-system")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "flotilla"), append(args, "--kubeconfig", kubeconfig, "--istio-namespace", ns, "--timeout", "20s")...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // the command's own exit
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	cli := func() (int, string) { t.Helper(); return run("proxy-status") }
	if code, out := cli(); code != 1 || !strings.Contains(out, "no ready pod behind Service "+ns+"/flotilla-discovery") {
		t.Fatalf("with nothing installed: %d %s", code, out)
	}
	slice := func(service string, pods map[string]bool) {
		t.Helper()
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{GenerateName: service + "-", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		i := 0
		for pod, ready := range pods {
			i++
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{"10.0.0." + string(rune('0'+i))},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
			})
		}
		if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// flotilla-discovery-0 is not ready: the first replica asked is -1.
	slice("flotilla-discovery", map[string]bool{"flotilla-discovery-0": false, "flotilla-discovery-1": true, "flotilla-discovery-2": true})
	if code, out := cli(); code != 1 || !strings.Contains(out, "no ready pod behind Service "+ns+"/flotilla-ca") {
		t.Fatalf("without ca: %d %s", code, out)
	}
	slice("flotilla-ca", map[string]bool{"flotilla-ca-0": true})
	if code, out := cli(); code != 1 || !strings.Contains(out, "ConfigMap "+ns+"/istio-ca-root-cert") {
		t.Fatalf("without the roots: %d %s", code, out)
	}
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"}, Data: map[string]string{"root-cert.pem": string(env.CA.CertPEM)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, out := cli()
	if code != 1 || !strings.Contains(out, "port-forward to "+ns+"/flotilla-discovery-1:15012") {
		t.Fatalf("with everything the apiserver holds: %d %s", code, out)
	}
	t.Logf("as far as an apiserver without kubelets goes: %s", strings.TrimSpace(out))
	// A canary revision's replicas (flotilla-discovery-canary's Service)
	// are asked too: its pod, first by name, is the first forwarded to.
	// Another Service's pods are not.
	slice("flotilla-discovery-canary", map[string]bool{"discovery-canary-0": true})
	slice("flotilla-discoveryx", map[string]bool{"a-lookalike-0": true})
	if code, out := cli(); code != 1 || !strings.Contains(out, "port-forward to "+ns+"/discovery-canary-0:15012") {
		t.Fatalf("with a canary revision: %d %s", code, out)
	}

	// analyze --live reaches galley the same way.
	live := func() (int, string) { t.Helper(); return run("analyze", "--live") }
	if code, out := live(); code != 1 || !strings.Contains(out, "no ready pod behind Service "+ns+"/flotilla-galley") {
		t.Fatalf("analyze --live without galley: %d %s", code, out)
	}
	slice("flotilla-galley", map[string]bool{"flotilla-galley-0": true})
	if code, out := live(); code != 1 || !strings.Contains(out, "port-forward to "+ns+"/flotilla-galley-0:15019") {
		t.Fatalf("analyze --live with galley's EndpointSlice: %d %s", code, out)
	}

	// bug-report in the cluster: each step it can take is in the archive
	// (the control plane's pods' logs: the apiserver answers an
	// unscheduled pod's as empty), each it cannot (the port-forwards,
	// which need a kubelet) is named in errors.txt, and the archive is
	// written.
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-galley-0", Labels: map[string]string{"app.kubernetes.io/part-of": "flotilla"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "galley", Image: "flotilla-galley"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "report.tar.gz")
	if code, out := run("bug-report", "-o", archive); code != 0 || !strings.Contains(out, "steps failed (errors.txt says why)") {
		t.Fatalf("bug-report in a cluster without kubelets: %d %s", code, out)
	}
	files := proc.ReadArchive(t, archive)
	errs := files["bug-report/errors.txt"]
	for _, want := range []string{"discovery: port-forward to " + ns + "/", "galley's configuration: port-forward to " + ns + "/flotilla-galley-0:15019"} {
		if !strings.Contains(errs, want) {
			t.Errorf("bug-report's errors.txt lacks %q:\n%s\n(files: %v)", want, errs, slices.Sorted(maps.Keys(files)))
		}
	}
	if _, ok := files["bug-report/logs/flotilla-galley-0/galley.log"]; !ok {
		t.Errorf("bug-report has no log of flotilla-galley-0's galley container: %v", slices.Sorted(maps.Keys(files)))
	}
	if !strings.HasPrefix(files["bug-report/version.txt"], "client version: ") {
		t.Errorf("bug-report's version.txt:\n%s", files["bug-report/version.txt"])
	}
}

// TestCheckInAClusterJudgesTheDeploymentsCRDsAndWebhookCABundles runs
// flotilla check --kubeconfig against the real apiserver holding a
// Flotilla install's objects but no running pods (no kubelet here): the
// Deployment that never became ready fails, the Istio CRDs pass, the
// webhook whose caBundle holds the mesh's root (the istio-ca-root-cert
// ConfigMap's) passes and the one whose caBundle holds another root
// fails, each with its fix; a configuration calling another namespace's
// Service is another install's and not judged.
func TestCheckInAClusterJudgesTheDeploymentsCRDsAndWebhookCABundles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := env.CreateNamespace(ctx, "flotilla-check")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"}, Data: map[string]string{"root-cert.pem": string(env.CA.CertPEM)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("not the mesh's root")
	if err != nil {
		t.Fatal(err)
	}
	chart := map[string]string{"app.kubernetes.io/part-of": "flotilla"}
	none, never := admregv1.SideEffectClassNone, &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}}
	hook := func(service, namespace string, bundle []byte) admregv1.WebhookClientConfig {
		return admregv1.WebhookClientConfig{Service: &admregv1.ServiceReference{Name: service, Namespace: namespace}, CABundle: bundle}
	}
	if _, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-sidecar-injector-" + ns, Labels: chart},
		Webhooks: []admregv1.MutatingWebhook{{
			Name: "namespace.injection.flotilla.io", ClientConfig: hook("flotilla-injector", ns, env.CA.CertPEM),
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, ObjectSelector: never,
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]admregv1.WebhookClientConfig{
		"flotilla-validator-" + ns:                       hook("flotilla-galley", ns, other.CertPEM),
		"flotilla-validator-elsewhere-" + ns[len(ns)-5:]: hook("flotilla-galley", "elsewhere", other.CertPEM),
	} {
		if _, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admregv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: chart},
			Webhooks: []admregv1.ValidatingWebhook{{
				Name: "validation.flotilla.io", ClientConfig: h, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, ObjectSelector: never,
			}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	one := int32(1)
	labels := map[string]string{"app.kubernetes.io/part-of": "flotilla", "app.kubernetes.io/name": "flotilla-galley"}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-galley", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "galley", Image: "flotilla-galley:test"}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "flotilla"), "check", "--kubeconfig", kubeconfig, "--istio-namespace", ns, "--timeout", "20s").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("check: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{
		"× Deployment flotilla-galley: 0 of 1 replicas ready, 0 updated\n    fix: kubectl -n " + ns + " describe deployment flotilla-galley",
		"√ the Istio CRDs serve every kind Flotilla reads",
		"√ MutatingWebhookConfiguration flotilla-sidecar-injector-" + ns + ", webhook namespace.injection.flotilla.io: its caBundle holds the mesh's roots",
		"× ValidatingWebhookConfiguration flotilla-validator-" + ns + ", webhook validation.flotilla.io: its caBundle lacks the mesh's root",
		"    fix: flotilla-galley writes the caBundle",
		"× galley does not answer", // no kubelet: no port-forward
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "flotilla-validator-elsewhere") {
		t.Errorf("judged another install's webhook:\n%s", out)
	}
}
