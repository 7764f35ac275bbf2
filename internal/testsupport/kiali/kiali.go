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
