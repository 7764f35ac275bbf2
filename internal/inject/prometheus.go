package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Prometheus metrics merging, as Istio's injector does it
// (applyPrometheusMerge): a pod Prometheus scrapes by its prometheus.io
// annotations is scraped at the agent instead, which serves the
// application's metrics after Envoy's and its own, so that scraping
// works whatever the mesh's mTLS mode; the application's own scrape
// settings go to the agent in proxycontract.PrometheusScrapeEnv.
const (
	// AnnotationMergeMetrics turns it off for a pod ("false").
	AnnotationMergeMetrics = "prometheus.istio.io/merge-metrics"
)

// prometheusKey is the prometheus.io annotation a key names, in any of
// the spellings Prometheus' label sanitising folds together
// (prometheus.io/port, prometheus.io.port, prometheus_io_port), as
// Istio's strutil.SanitizeLabelName matches them; "" for others.
func prometheusKey(k string) string {
	b := []byte(k)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	switch string(b) {
	case "prometheus_io_scrape":
		return "scrape"
	case "prometheus_io_port":
		return "port"
	case "prometheus_io_path":
		return "path"
	}
	return ""
}

// reservedPorts are the sidecar's own ports, which the application's
// metrics cannot be on (Istio's istioReservedPorts).
var reservedPorts = []string{"15000", "15001", "15004", "15006", "15008", "15020", "15021", "15053", "15090"}

// mergePrometheus points the pod's prometheus.io annotations at the
// agent's merged /stats/prometheus and gives the application's settings
// to the proxy container, unless the pod says scrape "false" or turns
// merging off, or the port already is the agent's (injected again).
func mergePrometheus(pod *corev1.Pod) error {
	if v, ok := pod.Annotations[AnnotationMergeMetrics]; ok {
		merge, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%s %q: want true or false", AnnotationMergeMetrics, v)
		}
		if !merge {
			return nil
		}
	}
	proxy := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer })
	if proxy < 0 {
		return nil
	}
	agentPort := strconv.Itoa(appprobe.AgentPort)
	var scrape proxycontract.PrometheusScrape
	var keys []string
	for k, v := range pod.Annotations {
		switch prometheusKey(k) {
		case "scrape":
			scrape.Scrape = v
		case "port":
			scrape.Port = v
		case "path":
			scrape.Path = v
		default:
			continue
		}
		keys = append(keys, k)
	}
	if b, err := strconv.ParseBool(scrape.Scrape); err == nil && !b {
		return nil
	}
	if scrape.Port == agentPort {
		return nil
	}
	if scrape.Port != "" {
		n, err := strconv.Atoi(scrape.Port)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("prometheus.io/port %q: want a port", scrape.Port)
		}
		if slices.Contains(reservedPorts, strconv.Itoa(n)) {
			return fmt.Errorf("prometheus.io/port %s is the sidecar's own: the application's metrics cannot be scraped there", scrape.Port)
		}
	}
	if scrape != (proxycontract.PrometheusScrape{}) {
		js, err := json.Marshal(scrape)
		if err != nil {
			return err
		}
		c := &pod.Spec.Containers[proxy]
		c.Env = append(slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == proxycontract.PrometheusScrapeEnv }), corev1.EnvVar{Name: proxycontract.PrometheusScrapeEnv, Value: string(js)})
	}
	for _, k := range keys {
		delete(pod.Annotations, k)
	}
	pod.Annotations["prometheus.io/port"] = agentPort
	pod.Annotations["prometheus.io/path"] = "/stats/prometheus"
	pod.Annotations["prometheus.io/scrape"] = "true"
	return nil
}
