package podproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodAddressGivesOnlyABarePortThePodsIP(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{":15012", "10.244.1.7:15012"},
		{"--xds-address=:15010", "--xds-address=10.244.1.7:15010"},
		{"-admin-address=:15014", "-admin-address=10.244.1.7:15014"},
		{"--ca-address=flotilla-ca.istio-system.svc:15013", "--ca-address=flotilla-ca.istio-system.svc:15013"},
		{"--listen=127.0.0.1:80", "--listen=127.0.0.1:80"},
		{"--debounce-quiet=100ms", "--debounce-quiet=100ms"},
		{"--x=:123456", "--x=:123456"},
		{"--revision=:1", "--revision=10.244.1.7:1"},
	} {
		if got := PodAddress(c.arg, "10.244.1.7"); got != c.want {
			t.Errorf("PodAddress(%q) = %q, want %q", c.arg, got, c.want)
		}
	}
	if got := PodAddress(":80", "fd00::7"); got != "[fd00::7]:80" {
		t.Errorf("an IPv6 pod: %q", got)
	}
}

func TestImageRepositoryIsTheBinarysName(t *testing.T) {
	for image, want := range map[string]string{
		"flotilla-galley:1.2.3":                     "flotilla-galley",
		"registry.example:5000/mesh/flotilla-ca:v1": "flotilla-ca",
		"flotilla-injector@sha256:0123":             "flotilla-injector",
		"flotilla-discovery":                        "flotilla-discovery",
		"reg.example/flotilla-agent:v1@sha256:abcd": "flotilla-agent",
	} {
		if got := imageRepository(image); got != want {
			t.Errorf("imageRepository(%q) = %q, want %q", image, got, want)
		}
	}
}

func TestExpandReplacesDefinedVariablesAsTheKubeletDoes(t *testing.T) {
	env := [][2]string{{"POD", "p-1"}, {"NS", "app"}, {"POD", "p-2"}}
	for in, want := range map[string]string{
		"$(POD).$(NS)":   "p-2.app",
		"$(UNDEFINED)":   "$(UNDEFINED)",
		"$$(POD)":        "$(POD)",
		"cost: $5":       "cost: $5",
		"$(NS":           "$(NS",
		"--name=$(POD)x": "--name=p-2x",
	} {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTheDownwardAPIFieldsAndResources(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a/b": "c"}},
		Spec:       corev1.PodSpec{NodeName: "n", ServiceAccountName: "sa"},
		Status:     corev1.PodStatus{PodIP: "10.244.0.2", HostIP: "10.243.0.1"},
	}
	for field, want := range map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "metadata.uid": "u", "spec.nodeName": "n",
		"spec.serviceAccountName": "sa", "status.podIP": "10.244.0.2", "status.hostIP": "10.243.0.1",
		"metadata.labels['app']": "web", "metadata.annotations['a/b']": "c",
	} {
		if got, err := fieldValue(pod, field); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", field, got, err, want)
		}
	}
	if _, err := fieldValue(pod, "status.podIPs"); err == nil || !strings.Contains(err.Error(), "not run here") {
		t.Errorf("an unsupported field: %v", err)
	}

	c := corev1.Container{Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi"), corev1.ResourceCPU: resource.MustParse("1500m")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
	}}
	for _, r := range []struct {
		ref  corev1.ResourceFieldSelector
		want string
	}{
		{corev1.ResourceFieldSelector{Resource: "limits.memory"}, "536870912"},
		{corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}, "512"},
		{corev1.ResourceFieldSelector{Resource: "limits.cpu"}, "2"},
		{corev1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: resource.MustParse("1m")}, "250"},
		{corev1.ResourceFieldSelector{Resource: "requests.cpu"}, "1"},
	} {
		if got, err := resourceValue(c, &r.ref); err != nil || got != r.want {
			t.Errorf("%s / %s = %q, %v; want %q", r.ref.Resource, r.ref.Divisor.String(), got, err, r.want)
		}
	}
	if _, err := resourceValue(c, &corev1.ResourceFieldSelector{Resource: "requests.memory"}); err == nil {
		t.Error("an unset resource gave no error")
	}
}

func TestAnImagesDirectoryThisMachineLacksIsMadeInAnOverlayAndTheHostsMountsStay(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("pod"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join("/etc", "flotilla-podproc-"+strconv.Itoa(os.Getpid()), "proxy")
	script, err := mountScript([]mount{{src, target}}, hostMounts())
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sh", "-ec",
		script+"cat "+shellQuote(target+"/f")+"; echo; cat /etc/hosts").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s\nscript:\n%s", err, out, script)
	}
	if want := "pod\n" + string(hosts); string(out) != want {
		t.Fatalf("inside the pod's namespace:\n%s\nwant the volume's file, then this machine's /etc/hosts:\n%s", out, want)
	}
	if _, err := os.Stat(filepath.Dir(target)); err == nil {
		t.Fatalf("%s was made on this machine", filepath.Dir(target))
	}
	if _, err := mountScript([]mount{{src, "/flotilla-podproc-nowhere/x"}}, nil); err == nil {
		t.Fatal("an overlay on / was planned")
	}
}
