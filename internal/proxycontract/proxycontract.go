// Package proxycontract is the contract between the pod side — the agent,
// the Envoy it starts and the proxyless gRPC applications it writes a
// bootstrap for — and discovery: the values both sides write or read and
// must agree on, held once so neither side can drift alone. Node IDs and
// metadata keys (what a proxy says it is), the capture ports (where the
// agent's rules send traffic and where discovery's listeners wait for it),
// the SDS cluster and secret names (what discovery's resources ask the
// agent for), the proxyless bootstrap's names, and the cluster and
// listener names the CLI reads back out of a proxy's configuration.
//
// Each value is Istio's, named beside it, so Istio's proxies and tools
// keep working against Flotilla. The package imports only the standard
// library: the agent links it without discovery's model or translation.
package proxycontract

import (
	"strconv"
	"strings"
)

// Proxy types: a node ID's first part (Istio: model.SidecarProxy and
// model.Router).
const (
	Sidecar = "sidecar"
	Router  = "router" // gateways
)

// NodeID is an Envoy node's id as Istio writes it,
// type~ip~id~domain: "sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local"
// (Istio: model.ServiceNode, parsed by model.ParseServiceNodeWithMetadata).
type NodeID struct {
	// Type is Sidecar or Router.
	Type string
	// IP is the workload's address.
	IP string
	// ID is "pod.namespace" for a pod (PodID).
	ID string
	// DNSDomain is "namespace.svc.<cluster domain>" for a pod (PodDNSDomain).
	DNSDomain string
}

// nodeIDSeparator separates a node ID's parts.
const nodeIDSeparator = "~"

// String is the node ID.
func (n NodeID) String() string {
	return n.Type + nodeIDSeparator + n.IP + nodeIDSeparator + n.ID + nodeIDSeparator + n.DNSDomain
}

// ParseNodeID splits a node ID into its four parts; ok is false unless
// there are exactly four. The parts are not checked: that is the
// reader's.
func ParseNodeID(id string) (NodeID, bool) {
	parts := strings.Split(id, nodeIDSeparator)
	if len(parts) != 4 {
		return NodeID{}, false
	}
	return NodeID{Type: parts[0], IP: parts[1], ID: parts[2], DNSDomain: parts[3]}, true
}

// PodID is a pod's node ID part: "pod.namespace".
func PodID(pod, namespace string) string { return pod + "." + namespace }

// PodDNSDomain is a pod's node ID domain: "namespace.svc.<domain suffix>".
func PodDNSDomain(namespace, domainSuffix string) string {
	return namespace + ".svc." + domainSuffix
}

// MaxLabels bounds the labels a node may send (MetadataLabels): discovery
// refuses a node with more, and galley a workload that registers with more.
const MaxLabels = 256

