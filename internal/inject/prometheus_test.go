package inject

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

func proxyEnv(p *corev1.Pod, name string) (string, bool) {
	for _, c := range p.Spec.Containers {
		if c.Name != ProxyContainer {
			continue
		}
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value, true
			}
		}
	}
	return "", false
}

func TestTheApplicationsMetricsAreScrapedThroughTheAgentAsInIstio(t *testing.T) {
	out, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{"prometheus.io.port": "8080", "prometheus.io/path": "/metrics", "prometheus.io/scrape": "true"}
	}), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"prometheus.io/port": "15020", "prometheus.io/path": "/stats/prometheus", "prometheus.io/scrape": "true"}
	for k, v := range want {
		if out.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, out.Annotations[k], v)
		}
	}
	if _, ok := out.Annotations["prometheus.io.port"]; ok {
		t.Error("the application's spelling of the port annotation is left: Prometheus would pick either")
	}
	js, ok := proxyEnv(out, proxycontract.PrometheusScrapeEnv)
	var got proxycontract.PrometheusScrape
	if !ok || json.Unmarshal([]byte(js), &got) != nil || got != (proxycontract.PrometheusScrape{Scrape: "true", Path: "/metrics", Port: "8080"}) {
		t.Errorf("%s = %q, want the application's settings", proxycontract.PrometheusScrapeEnv, js)
	}
	// Injected again: left as it is.
	again := out.DeepCopy()
	if err := mergePrometheus(again); err != nil || !maps.Equal(again.Annotations, out.Annotations) {
		t.Errorf("merging twice changed the pod: %v", err)
	}
}

func TestMetricsMergingIsLeftOffWhereThePodSaysSo(t *testing.T) {
	for name, a := range map[string]map[string]string{
		"scrape false":        {"prometheus.io/scrape": "false", "prometheus.io/port": "8080"},
		"merge-metrics false": {AnnotationMergeMetrics: "false", "prometheus.io/port": "8080"},
	} {
		out, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Annotations = maps.Clone(a) }), DefaultValues())
		if err != nil {
			t.Fatal(err)
		}
		if out.Annotations["prometheus.io/port"] != "8080" {
			t.Errorf("%s: port annotation %q, want the application's", name, out.Annotations["prometheus.io/port"])
		}
		if _, ok := proxyEnv(out, proxycontract.PrometheusScrapeEnv); ok {
			t.Errorf("%s: the agent is given scrape settings", name)
		}
	}
	for want, a := range map[string]map[string]string{
		"the sidecar's own":  {"prometheus.io/port": "15090"},
		"want a port":        {"prometheus.io/port": "http"},
		"want true or false": {AnnotationMergeMetrics: "maybe"},
	} {
		if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Annotations = a }), DefaultValues()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want an error saying %q", a, err, want)
		}
	}
}
