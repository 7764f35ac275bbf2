package debugapi

import (
	"encoding/json"
	"net/http"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/platform/admin"
)

// AgentBootstrapPath is where the agent serves, on its status port
// (15020), the bootstrap it wrote for its proxy, as AgentBootstrap (the
// CLI's proxy-config bootstrap). It is served only to loopback clients:
// inside the pod, which is where kubectl port-forward (and a local run)
// connects from; the kubelet and Prometheus, which reach the port from
// outside, get 403.
const AgentBootstrapPath = "/debug/bootstrap"

// AgentSecretsPath is where the agent serves, on its status port and to
// loopback clients only as AgentBootstrapPath, the workload secrets it
// gives its proxy (SDS "default" and "ROOTCA", or a proxyless
// application's certificate files): an Envoy admin SecretsConfigDump as
// JSON, as Envoy's own /config_dump shows secrets, the private key
// "[redacted]" (the CLI's proxy-config secret).
const AgentSecretsPath = "/debug/secrets" //nolint:gosec // a URL path, not a credential

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
	return admin.LoopbackOnly("the bootstrap", func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, "bootstrap: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// SecretsHandler serves at AgentSecretsPath, to loopback clients, the
// secrets current returns as the agent holds them now; the caller has
// redacted their keys.
func SecretsHandler(current func() []*tlsv3.Secret) http.Handler {
	return admin.LoopbackOnly("the workload's secrets", func(w http.ResponseWriter, _ *http.Request) {
		var dump adminv3.SecretsConfigDump
		for _, s := range current() {
			a, err := anypb.New(s)
			if err != nil {
				http.Error(w, "secrets: "+err.Error(), http.StatusInternalServerError)
				return
			}
			dump.DynamicActiveSecrets = append(dump.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: s.GetName(), Secret: a})
		}
		body, err := protojson.Marshal(&dump)
		if err != nil {
			http.Error(w, "secrets: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// AgentNameTablePath is where the agent serves, to loopback clients only
// as AgentBootstrapPath, the name table its DNS proxy answers from, as
// JSON (istio.networking.nds.v1.NameTable), as Istio's agent serves
// /debug/ndsz: 404 with {} when it has none (no DNS capture, or no table
// from discovery yet).
const AgentNameTablePath = "/debug/ndsz"

// NameTableHandler serves current's table at AgentNameTablePath to
// loopback clients.
func NameTableHandler(current func() proto.Message) http.Handler {
	return admin.LoopbackOnly("the name table", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		nt := current()
		if nt == nil {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte("{}"))
			return
		}
		body, err := protojson.Marshal(nt)
		if err != nil {
			http.Error(w, "name table: "+err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(body)
	})
}

// AgentEnvoyPath is where the agent relays, to loopback clients only as
// AgentBootstrapPath, the Envoy admin endpoints the CLI reads from the
// proxy itself (proxy-config --source proxy, log, envoy-stats):
// AgentEnvoyPath+EnvoyConfigDump and the others below, the query passed
// on as Envoy takes it. Envoy's admin listens on the pod's loopback
// (proxyAdminPort); the relay reaches it where the agent's status port is
// what the CLI already connects to. A pod without Envoy (proxyless)
// answers 404 there.
const AgentEnvoyPath = "/debug/envoy/"

// The Envoy admin endpoints the agent relays: read with GET, but
// EnvoyLogging, which Envoy takes (and answers, with every logger's
// level) only by POST.
const (
	EnvoyConfigDump = "config_dump"
	EnvoyClusters   = "clusters"
	EnvoyStats      = "stats"
	EnvoyStatsProm  = "stats/prometheus"
	EnvoyServerInfo = "server_info"
	EnvoyLogging    = "logging"
)
