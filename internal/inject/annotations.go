package inject

import (
	"fmt"
	"slices"
	"strings"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
)

// The annotations Istio 1.32 reads on a pod (or its namespace), as its API
// lists them (istio.io/api's annotation package), and what Flotilla does
// with each: honoured, or not (and then the injector says so on every pod
// it injects that carries one). docs/annotations.md is the table
// (AnnotationsMarkdown; a test keeps them in step).

// AnnotationSupport is what Flotilla does with one Istio annotation.
type AnnotationSupport struct {
	Name string
	// Honoured: the injector or the agent acts on it as Istio does.
	Honoured bool
	// How says how (honoured), or why not and what happens instead.
	How string
}

// honoured are the annotations Flotilla acts on, and how.
var honoured = map[string]string{
	AnnotationProxyImage:            "the sidecar's image",
	AnnotationProxyCPU:              "the sidecar's CPU request",
	AnnotationProxyMemory:           "the sidecar's memory request",
	AnnotationProxyCPULimit:         "the sidecar's CPU limit",
	AnnotationProxyMemoryLimit:      "the sidecar's memory limit",
	AnnotationLogLevel:              "Envoy's log level",
	AnnotationComponentLogLevel:     "Envoy's component log levels",
	AnnotationAgentLogLevel:         "the agent's log levels",
	AnnotationIncludeOutbound:       "the capture rules (outbound address ranges captured)",
	AnnotationExcludeOutbound:       "the capture rules (outbound address ranges not captured)",
	AnnotationExcludeInbound:        "the capture rules (inbound ports not captured)",
	AnnotationExcludeOutboundPt:     "the capture rules (outbound ports not captured)",
	AnnotationIncludeInbound:        "the capture rules (inbound ports captured: * all, empty none)",
	AnnotationIncludeOutboundPt:     "the capture rules (outbound ports captured whatever the address)",
	AnnotationExcludeIfaces:         "the capture rules (interfaces never captured)",
	AnnotationKubevirtIfaces:        "the capture rules (interfaces whose traffic is captured outbound; istio.io/reroute-virtual-interfaces wins)",
	AnnotationRerouteIfaces:         "the capture rules (interfaces whose traffic is captured outbound)",
	AnnotationProxyConfig:           "partly: merged with the ProxyConfig resources as Istio's EffectiveProxyConfig; the injector applies holdApplicationUntilProxyStarts, proxyMetadata (the sidecar's environment) and the image type, the agent concurrency, drainDuration, terminationDrainDuration, fileFlushInterval, fileFlushMinSizeKb, statusPort, proxyAdminPort, tracing (zipkin), extraStatTags, proxyStatsMatcher, runtimeValues, envoyMetricsService and envoyAccessLogService (TLS DISABLE or ISTIO_MUTUAL), statsCompression, discovery a gateway's gatewayTopology, the proxyHeaders (but xForwardedHost, metadataExchangeHeaders and preserveHttp1HeaderCase) and the mesh's enableEnvoyAccessLogService; the agent logs every other field it is given as having no effect (caCertificatesPem, privateKeyProvider, readinessProbe, interceptionMode other than REDIRECT, connectionSettings and the deprecated fields); Istio's own agent in a proxyv2 sidecar reads them all itself",
	AnnotationRewriteProbes:         "the application's HTTP, TCP and gRPC probes answered by the agent",
	AnnotationTemplates:             "the injection template",
	AnnotationProxyImageType:        "the image type (default, debug, distroless) of Istio's proxyv2 image; Flotilla's own image comes in one type",
	InjectLabel:                     "deprecated as an annotation: the label selects pods; an annotation of false still opts a pod out",
	StatusAnnotation:                "written by the injector: a pod carrying it is not injected again",
	RevisionLabel:                   "the revision: as in Istio, the istio.io/rev label selects the injector; the annotation records it",
	AnnotationDiscoveryAddress:      "the discovery address the agent dials (host:port)",
	AnnotationMergeMetrics:          "metrics merging: the pod's prometheus.io annotations point at the agent's :15020/stats/prometheus, which serves the application's metrics after Envoy's and its own (false: left as they are); the mesh's enablePrometheusMerge is not read (on)",
	AnnotationOverrides:             "written, as Istio writes it: the pod's own istio-proxy (or init) container, laid over the injected one as a strategic merge (image auto keeps the injected image)",
	AnnotationInterceptionMode:      "REDIRECT only, what the capture does; a pod asking for TPROXY or NONE is refused at injection with the reason",
	AnnotationStatusPort:            "15020 only, the agent's status port; a pod asking for another is refused at injection with the reason",
	AnnotationNativeSidecar:         "false only: the sidecar is an ordinary container; a pod asking for a Kubernetes native sidecar is refused at injection with the reason",
	AnnotationUserVolume:            "volumes added to the pod for the sidecar (a JSON object of name to volume source, as Istio's template reads it)",
	AnnotationUserVolumeMount:       "mounts added to the sidecar (a JSON object of volume name to mount)",
	AnnotationReadinessInitialDelay: "the sidecar's readiness probe",
	AnnotationReadinessPeriod:       "the sidecar's readiness probe",
	AnnotationReadinessFailures:     "the sidecar's readiness probe",
	// Read by the agent from the pod's annotations file (the downward
	// API volume the template mounts), as Istio's getStatsOptions.
	"sidecar.istio.io/extraStatTags":          "the agent adds them to the proxy config's extraStatTags (Envoy's stats tags)",
	"sidecar.istio.io/statsInclusionPrefixes": "the agent's stats matcher: replaces the proxy config's inclusionPrefixes",
	"sidecar.istio.io/statsInclusionSuffixes": "the agent's stats matcher: replaces the proxy config's inclusionSuffixes",
	"sidecar.istio.io/statsInclusionRegexps":  "the agent's stats matcher: replaces the proxy config's inclusionRegexps",
	"sidecar.istio.io/statsFlushInterval":     "Envoy's stats flush interval (1ms to 300s)",
	"sidecar.istio.io/statsEvictionInterval":  "Envoy's stats eviction interval (a multiple of the flush interval)",
	"sidecar.istio.io/statsHistogramBuckets":  "Envoy's histogram buckets, by stat prefix",
}

