package translate

import (
	networking "istio.io/api/networking/v1alpha3"
)

// policy is the traffic policy in force for one cluster: the
// DestinationRule's top-level policy, overridden by its port-level settings
// for the port, then by the subset's policy and the subset's port-level
// settings. As in Istio, each of load balancer, connection pool, outlier
// detection and TLS is replaced whole by a more specific one.
type policy struct {
	lb      *networking.LoadBalancerSettings
	pool    *networking.ConnectionPoolSettings
	outlier *networking.OutlierDetection
	tls     *networking.ClientTLSSettings
}

func effectivePolicy(top, subset *networking.TrafficPolicy, port uint32) policy {
	var p policy
	p.apply(top, port)
	p.apply(subset, port)
	return p
}

func (p *policy) apply(tp *networking.TrafficPolicy, port uint32) {
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

func (p *policy) set(lb *networking.LoadBalancerSettings, pool *networking.ConnectionPoolSettings, od *networking.OutlierDetection, tls *networking.ClientTLSSettings) {
	if lb != nil {
		p.lb = lb
	}
	if pool != nil {
		p.pool = pool
	}
	if od != nil {
		p.outlier = od
	}
	if tls != nil {
		p.tls = tls
	}
}