// Node metadata keys the agent writes and discovery reads (Istio: the JSON
// names of model.NodeMetadata's fields).
const (
	// MetadataName is the pod's name (Istio: InstanceName).
	MetadataName = "NAME"
	// MetadataNamespace is the workload's namespace.
	MetadataNamespace = "NAMESPACE"
	// MetadataInstanceIPs are the workload's addresses, comma-separated.
	MetadataInstanceIPs = "INSTANCE_IPS"
	// MetadataLabels are the workload's labels, a map of strings, at most
	// MaxLabels of them.
	MetadataLabels = "LABELS"
	// MetadataNetwork is the workload's network (Istio's NETWORK).
	MetadataNetwork = "NETWORK"
	// MetadataAutoRegisterGroup names the WorkloadGroup a workload joins
	// with, to be registered (Istio's AUTO_REGISTER_GROUP, from
	// ISTIO_META_AUTO_REGISTER_GROUP).
	MetadataAutoRegisterGroup = "AUTO_REGISTER_GROUP"
	// MetadataWorkloadEntry names the existing WorkloadEntry a workload
	// that does not register is (Istio's WORKLOAD_ENTRY, from
	// ISTIO_META_WORKLOAD_ENTRY): its health is reported into it.
	MetadataWorkloadEntry = "WORKLOAD_ENTRY"
	// MetadataClusterID is the cluster the workload runs in.
	MetadataClusterID = "CLUSTER_ID"
	// MetadataMeshID is the mesh the workload is in.
	MetadataMeshID = "MESH_ID"
	// MetadataProxyConfig is the pod's proxy config (Istio's
	// ProxyConfig, its proxy.istio.io/config over the ProxyConfig
	// resources), as a JSON object: what discovery configures from it
	// (a gateway's topology) it reads here, as istiod does.
	MetadataProxyConfig = "PROXY_CONFIG"
	// MetadataIstioVersion is the proxy's version.
	MetadataIstioVersion = "ISTIO_VERSION"
	// MetadataServiceAccount is the workload's service account.
	MetadataServiceAccount = "SERVICE_ACCOUNT"
	// MetadataDNSCapture is "true" when the proxy's agent answers its
	// workload's DNS (Istio's DNS_CAPTURE, from ISTIO_META_DNS_CAPTURE).
	MetadataDNSCapture = "DNS_CAPTURE"
	// DNSCaptureEnv turns DNS capture on, in the sidecar (the agent's DNS
	// proxy) and in the init container (the capture of the pod's DNS), as
	// in Istio; proxyMetadata sets it.
	DNSCaptureEnv = "ISTIO_META_DNS_CAPTURE"
	// DNSProxyPort is where the agent's DNS proxy listens (UDP and TCP)
	// and the pod's captured DNS is sent (Istio's
	// IstioAgentDNSListenerPort).
	DNSProxyPort = 15053
	// NameTableKubernetes and NameTableExternal are where a host of the
	// name table comes from (its NameInfo.registry, Istio's provider
	// IDs): the agent answers a Kubernetes Service's short forms too.
	NameTableKubernetes = "Kubernetes"
	NameTableExternal   = "External"
	// MetadataGenerator picks the configuration flavour: GeneratorGRPC,
	// or absent for Envoy.
	MetadataGenerator = "GENERATOR"
)

// IstioTelemetryTypeURLs are the configuration types of Istio's stats
// and peer-metadata filters, which only Istio's build of Envoy has: a
// proxy whose node lists all of them among its extensions gets Istio's
// standard metrics (Envoy reports its extensions in its node).
var IstioTelemetryTypeURLs = []string{
	"stats.PluginConfig",
	"io.istio.http.peer_metadata.Config",
	"envoy.tcp.metadataexchange.config.MetadataExchange",
}

// GeneratorGRPC is MetadataGenerator's value for a proxyless gRPC
// application, which gets the configuration flavour grpc-go accepts
// (Istio: the "grpc" generator its grpc-agent template sets).
const GeneratorGRPC = "grpc"

// Traffic capture: where the agent's rules send a pod's traffic and where
// discovery's sidecar listeners take it.
const (
	// OutboundCapturePort is the virtualOutbound listener's (Istio:
	// ProxyConfig.proxyListenPort, istio-iptables' -p).
	OutboundCapturePort = 15001
	// InboundCapturePort is the virtualInbound listener's (Istio:
	// ProxyConfig.proxyInboundListenPort, istio-iptables' -z).
	InboundCapturePort = 15006
	// ProxyUID and ProxyGID are the user and group the proxy runs as,
	// whose traffic the capture rules let through (Istio: the sidecar's
	// runAsUser, istio-iptables' -u and -g). An application running as
	// that user is not captured (istioctl analyze: IST0144).
	ProxyUID = 1337
	ProxyGID = 1337
	// InboundPassthroughSource is the address Envoy sends inbound
	// passthrough connections from, which the capture rules let through
	// uncaptured (Istio: InboundPassthroughBindIpv4);
	// InboundPassthroughSource6 is its IPv6 twin
	// (InboundPassthroughBindIpv6).
	InboundPassthroughSource  = "127.0.0.6"
	InboundPassthroughSource6 = "::6"
)

// The sidecar's listeners the capture ports belong to (Istio:
// model.VirtualOutboundListenerName, model.VirtualInboundListenerName).
const (
	VirtualOutbound = "virtualOutbound"
	VirtualInbound  = "virtualInbound"
)

// SDS: the cluster the agent's Envoy bootstrap defines for the agent's SDS
// socket, which discovery's TLS contexts name as their secrets' source,
// and the secrets the agent serves on it (Istio: SDSClusterName,
// security.WorkloadKeyCertResourceName, security.RootCertReqResourceName).
const (
	SDSCluster     = "sds-grpc"
	SecretWorkload = "default"
	SecretRoot     = "ROOTCA"
)

