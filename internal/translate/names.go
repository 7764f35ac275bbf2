package translate

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// The names of resources, and their formats, that the proxies and the
// rest of the mesh rely on.

// Names of the clusters and listeners every sidecar gets.
const (
	BlackHoleCluster   = "BlackHoleCluster"
	PassthroughCluster = "PassthroughCluster"
	// InboundPassthroughCluster takes inbound connections no port of the
	// workload's claims to their original destination, from 127.0.0.6,
	// which the capture rules let through (InboundPassthroughBind).
	InboundPassthroughCluster = "InboundPassthroughCluster" //nolint:gosec // a cluster's name, not a credential
	InboundPassthroughBind    = proxycontract.InboundPassthroughSource
	inboundPassthroughBind6   = proxycontract.InboundPassthroughSource6
	VirtualOutbound           = proxycontract.VirtualOutbound
	VirtualInbound            = proxycontract.VirtualInbound

	// OutboundPort and InboundPort are where the init container's
	// iptables rules send a pod's traffic.
	OutboundPort = proxycontract.OutboundCapturePort
	InboundPort  = proxycontract.InboundCapturePort

	// SDS secret names the agent serves.
	SecretWorkload = proxycontract.SecretWorkload
	SecretRoot     = proxycontract.SecretRoot
	// sdsCluster is the cluster the bootstrap defines for the agent's SDS
	// socket.
	sdsCluster = proxycontract.SDSCluster
)

// ClusterName is Istio's cluster name: "outbound|80|v1|reviews.default.svc.cluster.local".
func ClusterName(direction string, port uint32, subset, host string) string {
	return proxycontract.ClusterName(direction, port, subset, host)
}

// ParseClusterName splits an outbound cluster name (as
// proxycontract.ParseClusterName, allocating nothing: it runs for every
// cluster a proxy asks for).
func ParseClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, ok := strings.CutPrefix(name, outbound+"|")
	if !ok {
		return 0, "", "", false
	}
	num, rest, _ := strings.Cut(rest, "|")
	subset, host, ok = strings.Cut(rest, "|")
	if !ok || strings.Contains(host, "|") {
		return 0, "", "", false
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(n), subset, host, true
}

// ListenerName of a proxyless gRPC client's API listener: "host:port".
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}

// ParseListenerName splits a ListenerName (also the name of its route
// configuration).
func ParseListenerName(name string) (host string, port uint32, ok bool) {
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(name[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return name[:i], uint32(n), true
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// credentialCASuffix names, after a credential's SDS name
// (registry.CredentialPrefix + name), the CA certificates of MUTUAL
// servers, as Istio does.
const credentialCASuffix = "-cacert"

// The directions that start cluster names.
const (
	inbound  = proxycontract.Inbound
	outbound = proxycontract.Outbound
)

// Envoy's names of the filters and metadata the builders use.
const (
	hcmFilter      = "envoy.filters.network.http_connection_manager"
	tcpProxyFilter = "envoy.filters.network.tcp_proxy"
	faultFilter    = "envoy.filters.http.fault"
	corsFilter     = "envoy.filters.http.cors"
	routerFilter   = "envoy.filters.http.router"
	// transportSocketMatch is the endpoint metadata filter Envoy reads to
	// pick a transport socket (auto mTLS).
	transportSocketMatch = "envoy.transport_socket_match"
	tlsModeIstio         = "istio"
	// istioMetadata is the filter metadata key under which Istio names a
	// resource's config (util.IstioMetadataKey).
	istioMetadata = "istio"
)

// Certificate provider names of the agent's gRPC bootstrap: one
// file_watcher instance holding the workload certificate and the roots.
// grpc-go hands the certificate name to the provider, which the
// file_watcher plugin ignores; Istio's names are kept.
const (
	GRPCCertProvider = proxycontract.GRPCCertProvider
	grpcCertName     = proxycontract.SecretWorkload
	grpcRootName     = proxycontract.SecretRoot
)

// credentialSDSName is the SDS name of a credentialName (Istio's
// credentials.ToResourceName): "kubernetes://<credentialName>", or the
// name itself when it has a scheme of its own (the Gateway API's
// "kubernetes-gateway://<ns>/<name>", a ConfigMap's "configmap://"), or
// "invalid://" for a credential a Gateway API policy could not resolve.
func credentialSDSName(cn string) string {
	switch {
	case strings.HasPrefix(cn, registry.InvalidCredentialPrefix):
		// Never served: the TLS using it never completes.
		return registry.InvalidCredentialPrefix
	case strings.HasPrefix(cn, registry.CredentialPrefix), strings.HasPrefix(cn, registry.GatewayCredentialPrefix),
		strings.HasPrefix(cn, registry.ConfigMapCredentialPrefix):
		return cn
	}
	return registry.CredentialPrefix + cn
}

// configMetadata names the config a resource comes from, as Istio's
// util.AddConfigInfoMetadata: filter metadata "istio" with "config" its
// API path, /apis/networking.istio.io/v1/namespaces/<ns>/<kind>/<name>
// (kind in kebab case), which proxy-config and Envoy's access logs read.
// translateRoute names a route's VirtualService, the cluster builder a
// cluster's DestinationRule.
func configMetadata(kind, namespace, name string) *corev3.Metadata {
	path := "/apis/networking.istio.io/v1/namespaces/" + namespace + "/" + kind + "/" + name
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		istioMetadata: {Fields: map[string]*structpb.Value{"config": structpb.NewStringValue(path)}},
	}}
}
