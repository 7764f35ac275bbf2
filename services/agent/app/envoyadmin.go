package app

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/admin"
)

// maxRelayedBytes bounds what the relay copies from Envoy's admin in one
// answer: a config dump of a large mesh runs to tens of MiB.
const maxRelayedBytes = 256 << 20

// relayTimeout bounds one relayed request.
const relayTimeout = 30 * time.Second

// handleEnvoyAdmin relays debugapi.AgentEnvoyPath's endpoints to Envoy's
// admin at envoyAdmin (host:port; "" when the pod runs no Envoy, when
// they answer 404 saying so). Only the endpoints named there, only by
// their method, only to loopback clients: Envoy's admin also quits,
// drains and resets, which the relay never reaches.
func handleEnvoyAdmin(handle func(pattern string, h http.Handler), envoyAdmin string) {
	if envoyAdmin == "" {
		handle(debugapi.AgentEnvoyPath, admin.LoopbackOnly("Envoy's admin", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "this pod runs no Envoy (a proxyless gRPC application): there is no Envoy admin to read", http.StatusNotFound)
		}))
		return
	}
	client := &http.Client{Timeout: relayTimeout}
	relay := func(method, endpoint string) {
		handle(method+" "+debugapi.AgentEnvoyPath+endpoint, admin.LoopbackOnly("Envoy's admin", func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), relayTimeout)
			defer cancel()
			u := "http://" + envoyAdmin + "/" + endpoint
			if r.URL.RawQuery != "" {
				u += "?" + r.URL.RawQuery
			}
			// The host and path are the agent's own; the query alone is the
			// (loopback) caller's.
			req, err := http.NewRequestWithContext(ctx, method, u, nil) //nolint:gosec // not caller-chosen: see above
			if err != nil {
				http.Error(w, "Envoy's admin: "+err.Error(), http.StatusBadRequest)
				return
			}
			resp, err := client.Do(req) //nolint:gosec // Envoy's admin on loopback, as above
			if err != nil {
				http.Error(w, "Envoy's admin at "+envoyAdmin+" does not answer: "+err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "" {
				w.Header().Set("Content-Type", ct)
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, io.LimitReader(resp.Body, maxRelayedBytes))
		}))
	}
	for _, e := range []string{debugapi.EnvoyConfigDump, debugapi.EnvoyClusters, debugapi.EnvoyStats, debugapi.EnvoyStatsProm, debugapi.EnvoyServerInfo} {
		relay(http.MethodGet, e)
	}
	relay(http.MethodPost, debugapi.EnvoyLogging)
}
