// Package appprobe is the contract between the injector and the agent for
// the application's probes (Istio's sidecar.istio.io/rewriteAppHTTPProbers):
// the injector points each probe at the agent's PathPrefix and hands the
// original over in EnvVar, as JSON from those paths to Prober; the agent
// performs the original.
//
// The probe types are copies of the Kubernetes ones, field for field in
// their JSON, as Istio keeps them (pkg/kube/apimirror): the agent runs in
// every pod of the mesh, and linking k8s.io/api for four structs cost it
// megabytes of memory in each.
package appprobe

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// PathPrefix is where rewritten probes are served, on the agent's port.
const PathPrefix = "/app-health/"

// AgentPort serves them.
const AgentPort = 15020

// EnvVar carries the original probes to the agent (Istio's name).
const EnvVar = "ISTIO_KUBE_APP_PROBERS"

// Prober is one original probe, as Istio's injector writes it.
type Prober struct {
	HTTPGet        *HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32            `json:"timeoutSeconds,omitempty"`
}

// HTTPGetAction is Kubernetes' core/v1 HTTPGetAction.
type HTTPGetAction struct {
	Path        string       `json:"path,omitempty"`
	Port        Port         `json:"port"`
	Host        string       `json:"host,omitempty"`
	Scheme      string       `json:"scheme,omitempty"` // "HTTP" or "HTTPS"
	HTTPHeaders []HTTPHeader `json:"httpHeaders,omitempty"`
}

// SchemeHTTPS is HTTPGetAction's Scheme for a probe over TLS.
const SchemeHTTPS = "HTTPS"

// HTTPHeader is Kubernetes' core/v1 HTTPHeader.
type HTTPHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// TCPSocketAction is Kubernetes' core/v1 TCPSocketAction.
type TCPSocketAction struct {
	Port Port   `json:"port"`
	Host string `json:"host,omitempty"`
}

// GRPCAction is Kubernetes' core/v1 GRPCAction.
type GRPCAction struct {
	Port    int32   `json:"port"`
	Service *string `json:"service"`
}

// Port is Kubernetes' IntOrString as a probe's port: a number, or a
// container port's name. The injector resolves names, so the agent needs a
// number; Number is 0 for a name.
type Port struct {
	Num  int32
	Name string
}

// NumberPort is the port numbered n.
func NumberPort(n int32) Port { return Port{Num: n} }

// Number is the port's number, from a numeric string too (as
// IntOrString.IntValue); 0 when it is a name.
func (p Port) Number() int {
	if p.Name == "" {
		return int(p.Num)
	}
	n, err := strconv.Atoi(p.Name)
	if err != nil {
		return 0
	}
	return n
}

// MarshalJSON writes a number, or the name as a string.
func (p Port) MarshalJSON() ([]byte, error) {
	if p.Name != "" {
		return json.Marshal(p.Name)
	}
	return json.Marshal(p.Num)
}

// UnmarshalJSON reads a JSON number or string, as IntOrString.
func (p *Port) UnmarshalJSON(b []byte) error {
	*p = Port{}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte(`"`)) {
		return json.Unmarshal(b, &p.Name)
	}
	return json.Unmarshal(b, &p.Num)
}

// Path is the rewritten probe's path: kind is livez, readyz or startupz.
func Path(container, kind string) string { return PathPrefix + container + "/" + kind }
