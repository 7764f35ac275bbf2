package translate

import (
	"cmp"

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
	// Top level only: a port-level entry has none of these, and leaves
	// them out (Istio's shadowCopyPortTrafficPolicy).
	ProxyProtocol *networking.TrafficPolicy_ProxyProtocol
	Tunnel        *networking.TrafficPolicy_TunnelSettings
	RetryBudget   *networking.TrafficPolicy_RetryBudget
}

// EffectivePolicy is the policy a DestinationRule (dr may be nil) gives
// the cluster of port and subset (empty: the service's cluster), by
// Istio's rules (util.MergeSubsetTrafficPolicy, GetPortLevelTrafficPolicy):
//
//   - the destination's policy is its portLevelSettings entry for port when
//     there is one — whole: a field the port level leaves out takes its
//     default, it is not inherited from the top level — else its
//     top-level trafficPolicy;
//   - a subset's policy is likewise its own port-level entry, else its
//     top level. It overrides the destination's field by field where it
//     sets a field; a subset port-level entry replaces the four fields a
//     port level has, set or not.
func EffectivePolicy(dr *networking.DestinationRule, subset string, port uint32) ClusterPolicy {
	p, _ := portLevel(dr.GetTrafficPolicy(), port)
	if subset == "" {
		return p
	}
	for _, ss := range dr.GetSubsets() {
		if ss.GetName() != subset || ss.GetTrafficPolicy() == nil {
			continue
		}
		sp, hasPortLevel := portLevel(ss.GetTrafficPolicy(), port)
		if sp.LoadBalancer != nil || hasPortLevel {
			p.LoadBalancer = sp.LoadBalancer
		}
		if sp.ConnectionPool != nil || hasPortLevel {
			p.ConnectionPool = sp.ConnectionPool
		}
		if sp.OutlierDetection != nil || hasPortLevel {
			p.OutlierDetection = sp.OutlierDetection
		}
		if sp.TLS != nil || hasPortLevel {
			p.TLS = sp.TLS
		}
		// Set only where the subset sets them (Istio's MergeTrafficPolicy).
		p.ProxyProtocol = cmp.Or(sp.ProxyProtocol, p.ProxyProtocol)
		p.Tunnel = cmp.Or(sp.Tunnel, p.Tunnel)
		p.RetryBudget = cmp.Or(sp.RetryBudget, p.RetryBudget)
		break
	}
	return p
}

// portLevel is tp's port-level entry for port (and true), else tp's top
// level.
func portLevel(tp *networking.TrafficPolicy, port uint32) (ClusterPolicy, bool) {
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			return ClusterPolicy{LoadBalancer: pl.GetLoadBalancer(), ConnectionPool: pl.GetConnectionPool(), OutlierDetection: pl.GetOutlierDetection(), TLS: pl.GetTls()}, true
		}
	}
	return ClusterPolicy{
		LoadBalancer: tp.GetLoadBalancer(), ConnectionPool: tp.GetConnectionPool(), OutlierDetection: tp.GetOutlierDetection(), TLS: tp.GetTls(),
		ProxyProtocol: tp.GetProxyProtocol(), Tunnel: tp.GetTunnel(), RetryBudget: tp.GetRetryBudget(),
	}, false
}
