package translate

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// envoyClient is Envoy, the client of sidecars and gateways: all of its
// API that Istio uses.
func envoyClient() client {
	return client{
		name:          "envoy",
		defaultLB:     clusterv3.Cluster_LEAST_REQUEST,
		envoyClusters: true,
		upstreamTLS:   (*gen).envoyUpstreamTLS,
		envoyHTTP:     true,
		defaultRetry:  (*gen).sharedDefaultRetryPolicy,
	}
}

// envoyUpstreamTLS is applyTLS, which never drops a cluster.
func (g *gen) envoyUpstreamTLS(c *clusterv3.Cluster, svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset, dr *model.DestinationRule, tls *networking.ClientTLSSettings) bool {
	g.applyTLS(c, svc, port, ss, dr, tls)
	return true
}
