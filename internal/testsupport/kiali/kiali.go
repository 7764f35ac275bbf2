// Package kiali holds what Kiali decodes from istiod, copied from
// Kiali's source (github.com/kiali/kiali at d733a096, v2.31 development;
// unchanged since v2.0), so that tests check Flotilla's answers against
// the shapes Kiali reads and the way it judges them.
package kiali

// ProxyStatus is one proxy of istiod's /debug/syncz as Kiali decodes it
// (kubernetes/types.go ProxyStatus); Pilot is the pod Kiali asked.
type ProxyStatus struct {
	Pilot string
	SyncStatus
}

// SyncStatus is kubernetes/types.go SyncStatus.
type SyncStatus struct {
	ClusterID     string `json:"cluster_id,omitempty"`
	ProxyID       string `json:"proxy,omitempty"`
	ProxyVersion  string `json:"proxy_version,omitempty"`
	IstioVersion  string `json:"istio_version,omitempty"`
	ClusterSent   string `json:"cluster_sent,omitempty"`
	ClusterAcked  string `json:"cluster_acked,omitempty"`
	ListenerSent  string `json:"listener_sent,omitempty"`
	ListenerAcked string `json:"listener_acked,omitempty"`
	RouteSent     string `json:"route_sent,omitempty"`
	RouteAcked    string `json:"route_acked,omitempty"`
	EndpointSent  string `json:"endpoint_sent,omitempty"`
	EndpointAcked string `json:"endpoint_acked,omitempty"`
}

// XDSStatus is how Kiali judges one sent/acked pair
// (business/proxy_status.go xdsStatus).
func XDSStatus(sent, acked string) string {
	switch {
	case sent == "":
		return "NOT_SENT"
	case sent == acked:
		return "Synced"
	case acked == "":
		return "Stale (Never Acknowledged)"
	}
	return "Stale"
}

// Synced reports whether Kiali shows every type of p Synced.
func Synced(p *ProxyStatus) bool {
	for _, pair := range [][2]string{{p.ClusterSent, p.ClusterAcked}, {p.ListenerSent, p.ListenerAcked}, {p.RouteSent, p.RouteAcked}, {p.EndpointSent, p.EndpointAcked}} {
		if XDSStatus(pair[0], pair[1]) != "Synced" {
			return false
		}
	}
	return true
}

// RegistryService is one service of istiod's /debug/registryz as Kiali
// 2.0–2.22 decodes it (kubernetes/types.go RegistryService and
// IstioService at v2.22.0, 1ee21d63; Kiali 2.23 stopped reading it).
type RegistryService struct {
	Pilot string
	IstioService
}

// IstioService is kubernetes/types.go IstioService at v2.22.0.
type IstioService struct {
	Attributes struct {
		ServiceRegistry string              `json:"ServiceRegistry,omitempty"`
		Name            string              `json:"Name,omitempty"`
		Namespace       string              `json:"Namespace,omitempty"`
		Labels          map[string]string   `json:"Labels,omitempty"`
		ExportTo        map[string]struct{} `json:"ExportTo,omitempty"`
		LabelSelectors  map[string]string   `json:"LabelSelectors,omitempty"`
	} `json:"Attributes,omitempty"`
	Ports []struct {
		Name     string `json:"name,omitempty"`
		Port     int    `json:"port"`
		Protocol string `json:"protocol,omitempty"`
	} `json:"ports"`
	Hostname        string            `json:"hostname"`
	ResourceVersion string            `json:"ResourceVersion"`
	ClusterVIPs11   map[string]string `json:"cluster-vips,omitempty"`
	ClusterVIPs12   struct {
		Addresses map[string][]string `json:"Addresses,omitempty"`
	} `json:"clusterVIPs,omitempty"`
}

// KeptForCluster says whether Kiali keeps a registry service when it
// reads cluster (business filterIstioServiceByClusterId): a Kubernetes
// service only with addresses in that cluster, unless the cluster is
// "Kubernetes".
func KeptForCluster(s *RegistryService, cluster string) bool {
	if s.Attributes.ServiceRegistry != "Kubernetes" || cluster == "Kubernetes" {
		return true
	}
	if _, ok := s.ClusterVIPs12.Addresses[cluster]; ok {
		return true
	}
	_, ok := s.ClusterVIPs11[cluster]
	return ok
}
