package model

import (
	"net/netip"
	"strconv"
	"sync/atomic"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// ProxyType is what kind of proxy connects.
type ProxyType string

// Proxy types, as in Istio's node IDs.
const (
	SidecarProxy ProxyType = proxycontract.Sidecar
	RouterProxy  ProxyType = proxycontract.Router // gateways
)

// GeneratorGRPC marks proxyless gRPC clients (GENERATOR=grpc), which get
// the configuration flavour grpc-go accepts.
const GeneratorGRPC = proxycontract.GeneratorGRPC

// Proxy is a connected proxy's identity, as its node ID and metadata
// describe it (proxycontract.NodeID and the proxycontract.Metadata keys).
type Proxy struct {
	Type ProxyType
	// IPs are the workload's addresses, the node ID's first.
	IPs []netip.Addr
	// ID is the node ID's third part, "pod.namespace" for sidecars.
	ID string
	// DNSDomain is the node ID's fourth part, e.g. "default.svc.cluster.local".
	DNSDomain      string
	Namespace      string
	Labels         map[string]string
	IstioVersion   string
	ClusterID      string
	ServiceAccount string
	// IstioTelemetry: the proxy's Envoy has Istio's stats and
	// peer-metadata filters (its node lists their extensions,
	// proxycontract.IstioTelemetryTypeURLs).
	IstioTelemetry bool
	// MeshID is the mesh the proxy says it is in (MESH_ID); empty when
	// it does not say.
	MeshID string
	// ServiceCluster is the node's cluster field: the name its spans
	// give the workload (Istio's service cluster, "app.namespace").
	ServiceCluster string
	// Metadata holds the node metadata's string fields (Istio's
	// Metadata.Raw, which EnvoyFilter proxy matches read), as far as the
	// node's limits keep them.
	Metadata map[string]string
	// Generator is "grpc" for proxyless gRPC clients, else empty.
	Generator string
	// ProxyConfig is the proxy config the proxy says it has
	// (PROXY_CONFIG); nil when it says none, and the mesh's defaultConfig
	// applies (EffectiveProxyConfig).
	ProxyConfig *meshv1alpha1.ProxyConfig
	// Locality is where the proxy says it runs (the node's locality in
	// its bootstrap); empty when it does not say.
	Locality Locality
	// VerifiedNamespace and VerifiedServiceAccount are the SPIFFE
	// identity of the proxy's verified client certificate: empty on a
	// connection without one. Only such a proxy gets its namespace's
	// credentials (SDS).
	VerifiedNamespace, VerifiedServiceAccount string
	// secretsRefused says why the proxy's service account may not read
	// its namespace's Secrets (SetSecretsRefused).
	secretsRefused atomic.Pointer[string]
}

// SetSecretsRefused records why the proxy's service account may not read
// its namespace's Secrets, so it gets no credentials (Istio's pilot asks
// with a SubjectAccessReview; discovery asks galley before it builds
// them); "" when it may. Safe while a generator reads it.
func (p *Proxy) SetSecretsRefused(reason string) { p.secretsRefused.Store(&reason) }

// SecretsRefused is why the proxy may not have its credentials; "": it may.
func (p *Proxy) SecretsRefused() string {
	if r := p.secretsRefused.Load(); r != nil {
		return *r
	}
	return ""
}

// Locality is a region/zone/subzone.
type Locality struct{ Region, Zone, Subzone string }

// IsZero reports whether no part is set.
func (l Locality) IsZero() bool { return l == Locality{} }

// String is "region/zone/subzone", Istio's locality label form.
func (l Locality) String() string { return l.Region + "/" + l.Zone + "/" + l.Subzone }

// ProxylessGRPC reports whether the proxy is a proxyless gRPC client.
func (p *Proxy) ProxylessGRPC() bool { return p.Generator == GeneratorGRPC }

// CapturesDNS reports whether the proxy's agent answers its DNS (node
// metadata DNS_CAPTURE, from ISTIO_META_DNS_CAPTURE, read as Istio's
// StringBool): its workload then resolves a ServiceEntry host without
// addresses to the addresses allocated to it, which the proxy listens on
// (Istio's nodeUsesAutoallocatedIPs; allocation itself is galley's
// choice, on unless turned off).
func (p *Proxy) CapturesDNS() bool {
	b, _ := strconv.ParseBool(p.Metadata[proxycontract.MetadataDNSCapture])
	return b
}

// EffectiveProxyConfig is the proxy's proxy config, else the mesh's
// defaultConfig (Istio's ProxyConfigOrDefault: the two are not merged
// here, the agent sends the merged one).
func (p *Proxy) EffectiveProxyConfig(mesh *meshv1alpha1.MeshConfig) *meshv1alpha1.ProxyConfig {
	if p.ProxyConfig != nil {
		return p.ProxyConfig
	}
	return mesh.GetDefaultConfig()
}
