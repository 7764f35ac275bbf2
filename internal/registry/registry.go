// Package registry names the registry collections galley publishes and
// their resources (see api/proto/flotilla/registry/v1), and holds the rules
// that turn a port's name or appProtocol into a protocol, shared by galley
// (which normalises) and discovery (which reads).
package registry

import (
	"strings"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// Type URLs of the registry collections, and of the mesh configuration
// (istio.io/api mesh.v1alpha1.MeshConfig, one resource named "mesh").
const (
	ServiceTypeURL     = "registry.flotilla.io/v1/Service"
	EndpointSetTypeURL = "registry.flotilla.io/v1/EndpointSet"
	NamespaceTypeURL   = "registry.flotilla.io/v1/Namespace"
	// InjectionConfigTypeURL: one resource per injector revision, named by
	// the revision.
	InjectionConfigTypeURL = "registry.flotilla.io/v1/InjectionConfig"
	MeshConfigTypeURL      = "mesh.istio.io/v1alpha1/MeshConfig"
	// CredentialTypeURL: the Secrets configuration names by
	// credentialName, "namespace/name"; galley serves them to discovery
	// only.
	CredentialTypeURL = "registry.flotilla.io/v1/Credential"
)

// CredentialPrefix starts how configuration and SDS name a credential,
// as Istio does: "kubernetes://<name>" (credentialName may carry it;
// proxies ask for the secret by it).
const CredentialPrefix = "kubernetes://" //nolint:gosec // a name's prefix, not a credential

// GatewayCredentialPrefix starts the credentialName of a Gateway
// generated from the Gateway API: "kubernetes-gateway://<namespace>/<name>"
// (Istio's kubernetes-gateway resource type).
const GatewayCredentialPrefix = "kubernetes-gateway://" //nolint:gosec // a name's prefix, not a credential

// ConfigMapCredentialPrefix starts a CA certificate name read from a
// ConfigMap's ca.crt ("configmap://<namespace>/<name>-cacert", Istio's
// credentials.KubernetesConfigMapType), as the Gateway API's frontend
// validation and BackendTLSPolicies name one.
const ConfigMapCredentialPrefix = "configmap://" //nolint:gosec // a name's prefix, not a credential

// InvalidCredentialPrefix is the credentialName of a credential that
// could not be resolved (Istio's credentials.InvalidSecretTypeURI): no
// proxy is ever served it, so TLS that needs it never completes and
// traffic is refused rather than sent unverified.
const InvalidCredentialPrefix = "invalid://"

// CredentialName is the resource name of a Credential: "namespace/name".
func CredentialName(namespace, name string) string { return namespace + "/" + name }

// ConfigMapCredentialName is the resource name of a ConfigMap's CA
// certificates (a Credential with config_map): "configmap/namespace/name",
// apart from every Secret's.
func ConfigMapCredentialName(namespace, name string) string {
	return "configmap/" + namespace + "/" + name
}

// CredentialResourceName is the resource name of c (CredentialName, or
// ConfigMapCredentialName for a ConfigMap's).
func CredentialResourceName(c *registryv1.Credential) string {
	if c.GetConfigMap() {
		return ConfigMapCredentialName(c.GetNamespace(), c.GetName())
	}
	return CredentialName(c.GetNamespace(), c.GetName())
}

// IstioMeshConfigTypeURL is where Istio's pilot asks for the mesh config
// from an MCP config source (its gvk.MeshConfig): the same MeshConfig,
// the resource being the MeshConfig itself rather than an MCP Resource.
const IstioMeshConfigTypeURL = "core/v1alpha1/MeshConfig"

// MeshConfigName is the name of the single MeshConfig resource.
const MeshConfigName = "mesh"

// ShardSize is the most endpoints galley puts in one EndpointSet, as the
// Kubernetes endpoint-slice controller does per EndpointSlice.
const ShardSize = 100

// ServiceName is the resource name of a Service: "namespace/hostname".
func ServiceName(namespace, hostname string) string { return namespace + "/" + hostname }

// EndpointSetName is the resource name of an EndpointSet:
// "namespace/hostname/shard".
func EndpointSetName(namespace, hostname, shard string) string {
	return namespace + "/" + hostname + "/" + shard
}

// ParseProtocol maps an Istio protocol name ("HTTP", "grpc-web", ...) to
// the registry protocol; unknown names are PROTOCOL_UNSPECIFIED (sniffed).
func ParseProtocol(name string) registryv1.Protocol {
	switch strings.ToUpper(name) {
	case "HTTP", "GRPC-WEB":
		return registryv1.Protocol_PROTOCOL_HTTP
	case "HTTP2":
		return registryv1.Protocol_PROTOCOL_HTTP2
	case "GRPC":
		return registryv1.Protocol_PROTOCOL_GRPC
	case "HTTPS":
		return registryv1.Protocol_PROTOCOL_HTTPS
	case "TLS":
		return registryv1.Protocol_PROTOCOL_TLS
	case "TCP":
		return registryv1.Protocol_PROTOCOL_TCP
	case "MONGO":
		return registryv1.Protocol_PROTOCOL_MONGO
	case "REDIS":
		return registryv1.Protocol_PROTOCOL_REDIS
	case "MYSQL":
		return registryv1.Protocol_PROTOCOL_MYSQL
	case "UDP":
		return registryv1.Protocol_PROTOCOL_UDP
	default:
		return registryv1.Protocol_PROTOCOL_UNSPECIFIED
	}
}

// ProtocolName is a registry protocol by Istio's name for it (Istio's
// protocol.Instance: "HTTP", "GRPC", "Mongo", …); a protocol left to
// sniffing is Istio's "UnsupportedProtocol".
func ProtocolName(p registryv1.Protocol) string {
	switch p {
	case registryv1.Protocol_PROTOCOL_HTTP:
		return "HTTP"
	case registryv1.Protocol_PROTOCOL_HTTP2:
		return "HTTP2"
	case registryv1.Protocol_PROTOCOL_GRPC:
		return "GRPC"
	case registryv1.Protocol_PROTOCOL_HTTPS:
		return "HTTPS"
	case registryv1.Protocol_PROTOCOL_TLS:
		return "TLS"
	case registryv1.Protocol_PROTOCOL_TCP:
		return "TCP"
	case registryv1.Protocol_PROTOCOL_MONGO:
		return "Mongo"
	case registryv1.Protocol_PROTOCOL_REDIS:
		return "Redis"
	case registryv1.Protocol_PROTOCOL_MYSQL:
		return "MySQL"
	case registryv1.Protocol_PROTOCOL_UDP:
		return "UDP"
	default:
		return "UnsupportedProtocol"
	}
}

// KubernetesPortProtocol derives a Kubernetes Service port's protocol the
// way Istio does: appProtocol first (including the kubernetes.io/ names),
// then the port name's prefix ("http-web", "grpc", "tcp-db"), and UDP
// ports are UDP whatever their name.
func KubernetesPortProtocol(name, appProtocol, transport string) registryv1.Protocol {
	if strings.EqualFold(transport, "UDP") {
		return registryv1.Protocol_PROTOCOL_UDP
	}
	switch strings.ToLower(appProtocol) {
	case "":
	case "kubernetes.io/h2c":
		return registryv1.Protocol_PROTOCOL_HTTP2
	case "kubernetes.io/ws":
		return registryv1.Protocol_PROTOCOL_HTTP
	case "kubernetes.io/wss":
		return registryv1.Protocol_PROTOCOL_HTTPS
	default:
		if p := ParseProtocol(appProtocol); p != registryv1.Protocol_PROTOCOL_UNSPECIFIED {
			return p
		}
	}
	// "grpc-web" is a protocol of its own, not grpc with a suffix.
	if strings.HasPrefix(strings.ToLower(name), "grpc-web") {
		return ParseProtocol("grpc-web")
	}
	prefix, _, _ := strings.Cut(name, "-")
	return ParseProtocol(prefix)
}

// The bounds of a discovery replica's EnvoyFilter report to galley
// (api/proto/flotilla/galley/v1/envoyfilterstatus.proto): discovery sends
// at most these; galley refuses more EnvoyFilters, keeps the first
// problems of each and cuts a longer text.
const (
	MaxReportedEnvoyFilters    = 4096
	MaxEnvoyFilterProblems     = 10
	MaxEnvoyFilterProblemBytes = 1024
)
