// Package appprobe is the contract between the injector and the agent for
// the application's probes (Istio's sidecar.istio.io/rewriteAppHTTPProbers):
// the injector points each probe at the agent's PathPrefix and hands the
// original over in EnvVar, as JSON from those paths to Prober; the agent
// performs the original.
package appprobe

import corev1 "k8s.io/api/core/v1"

// PathPrefix is where rewritten probes are served, on the agent's port.
const PathPrefix = "/app-health/"

// AgentPort serves them.
const AgentPort = 15020

// EnvVar carries the original probes to the agent (Istio's name).
const EnvVar = "ISTIO_KUBE_APP_PROBERS"

// Prober is one original probe, as Istio's injector writes it.
type Prober struct {
	HTTPGet        *corev1.HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *corev1.GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32                   `json:"timeoutSeconds,omitempty"`
}

// Path is the rewritten probe's path: kind is livez, readyz or startupz.
func Path(container, kind string) string { return PathPrefix + container + "/" + kind }
