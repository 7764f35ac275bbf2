// Package istiod answers what Istio's tools (Kiali) read from istiod's
// HTTP ports, in istiod's JSON shapes, from a discovery replica's own
// state: its proxies' sync state (/debug/syncz) and its registry
// (/debug/registryz). Pure: the app serves them.
package istiod

import (
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// SynczPath is where a discovery replica serves, on its admin port
// (15014, istiod's monitoring port) and its istiod HTTP port (8080), its
// proxies' sync state as istiod's /debug/syncz: a JSON list of
// SyncStatus. Kiali reads it from every istiod pod through a
// port-forward and merges the lists; as istiod's, it is served to
// loopback clients (where a port-forward arrives) only.
const SynczPath = "/debug/syncz"

// RegistryzPath is where a replica serves, beside SynczPath
// and as istiod's /debug/registryz, the services of its registry: a JSON
// list of Service (Kiali up to 2.22 reads it).
const RegistryzPath = "/debug/registryz"

// Service is one service as istiod's /debug/registryz lists it
// (Istio's model.Service as JSON), with the fields Istio's tools read.
type Service struct {
	Attributes ServiceAttributes `json:"Attributes"`
	Ports      []Port            `json:"ports,omitempty"`
	Hostname   string            `json:"hostname"`
	// ClusterVIPs are the service's addresses by cluster.
	ClusterVIPs struct {
		Addresses map[string][]string `json:"Addresses,omitempty"`
	} `json:"clusterVIPs"`
	MeshExternal    bool   `json:"MeshExternal"`
	ResourceVersion string `json:"ResourceVersion"`
	// AutoAllocatedIPv4Address and AutoAllocatedIPv6Address are the
	// addresses allocated to a ServiceEntry host without any.
	AutoAllocatedIPv4Address string `json:"autoAllocatedIPv4Address,omitempty"`
	AutoAllocatedIPv6Address string `json:"autoAllocatedIPv6Address,omitempty"`
}

// ServiceAttributes are Istio's model.ServiceAttributes as JSON:
// ServiceRegistry is "Kubernetes" for a Kubernetes Service, "External"
// for a ServiceEntry; ExportTo a set (an object of namespaces, "*" and
// "." among them).
type ServiceAttributes struct {
	ServiceRegistry string              `json:"ServiceRegistry"`
	Name            string              `json:"Name"`
	Namespace       string              `json:"Namespace"`
	Labels          map[string]string   `json:"Labels,omitempty"`
	ExportTo        map[string]struct{} `json:"ExportTo,omitempty"`
	LabelSelectors  map[string]string   `json:"LabelSelectors,omitempty"`
}

// Port is Istio's model.Port as JSON: the protocol by Istio's name.
type Port struct {
	Name     string `json:"name,omitempty"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// Registryz is services as istiod's /debug/registryz lists them;
// a service's addresses are in its cluster (defaultCluster when it names
// none).
func Registryz(services []*registryv1.Service, defaultCluster string) []Service {
	out := make([]Service, 0, len(services))
	for _, svc := range services {
		s := Service{
			Hostname:     svc.GetHostname(),
			MeshExternal: svc.GetLocation() == registryv1.Location_LOCATION_MESH_EXTERNAL,
			Attributes: ServiceAttributes{
				ServiceRegistry: "Kubernetes", Name: svc.GetName(), Namespace: svc.GetNamespace(),
				Labels: svc.GetLabels(), LabelSelectors: svc.GetSelector(),
			},
		}
		if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY {
			s.Attributes.ServiceRegistry = "External"
		}
		for _, e := range svc.GetExportTo() {
			if s.Attributes.ExportTo == nil {
				s.Attributes.ExportTo = map[string]struct{}{}
			}
			s.Attributes.ExportTo[e] = struct{}{}
		}
		for _, p := range svc.GetPorts() {
			s.Ports = append(s.Ports, Port{Name: p.GetName(), Port: int(p.GetNumber()), Protocol: registry.ProtocolName(p.GetProtocol())})
		}
		if len(svc.GetAddresses()) > 0 {
			cluster := svc.GetClusterId()
			if cluster == "" {
				cluster = defaultCluster
			}
			s.ClusterVIPs.Addresses = map[string][]string{cluster: svc.GetAddresses()}
		}
		for _, a := range svc.GetAutoAllocatedAddresses() {
			if strings.Contains(a, ":") {
				s.AutoAllocatedIPv6Address = a
			} else {
				s.AutoAllocatedIPv4Address = a
			}
		}
		out = append(out, s)
	}
	return out
}

// SyncStatus is one proxy as istiod's /debug/syncz lists it
// (Istio's xds.SyncStatus): for each of CDS, LDS, RDS, EDS and ECDS what
// was sent and what was acknowledged, equal when the proxy holds the
// last response. Istio gives nonces; a replica gives versions, the same
// when the proxy took the latest response (a resumed proxy holding the
// current configuration included), different or the acknowledgement
// empty when it did not. Kiali reads proxy (pod.namespace), cluster_id
// and the sent/acked pairs.
type SyncStatus struct {
	ClusterID            string                    `json:"cluster_id,omitempty"`
	ProxyID              string                    `json:"proxy,omitempty"`
	ProxyType            string                    `json:"proxy_type,omitempty"`
	ProxyVersion         string                    `json:"proxy_version,omitempty"`
	IstioVersion         string                    `json:"istio_version,omitempty"`
	ClusterSent          string                    `json:"cluster_sent,omitempty"`
	ClusterAcked         string                    `json:"cluster_acked,omitempty"`
	ListenerSent         string                    `json:"listener_sent,omitempty"`
	ListenerAcked        string                    `json:"listener_acked,omitempty"`
	RouteSent            string                    `json:"route_sent,omitempty"`
	RouteAcked           string                    `json:"route_acked,omitempty"`
	EndpointSent         string                    `json:"endpoint_sent,omitempty"`
	EndpointAcked        string                    `json:"endpoint_acked,omitempty"`
	ExtensionConfigSent  string                    `json:"extensionconfig_sent,omitempty"`
	ExtensionConfigAcked string                    `json:"extensionconfig_acked,omitempty"`
	Resources            map[string]ResourceStatus `json:"resources,omitempty"`
}

// ResourceStatus is one type of SyncStatus.Resources (Istio's
// xds.ResourceStatus): every type the proxy watches.
type ResourceStatus struct {
	Sent      string    `json:"sent,omitempty"`
	Acked     string    `json:"acked,omitempty"`
	SentTime  time.Time `json:"sentTime,omitzero"`
	LastError string    `json:"lastError,omitempty"`
}

// Syncz is proxies as istiod's /debug/syncz lists them.
func Syncz(proxies []debugapi.ProxySync) []SyncStatus {
	out := make([]SyncStatus, 0, len(proxies))
	for _, p := range proxies {
		s := SyncStatus{
			ClusterID: p.ClusterID, ProxyID: p.ID, ProxyType: p.ProxyType, IstioVersion: p.IstioVersion,
			Resources: make(map[string]ResourceStatus, len(p.Types)),
		}
		if n, ok := proxycontract.ParseNodeID(p.ID); ok && n.ID != "" {
			s.ProxyID = n.ID // pod.namespace, as Istio's Proxy.ID
		}
		for _, t := range p.Types {
			sent, acked := pair(t)
			s.Resources[t.TypeURL] = ResourceStatus{Sent: sent, Acked: acked, SentTime: t.SentAt, LastError: t.Nack}
			switch t.TypeURL {
			case resourcev3.ClusterType:
				s.ClusterSent, s.ClusterAcked = sent, acked
			case resourcev3.ListenerType:
				s.ListenerSent, s.ListenerAcked = sent, acked
			case resourcev3.RouteType:
				s.RouteSent, s.RouteAcked = sent, acked
			case resourcev3.EndpointType:
				s.EndpointSent, s.EndpointAcked = sent, acked
			case resourcev3.ExtensionConfigType:
				s.ExtensionConfigSent, s.ExtensionConfigAcked = sent, acked
			}
		}
		out = append(out, s)
	}
	return out
}

// pair is a type's sent and acknowledged, as istiod's tools read
// them: equal when SYNCED, sent empty when NOT SENT, the acknowledgement
// the older version (empty if none) otherwise.
func pair(t debugapi.TypeSync) (sent, acked string) {
	switch t.Status {
	case debugapi.Synced:
		v := t.SentVersion
		if v == "" {
			v = t.AckedVersion // resumed: nothing sent, the proxy holds it
		}
		return v, v
	case debugapi.NotSent:
		return "", ""
	default:
		if t.AckedVersion == t.SentVersion {
			// The same content sent again, not acknowledged yet: still
			// not SYNCED to a reader comparing the two.
			return t.SentVersion, ""
		}
		return t.SentVersion, t.AckedVersion
	}
}
