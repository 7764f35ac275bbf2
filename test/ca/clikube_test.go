package ca_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	// analyze --live reaches galley the same way.
	live := func() (int, string) { t.Helper(); return run("analyze", "--live") }
	if code, out := live(); code != 1 || !strings.Contains(out, "no ready pod behind Service "+ns+"/flotilla-galley") {
		t.Fatalf("analyze --live without galley: %d %s", code, out)
	}
	slice("flotilla-galley", map[string]bool{"flotilla-galley-0": true})
	if code, out := live(); code != 1 || !strings.Contains(out, "port-forward to "+ns+"/flotilla-galley-0:15019") {
		t.Fatalf("analyze --live with galley's EndpointSlice: %d %s", code, out)
	}
}
