package bootstrap

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// honouredFields are the ProxyConfig fields (by their JSON names) that
// take effect in a pod whose sidecar is Flotilla's agent, and where.
// Unhonoured reports every other field a pod's proxy config sets.
var honouredFields = map[string]string{
	// the agent: the bootstrap and Envoy's command line
	"concurrency":           "Envoy's --concurrency",
	"drainDuration":         "Envoy's --drain-time-s",
	"fileFlushInterval":     "Envoy's --file-flush-interval-msec",
	"fileFlushMinSizeKb":    "Envoy's --file-flush-min-size-kb",
	"tracing":               "the bootstrap's tracer (zipkin)",
	"extraStatTags":         "the bootstrap's stats tags",
	"proxyStatsMatcher":     "the bootstrap's stats matcher",
	"runtimeValues":         "the bootstrap's runtime layer",
	"envoyMetricsService":   "the bootstrap's metrics_service sink",
	"envoyAccessLogService": "the bootstrap's envoy_accesslog_service cluster",
	"statusPort":            "the agent's status port",
	"proxyAdminPort":        "Envoy's admin port",
	"statsCompression":      "the Prometheus listener's compressors",
	// the agent's lifecycle
	"terminationDrainDuration": "the agent's drain on SIGTERM",
	// the injector
	"proxyMetadata":                   "the sidecar's environment",
	"holdApplicationUntilProxyStarts": "the container order and the wait",
	"image":                           "the image type",
	"discoveryAddress":                "the agent's discovery address",
	// discovery
	"gatewayTopology": "a gateway's listeners",
	"proxyHeaders":    "the connection managers' and routes' headers",
	// no Envoy option left to set, in Istio 1.32 either (its injector
	// drops the default, and nothing reads it)
	"statNameLength": "no effect in Istio either",
	// REDIRECT is what the capture does; other modes are reported below
	"interceptionMode": "REDIRECT",
}

// Unhonoured says which fields of pc have no effect with Flotilla's agent
// (the agent logs each; Istio's own agent, in a proxyv2 sidecar, reads
// them itself).
func Unhonoured(pc *meshv1alpha1.ProxyConfig) []string {
	if pc == nil {
		return nil
	}
	var out []string
	pc.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if _, ok := honouredFields[fd.JSONName()]; !ok {
			out = append(out, fmt.Sprintf("proxy config %s has no effect with Flotilla's agent", fd.JSONName()))
		}
		return true
	})
	slices.Sort(out)
	if m := pc.GetInterceptionMode(); m != meshv1alpha1.ProxyConfig_REDIRECT {
		out = append(out, fmt.Sprintf("proxy config interceptionMode %s: Flotilla's capture redirects (REDIRECT); the mode is not honoured", m))
	}
	return out
}
