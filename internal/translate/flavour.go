package translate

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	networking "istio.io/api/networking/v1alpha3"
)

// flavour is what only one kind of proxy gets. newGen chooses it once,
// from the proxy's kind, as Istio's ConfigGeneratorImpl branches once on
// the node type (BuildListeners: sidecar or router) and its xDS server
// picks one generator per GENERATOR (grpcgen for proxyless clients):
//
//   - sidecar (sidecar.go, with inbound.go and egress.go): inbound and
//     outbound listeners, inbound and passthrough clusters, routes per
//     port;
//   - router (gateway.go): the Gateways selecting the proxy merged into
//     listeners per port, their routes, SNI-DNAT clusters;
//   - proxyless (proxyless.go): API listeners and their routes per
//     service port, xDS-enabled gRPC servers' listeners.
//
// A flavour names the resources its proxy has and builds those that are
// only its own; every building block flavours share lives in the
// per-type files (cds.go, eds.go, rds.go, lds.go, authz.go, …), which ask
// the proxy's client what it implements (g.client), never which flavour
// it is.
type flavour interface {
	// clusterNames names the clusters the proxy has besides the outbound
	// clusters of the services it sees.
	clusterNames(g *gen) []string
	// localCluster builds a cluster that is not a service's; nil when the
	// proxy has none of that name.
	localCluster(g *gen, name string) *builtCluster
	// routeNames names every route configuration the proxy has.
	routeNames(g *gen) []string
	// buildRoute builds one route configuration, unchecked; nil when the
	// proxy has none of that name.
	buildRoute(g *gen, name string) *routev3.RouteConfiguration
	// sharedRouteKey is the push-context key under which proxies alike
	// share a route configuration; false when each builds its own.
	sharedRouteKey(g *gen, name string) (string, bool)
	// routeKnown reports whether a route configuration a listener names
	// is one the proxy gets.
	routeKnown(g *gen, name string) bool
	// listeners returns the named listeners (all when names is nil),
	// checked and sorted by name.
	listeners(g *gen, names []string) []*listenerv3.Listener
	// gatewayCredentials are the Gateway API certificate names
	// ("kubernetes-gateway://<ns>/<name>", and their CA's) the proxy may
	// get without reading Secrets itself: those the Gateways of its own
	// namespace selecting it name for Secrets of that namespace (Istio's
	// MergedGateway.VerifiedCertificateReferences); none for a proxy
	// that is not a gateway.
	gatewayCredentials(g *gen) map[string]bool
	// patchContexts are the EnvoyFilter contexts of the proxy's outbound
	// and inbound resources; false when EnvoyFilters do not apply to it.
	patchContexts() (outbound, inbound networking.EnvoyFilter_PatchContext, ok bool)
	// jwtClearsRouteCache: the JWT filter clears the route cache once it
	// has verified a token, so that routes matching the token's claims
	// (a VirtualService's @request.auth.claims, bound to gateways only)
	// see them; Istio's JwtFilter(proxy.Type != SidecarProxy).
	jwtClearsRouteCache() bool
}

// client is what the proxy's xDS client implements, where Envoy and
// grpc-go's xDS client (gRFC A27 and after) differ. Sidecars and gateways
// are Envoy (envoyClient); proxyless gRPC clients and servers are grpc-go
// (grpcClient). Shared builders ask these questions; the answers are
// chosen once, with the flavour.
type client struct {
	// name tells the clients apart in the push context's memo keys:
	// what shared builders make differs per client, not per flavour
	// (a sidecar and a gateway share an outbound cluster).
	name string
	// defaultLB is a cluster's load balancing when its policy names
	// none: Istio's LEAST_REQUEST for Envoy, ROUND_ROBIN for grpc-go
	// (Istio's grpcgen).
	defaultLB clusterv3.Cluster_LbPolicy
	// envoyClusters: the client reads Envoy's whole cluster API —
	// STRICT_DNS with refresh rate and TTL, ORIGINAL_DST, RANDOM and
	// Maglev, slow start, TCP keepalive, the panic threshold,
	// locality-weighted load balancing, upstream protocol options,
	// PROXY protocol and transport socket matches (auto mTLS by endpoint
	// metadata). grpc-go reads EDS and LOGICAL_DNS clusters,
	// ROUND_ROBIN, RING_HASH, outlier detection and circuit breakers.
	envoyClusters bool
	// certProviderTLS: the client's TLS comes from the agent's
	// certificate provider (grpc-go, gRFC A29: grpcClusterTLS), not from
	// SDS (Envoy: applyTLS).
	certProviderTLS bool
	// envoyHTTP: the client runs Envoy's HTTP connection manager with
	// Istio's settings (sidecarHCM), the CORS filter and per-route CORS
	// policies, and the JWT filter (RequestAuthentication). grpc-go runs
	// the fault and router filters (and RBAC on servers) only.
	envoyHTTP bool
	// grpcRBAC: a server's authorization is grpc-go's RBAC filter (the
	// subset of Envoy's that gRFC A41 reads), not Envoy's HTTP and TCP
	// filters.
	grpcRBAC bool
	// envoyTelemetry: the client runs Envoy's access loggers and tracers;
	// grpc-go reads neither.
	envoyTelemetry bool
	// extensions: the client runs Wasm and Lua filters and reads their
	// configuration over ECDS (WasmPlugin, TrafficExtension); grpc-go
	// runs neither (Istio's gRPC generator applies none).
	extensions bool
	// istioTelemetry: the client is Istio's build of Envoy, with Istio's
	// stats filter (istio_requests_total and the other standard metrics)
	// and the peer-metadata exchange that labels them.
	istioTelemetry bool
	// allocatedAddresses: the client reaches a ServiceEntry host without
	// addresses at the addresses allocated to it, its DNS being answered
	// from the name table (model.Proxy.CapturesDNS): they are that host's
	// listener and virtual host addresses (serviceAddresses).
	allocatedAddresses bool
	// retries reports whether the client understands a retry condition;
	// nil for all of Envoy's. A client that understands fewer gets them
	// in a default policy of its own (grpcDefaultRetryPolicy).
	retries func(condition string) bool
}