// notHonoured are the annotations Flotilla does not act on, and why;
// any other is planned.
var notHonoured = map[string]string{ //nolint:gosec // annotation names and reasons, not credentials
	"ambient.istio.io/bypass-inbound-capture":            "ambient mode: Flotilla has no ambient data plane",
	"ambient.istio.io/dns-capture":                       "ambient mode: Flotilla has no ambient data plane",
	"ambient.istio.io/redirection":                       "ambient mode: Flotilla has no ambient data plane",
	"istio.io/use-waypoint-canary-weight":                "waypoints: Flotilla has no ambient data plane",
	"topology.istio.io/controlPlaneClusters":             "multicluster control planes: Flotilla serves one cluster",
	"networking.istio.io/traffic-distribution":           "not honoured yet (planned): traffic goes by the DestinationRule's locality settings",
	"sidecar.istio.io/bootstrapOverride":                 "no bootstrap template from a ConfigMap is mounted or read: Flotilla's agent builds Envoy's bootstrap itself, and the proxyv2 template mounts none",
	"readiness.status.sidecar.istio.io/applicationPorts": "Istio 1.32 reads it nowhere either (its templates no longer pass it)",
	"sidecar.istio.io/statsHistogramBins":                "Istio 1.32 reads it nowhere either",
	"sidecar.istio.io/statsCompression":                  "Istio 1.32 reads it nowhere either: the proxy config's statsCompression (on by default) is honoured",
}

// PodAnnotations lists every annotation Istio reads on pods or
// namespaces, sorted, with Flotilla's support.
func PodAnnotations() []AnnotationSupport {
	var out []AnnotationSupport
	for _, a := range annotation.AllResourceAnnotations() {
		if !slices.Contains(a.Resources, annotation.Pod) && !slices.Contains(a.Resources, annotation.Namespace) {
			continue
		}
		s := AnnotationSupport{Name: a.Name}
		if how, ok := honoured[a.Name]; ok {
			s.Honoured, s.How = true, how
		} else if why, ok := notHonoured[a.Name]; ok {
			s.How = why
		} else {
			s.How = "not honoured yet (planned): it has no effect"
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b AnnotationSupport) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// NotHonouredOn says, for each annotation of the pod that Istio reads and
// Flotilla does not, that it has no effect and why: the injector returns
// these as admission warnings. Only annotations of Istio's list are
// named (the pod's other keys never reach a warning).
func NotHonouredOn(pod *corev1.Pod) []string {
	var out []string
	for _, s := range PodAnnotations() {
		if _, ok := pod.Annotations[s.Name]; ok && !s.Honoured {
			out = append(out, fmt.Sprintf("%s is not honoured by Flotilla: %s", s.Name, s.How))
		}
	}
	return out
}

// AnnotationsMarkdown is docs/annotations.md.
func AnnotationsMarkdown() string {
	var b strings.Builder
	b.WriteString("# Istio's pod and namespace annotations in Flotilla\n\n")
	b.WriteString("Every annotation Istio 1.32 reads on a pod or a namespace (its API's list), and what Flotilla does\n")
	b.WriteString("with it. The injector injects a pod that carries one it does not honour, and returns an admission\n")
	b.WriteString("warning naming each (`kubectl` prints it). Generated from `internal/inject/annotations.go`; a test\n")
	b.WriteString("keeps the two in step.\n\n")
	b.WriteString("| annotation | honoured | how, or why not |\n|---|---|---|\n")
	for _, s := range PodAnnotations() {
		h := "no"
		if s.Honoured {
			h = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", s.Name, h, s.How)
	}
	return b.String()
}
