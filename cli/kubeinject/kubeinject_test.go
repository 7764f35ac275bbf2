package kubeinject

import (
	"bytes"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/inject"
)

const input = `apiVersion: apps/v1
kind: Deployment
metadata: {name: cart, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  template:
    metadata: {labels: {app: cart}}
    spec:
      containers: [{name: app, image: "cart:1"}]
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec:
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: debug, annotations: {sidecar.istio.io/inject: "false"}}
spec:
  containers: [{name: sh, image: busybox}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: job, image: "job:1"}]
`

func run(t *testing.T, args []string, stdin string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func docs(s string) []string { return strings.Split(s, "---\n") }

func TestKubeInjectAddsTheSidecarToPodTemplatesOnly(t *testing.T) {
	out, err := run(t, []string{"-f", "-"}, input)
	if err != nil {
		t.Fatal(err)
	}
	d := docs(out)
	if len(d) != 4 {
		t.Fatalf("%d documents out", len(d))
	}
	var dep appsv1.Deployment
	if err := sigsyaml.UnmarshalStrict([]byte(d[0]), &dep); err != nil {
		t.Fatal(err)
	}
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 2 || spec.Containers[1].Name != inject.ProxyContainer || spec.InitContainers[0].Name != inject.InitContainer {
		t.Fatalf("deployment not injected: %+v", spec.Containers)
	}
	if dep.Spec.Template.Annotations[inject.StatusAnnotation] == "" {
		t.Fatal("no status annotation on the template")
	}
	if strings.Contains(d[1], "istio-proxy") || !strings.Contains(d[1], "kind: Service") {
		t.Fatalf("the service changed:\n%s", d[1])
	}
	var pod corev1.Pod
	if err := sigsyaml.UnmarshalStrict([]byte(d[2]), &pod); err != nil || len(pod.Spec.Containers) != 1 {
		t.Fatalf("the opted-out pod was injected: %v", err)
	}
	var cj batchv1.CronJob
	if err := sigsyaml.UnmarshalStrict([]byte(d[3]), &cj); err != nil || len(cj.Spec.JobTemplate.Spec.Template.Spec.Containers) != 2 {
		t.Fatalf("the cron job was not injected: %v", err)
	}
	// Injecting the output again changes nothing.
	again, err := run(t, []string{"-f", "-"}, out)
	if err != nil || again != out {
		t.Fatalf("a second kube-inject changed the output (%v)", err)
	}
}

func TestKubeInjectRefusesWhatItCannotRead(t *testing.T) {
	for name, in := range map[string]string{
		"not YAML":         "kind: [",
		"no kind":          "apiVersion: v1\nmetadata: {name: x}\n",
		"an unknown field": "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containerz: []}\n",
		"a bad annotation": "apiVersion: v1\nkind: Pod\nmetadata: {name: x, annotations: {sidecar.istio.io/proxyCPU: lots}}\nspec: {containers: [{name: a}]}\n",
	} {
		if _, err := run(t, []string{"-f", "-"}, in); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := run(t, []string{"-f", "/no/such/file"}, ""); err == nil {
		t.Error("a missing file was accepted")
	}
}

func TestKubeInjectAddsIstiosProxyV2SidecarWhenTheValuesChooseIt(t *testing.T) {
	values := t.TempDir() + "/values.yaml"
	if err := os.WriteFile(values, []byte("sidecar: proxyv2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, []string{"-f", "-", "--values-file", values}, input)
	if err != nil {
		t.Fatal(err)
	}
	d := docs(out)
	var dep appsv1.Deployment
	if err := sigsyaml.UnmarshalStrict([]byte(d[0]), &dep); err != nil {
		t.Fatal(err)
	}
	spec := dep.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != inject.ProxyV2InitContainer || spec.Containers[1].Image != inject.ProxyV2Image {
		t.Fatalf("not Istio's proxyv2: init %+v, containers %+v", spec.InitContainers, spec.Containers)
	}
	// The workload is the object kube-inject was given, as Istio's
	// kube-inject reports it.
	owner := func(c corev1.Container) string {
		for _, e := range c.Env {
			if e.Name == "ISTIO_META_OWNER" {
				return e.Value
			}
		}
		return ""
	}
	if got := owner(spec.Containers[1]); got != "kubernetes://apis/apps/v1/namespaces/shop/deployments/cart" {
		t.Errorf("the Deployment's ISTIO_META_OWNER %q", got)
	}
	var cj batchv1.CronJob
	if err := sigsyaml.UnmarshalStrict([]byte(d[3]), &cj); err != nil {
		t.Fatal(err)
	}
	if got := owner(cj.Spec.JobTemplate.Spec.Template.Spec.Containers[1]); got != "kubernetes://apis/batch/v1/namespaces/default/cronjobs/nightly" {
		t.Errorf("the CronJob's ISTIO_META_OWNER %q", got)
	}
	again, err := run(t, []string{"-f", "-", "--values-file", values}, out)
	if err != nil || again != out {
		t.Fatalf("a second kube-inject changed the output (%v)", err)
	}
}
