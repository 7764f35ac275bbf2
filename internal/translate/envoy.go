package translate

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

// envoyClient is Envoy, the client of sidecars and gateways: all of its
// API that Istio uses. istio is Istio's build of Envoy (its node lists
// Istio's stats and peer-metadata filters), which also gets them.
func envoyClient(istio bool) client {
	c := client{
		name:           "envoy",
		defaultLB:      clusterv3.Cluster_LEAST_REQUEST,
		envoyClusters:  true,
		envoyHTTP:      true,
		envoyTelemetry: true,
		extensions:     true,
	}
	if istio {
		c.name, c.istioTelemetry = "istio-envoy", true
	}
	return c
}
