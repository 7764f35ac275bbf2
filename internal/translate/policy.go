package translate

import (
	networking "istio.io/api/networking/v1alpha3"
)

// ClusterPolicy is the DestinationRule traffic policy in force for one
// outbound cluster (one port of a service, maybe one subset). A nil field
// means the DestinationRule says nothing of it, and the cluster keeps
// Flotilla's default.
type ClusterPolicy struct {
	LoadBalancer     *networking.LoadBalancerSettings
	ConnectionPool   *networking.ConnectionPoolSettings
	OutlierDetection *networking.OutlierDetection
	TLS              *networking.ClientTLSSettings
}

// EffectivePolicy is the policy a DestinationRule (dr may be nil) gives
// the cluster of port and subset (empty: the service's cluster):
// the top-level trafficPolicy, then its portLevelSettings for port, then
// the subset's trafficPolicy, then the subset's portLevelSettings for
// port. Each of load balancer, connection pool, outlier detection and TLS
// is replaced whole by a more specific one that sets it, and kept from the
// level above when the more specific one does not. (Istio's
// MergeTrafficPolicy differs for port-level settings, which it applies
// without inheriting; issue 15 brings that rule here.)
func EffectivePolicy(dr *networking.DestinationRule, subset string, port uint32) ClusterPolicy {
	var p ClusterPolicy
	p.apply(dr.GetTrafficPolicy(), port)
	for _, ss := range dr.GetSubsets() {
		if ss.GetName() == subset && subset != "" {
			p.apply(ss.GetTrafficPolicy(), port)
			break
		}
	}
	return p
}

func (p *ClusterPolicy) apply(tp *networking.TrafficPolicy, port uint32) {
	if tp == nil {
		return
	}
	p.set(tp.GetLoadBalancer(), tp.GetConnectionPool(), tp.GetOutlierDetection(), tp.GetTls())
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			p.set(pl.GetLoadBalancer(), pl.GetConnectionPool(), pl.GetOutlierDetection(), pl.GetTls())
		}
	}
}

func (p *ClusterPolicy) set(lb *networking.LoadBalancerSettings, pool *networking.ConnectionPoolSettings, od *networking.OutlierDetection, tls *networking.ClientTLSSettings) {
	if lb != nil {
		p.LoadBalancer = lb
	}
	if pool != nil {
		p.ConnectionPool = pool
	}
	if od != nil {
		p.OutlierDetection = od
	}
	if tls != nil {
		p.TLS = tls
	}
}