// AccessLogServiceCluster is the bootstrap's cluster to the proxy config's
// envoyAccessLogService, which the access logs of the mesh's
// enableEnvoyAccessLogService send to (Istio: EnvoyAccessLogCluster).
const AccessLogServiceCluster = "envoy_accesslog_service"

// Proxyless gRPC: the names the agent's gRPC xDS bootstrap gives and
// discovery's proxyless resources use.
const (
	// GRPCCertProvider is the bootstrap's one certificate provider
	// instance (a file_watcher over the agent's certificate files), which
	// discovery's TLS contexts name (Istio:
	// grpcxds.FileWatcherCertProviderName).
	GRPCCertProvider = "default"
	// GRPCInboundListenerPrefix starts a proxyless server's listener name:
	// the bootstrap's server_listener_resource_name_template is
	// GRPCInboundListenerPrefix+"%s", which grpc-go fills with the address
	// it listens on (Istio: grpcxds.ServerListenerNamePrefix).
	GRPCInboundListenerPrefix = "xds.istio.io/grpc/lds/inbound/"
)

// Traffic directions, the first part of a cluster name (Istio:
// model.TrafficDirectionInbound, model.TrafficDirectionOutbound).
const (
	Inbound  = "inbound"
	Outbound = "outbound"
)

// clusterNameSeparator separates a cluster name's parts.
const clusterNameSeparator = "|"

// ClusterName is Istio's cluster name, direction|port|subset|host:
// "outbound|80|v1|reviews.default.svc.cluster.local", "inbound|8080||"
// (Istio: model.BuildSubsetKey).
func ClusterName(direction string, port uint32, subset, host string) string {
	return direction + clusterNameSeparator + strconv.FormatUint(uint64(port), 10) +
		clusterNameSeparator + subset + clusterNameSeparator + host
}

// ParseClusterName splits a ClusterName; ok is false for any other name
// (Istio: model.ParseSubsetKey).
func ParseClusterName(name string) (direction string, port uint32, subset, host string, ok bool) {
	parts := strings.Split(name, clusterNameSeparator)
	if len(parts) != 4 || (parts[0] != Inbound && parts[0] != Outbound) {
		return "", 0, "", "", false
	}
	n, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return "", 0, "", "", false
	}
	return parts[0], uint32(n), parts[2], parts[3], true
}

// The keys of a Wasm module's VM environment through which discovery tells
// the agent how to fetch the module, which the agent removes (with every
// other ISTIO_META_ key) before Envoy sees the configuration (Istio's
// WasmSecretEnv, WasmPolicyEnv, WasmResourceVersionEnv): the registry
// credentials (a dockerconfigjson; present and empty when the named
// Secret could not be given), the pull policy (IfNotPresent or Always)
// and the WasmPlugin's version (under Always, a new one pulls again).
const (
	WasmPullSecretEnv      = "ISTIO_META_WASM_IMAGE_PULL_SECRET" //nolint:gosec // the variable's name, not a credential
	WasmPullPolicyEnv      = "ISTIO_META_WASM_IMAGE_PULL_POLICY"
	WasmResourceVersionEnv = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"
	WasmMetaPrefix         = "ISTIO_META_"
)

// WasmNoDigest stands for a remote module's sha256 when the extension
// gives none (Envoy's remote data source requires one): the agent reads
// it as none (Istio's "nil").
const WasmNoDigest = "nil"

// PrometheusScrapeEnv carries the application's Prometheus scrape
// settings (PrometheusScrape, as JSON) from the injector, which moved
// them off the pod's prometheus.io annotations, to the agent, which
// serves the application's metrics merged into its /stats/prometheus
// (Istio: ISTIO_PROMETHEUS_ANNOTATIONS).
const PrometheusScrapeEnv = "ISTIO_PROMETHEUS_ANNOTATIONS"

// PrometheusScrape is the application's scrape settings, as Istio's
// PrometheusScrapeConfiguration (its JSON names).
type PrometheusScrape struct {
	Scrape string `json:"scrape"`
	Path   string `json:"path"`
	Port   string `json:"port"`
}

// ValidInterfaceName says whether name may name a network interface in
// the capture rules (the injector's annotations, the agent's flags):
// 1 to 15 bytes (Linux's bound) of letters, digits, '.', '_', '-' and
// '@', which also travel safely in iptables-restore's text.
func ValidInterfaceName(name string) bool {
	if len(name) == 0 || len(name) > 15 {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-', c == '@':
		default:
			return false
		}
	}
	return true
}
