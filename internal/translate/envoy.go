package translate

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

// envoyClient is Envoy, the client of sidecars and gateways: all of its
// API that Istio uses.
func envoyClient() client {
	return client{
		name:           "envoy",
		defaultLB:      clusterv3.Cluster_LEAST_REQUEST,
		envoyClusters:  true,
		envoyHTTP:      true,
		envoyTelemetry: true,
	}
}
