package inject

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestThePodsOwnIstioProxyContainerCustomisesTheInjectedOneAsInIstio(t *testing.T) {
	own := corev1.Container{
		Name: ProxyContainer, Image: AutoImage,
		Env:       []corev1.EnvVar{{Name: "EXTRA", Value: "1"}, {Name: "TRUST_DOMAIN", Value: "example.org"}},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}},
	}
	out, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, own) }), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var proxies []corev1.Container
	for _, c := range out.Spec.Containers {
		if c.Name == ProxyContainer {
			proxies = append(proxies, c)
		}
	}
	if len(proxies) != 1 {
		t.Fatalf("%d istio-proxy containers, want the injected one customised", len(proxies))
	}
	p := proxies[0]
	if p.Image != DefaultValues().ProxyImage {
		t.Errorf("image %q: auto keeps the injected image", p.Image)
	}
	if p.Resources.Limits.Memory().String() != "2Gi" || p.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("resources %v: want the pod's memory limit over the injected resources", p.Resources)
	}
	env := map[string]string{}
	for _, e := range p.Env {
		env[e.Name] = e.Value
	}
	if _, ok := env["POD_NAMESPACE"]; !ok || env["EXTRA"] != "1" || env["TRUST_DOMAIN"] != "example.org" {
		t.Errorf("env %v: want the injected variables with the pod's laid over them by name", env)
	}
	var rec overridesRecord
	if err := json.Unmarshal([]byte(out.Annotations[AnnotationOverrides]), &rec); err != nil || len(rec.Containers) != 1 || rec.Containers[0].Image != AutoImage {
		t.Errorf("%s = %q: want the pod's own container recorded", AnnotationOverrides, out.Annotations[AnnotationOverrides])
	}
}
