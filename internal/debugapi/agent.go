package debugapi

import (
	"encoding/json"
	"net"
	"net/http"
)

// AgentBootstrapPath is where the agent serves, on its status port
// (15020), the bootstrap it wrote for its proxy, as AgentBootstrap (the
// CLI's proxy-config bootstrap). It is served only to loopback clients:
// inside the pod, which is where kubectl port-forward (and a local run)
// connects from; the kubelet and Prometheus, which reach the port from
// outside, get 403.
const AgentBootstrapPath = "/debug/bootstrap"

// The types of bootstrap an agent writes.
const (
	BootstrapEnvoy = "envoy" // Envoy's (envoy.config.bootstrap.v3.Bootstrap as JSON)
	BootstrapGRPC  = "grpc"  // a proxyless gRPC application's (GRPC_XDS_BOOTSTRAP)
)

// AgentBootstrap is what AgentBootstrapPath answers.
type AgentBootstrap struct {
	Type      string          `json:"type"`
	Bootstrap json.RawMessage `json:"bootstrap"`
}

// BootstrapHandler serves b at AgentBootstrapPath to loopback clients.
func BootstrapHandler(b AgentBootstrap) http.Handler {
	body, err := json.Marshal(b)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			http.Error(w, "the bootstrap is served inside the pod only (kubectl port-forward connects from there)", http.StatusForbidden)
			return
		}
		if err != nil {
			http.Error(w, "bootstrap: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}
