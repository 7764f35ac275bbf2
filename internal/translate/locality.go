package translate

import (
	"cmp"
	"math"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Labels Istio adds to every workload's labels from where it runs
// (AugmentLabels), which failoverPriority may name.
const (
	labelRegion   = "topology.kubernetes.io/region"
	labelZone     = "topology.kubernetes.io/zone"
	labelSubzone  = "topology.istio.io/subzone"
	labelNetwork  = "topology.istio.io/network"
	labelHostname = "kubernetes.io/hostname"
)

// localitySetting is the locality load-balancing setting in force for a
// cluster, as Istio's GetEffectiveLbSetting: the DestinationRule's
// (after port-level and subset merging), else the mesh's, else Istio's
// default mesh setting {enabled: true}; nil when one of them is
// explicitly disabled.
func (g *gen) localitySetting(lb *networking.LoadBalancerSettings) *networking.LocalityLoadBalancerSetting {
	s := lb.GetLocalityLbSetting()
	if s == nil {
		s = g.pc.Mesh.GetLocalityLbSetting()
	}
	if s == nil {
		if g.defaultLocalityLB == nil {
			g.defaultLocalityLB = &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)}
		}
		return g.defaultLocalityLB
	}
	if e := s.GetEnabled(); e != nil && !e.GetValue() {
		return nil
	}
	return s
}

// localityApplies reports whether the setting changes a cluster's load
// assignment: a distribution always, failover only when the cluster has
// outlier detection (without it Envoy never drops to a lower priority,
// Istio's rule in LocalityLBSettings.ApplyToCluster).
func localityApplies(s *networking.LocalityLoadBalancerSetting, c *clusterv3.Cluster) bool {
	return s != nil && (len(s.GetDistribute()) > 0 || c.GetOutlierDetection() != nil)
}

// localityLbConfig turns on Envoy's locality-weighted balancing where
// Istio does: with a distribution, or with failover settings in force.
func localityLbConfig(c *clusterv3.Cluster, s *networking.LocalityLoadBalancerSetting) {
	if s == nil {
		return
	}
	failover := c.GetOutlierDetection() != nil && (len(s.GetFailover()) > 0 || len(s.GetFailoverPriority()) > 0)
	if len(s.GetDistribute()) == 0 && !failover {
		return
	}
	if c.CommonLbConfig == nil {
		c.CommonLbConfig = &clusterv3.Cluster_CommonLbConfig{}
	}
	c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
		LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
	}
}

// proxyLocality is where the proxy runs: what its node says, else the
// locality of its own workload's endpoint (Istio's initializeProxy).
func (g *gen) proxyLocality() model.Locality {
	if g.locality != nil {
		return *g.locality
	}
	l := g.p.Locality
	if l.IsZero() {
		for _, in := range g.pc.Instances(g.p) {
			if el := in.Endpoint.GetLocality(); el != nil {
				l = model.Locality{Region: el.GetRegion(), Zone: el.GetZone(), Subzone: el.GetSubzone()}
				break
			}
		}
	}
	g.locality = &l
	return l
}

// proxyLabel is a label of the proxy's workload, with Istio's topology
// labels taken from where it runs.
func (g *gen) proxyLabel(name string) string {
	l := g.proxyLocality()
	switch name {
	case labelRegion:
		return cmp.Or(l.Region, g.p.Labels[name])
	case labelZone:
		return cmp.Or(l.Zone, g.p.Labels[name])
	case labelSubzone:
		return cmp.Or(l.Subzone, g.p.Labels[name])
	case labelHostname:
		for _, in := range g.pc.Instances(g.p) {
			if n := in.Endpoint.GetNodeName(); n != "" {
				return n
			}
		}
	}
	return g.p.Labels[name]
}

// endpointLabel is an endpoint's label, with Istio's topology labels
// taken from its locality, network and node.
func endpointLabel(ep *registryv1.Endpoint, name string) string {
	l := ep.GetLocality()
	switch name {
	case labelRegion:
		return cmp.Or(l.GetRegion(), ep.GetLabels()[name])
	case labelZone:
		return cmp.Or(l.GetZone(), ep.GetLabels()[name])
	case labelSubzone:
		return cmp.Or(l.GetSubzone(), ep.GetLabels()[name])
	case labelNetwork:
		return cmp.Or(ep.GetNetwork(), ep.GetLabels()[name])
	case labelHostname:
		return cmp.Or(ep.GetNodeName(), ep.GetLabels()[name])
	}
	return ep.GetLabels()[name]
}

// localityKey names what a load assignment shaped by the setting depends
// on for this proxy: its locality, and its values of the failoverPriority
// labels. Proxies with the same key share the assignment.
func (g *gen) localityKey(s *networking.LocalityLoadBalancerSetting) string {
	if len(s.GetFailoverPriority()) == 0 {
		if g.localityStr == "" {
			g.localityStr = g.proxyLocality().String()
		}
		return g.localityStr
	}
	var b strings.Builder
	b.WriteString(g.proxyLocality().String())
	for _, fp := range s.GetFailoverPriority() {
		name, _, _ := strings.Cut(fp, "=")
		b.WriteString("|" + g.proxyLabel(name))
	}
	return b.String()
}

// failoverPriority is an endpoint's priority under failoverPriority, as
// Istio's applyFailoverPriorityPerLocality: 0 when it agrees with the
// proxy on every label, else the fewer leading labels it agrees on, the
// lower; a label written "name=value" compares with that value instead
// of the proxy's; a first label topology.istio.io/network that differs
// puts the endpoint below all others but is otherwise skipped.
func (g *gen) failoverPriority(ep *registryv1.Endpoint, labels []string) uint32 {
	n := len(labels)
	adjust, prio := 0, 0
	for j, fp := range labels {
		name, want, override := strings.Cut(fp, "=")
		if !override {
			want = g.proxyLabel(name)
		}
		if want == endpointLabel(ep, name) {
			continue
		}
		if j == 0 && name == labelNetwork {
			adjust = n
			continue
		}
		prio = n - j
		break
	}
	return uint32(prio + adjust) //nolint:gosec // at most twice the number of labels
}

// applyLocality shapes a load assignment for the proxy's locality, as
// Istio's ApplyLocalityLoadBalancer: a distribution sets each locality's
// share of traffic (localities it leaves out get none); otherwise, with
// failover in force, localities are ordered by how close they are (same
// subzone 0, zone 1, region 2, other regions 3, and 4 for regions other
// than a failover rule's "to"), under the failoverPriority priority when
// there is one. Priorities are renumbered 0..N without gaps.
func (g *gen) applyLocality(la *endpointv3.ClusterLoadAssignment, s *networking.LocalityLoadBalancerSetting, failover bool) {
	proxy := g.proxyLocality()
	if d := s.GetDistribute(); len(d) > 0 {
		distribute(la, proxy, d)
		return
	}
	if !failover {
		return
	}
	if len(s.GetFailoverPriority()) > 0 && len(s.GetFailover()) == 0 {
		compactPriorities(la)
		return // the failoverPriority priorities alone
	}
	for _, grp := range la.GetEndpoints() {
		l := grp.GetLocality()
		prio := uint32(3)
		switch {
		case l.GetRegion() == proxy.Region && l.GetZone() == proxy.Zone && l.GetSubZone() == proxy.Subzone:
			prio = 0
		case l.GetRegion() == proxy.Region && l.GetZone() == proxy.Zone:
			prio = 1
		case l.GetRegion() == proxy.Region:
			prio = 2
		default:
			for _, f := range s.GetFailover() {
				if f.GetFrom() == proxy.Region {
					if l.GetRegion() != f.GetTo() {
						prio = 4
					}
					break
				}
			}
		}
		grp.Priority = grp.GetPriority()*5 + prio
	}
	compactPriorities(la)
}

// distribute applies the first rule whose "from" matches the proxy: each
// "to" pattern's weight is shared by the localities it matches in
// proportion to their own weights (rounded up), and localities no "to"
// matches are left out.
func distribute(la *endpointv3.ClusterLoadAssignment, proxy model.Locality, rules []*networking.LocalityLoadBalancerSetting_Distribute) {
	for _, rule := range rules {
		if !localityMatch(proxy, rule.GetFrom()) {
			continue
		}
		matched := make([]bool, len(la.GetEndpoints()))
		tos := make([]string, 0, len(rule.GetTo()))
		for to := range rule.GetTo() {
			tos = append(tos, to)
		}
		slices.Sort(tos) // a group goes to the first pattern, in a stable order
		for _, to := range tos {
			weight := rule.GetTo()[to]
			var idx []int
			total := uint32(0)
			for i, grp := range la.GetEndpoints() {
				l := grp.GetLocality()
				if matched[i] || !localityMatch(model.Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubZone()}, to) {
					continue
				}
				matched[i] = true
				idx = append(idx, i)
				total += max(grp.GetLoadBalancingWeight().GetValue(), 1)
			}
			for _, i := range idx {
				grp := la.GetEndpoints()[i]
				if w := math.Ceil(float64(max(grp.GetLoadBalancingWeight().GetValue(), 1)*weight) / float64(total)); w > 0 {
					grp.LoadBalancingWeight = wrapperspb.UInt32(uint32(w))
				}
			}
		}
		kept := la.Endpoints[:0]
		for i, grp := range la.GetEndpoints() {
			if matched[i] {
				kept = append(kept, grp)
			}
		}
		la.Endpoints = kept
		return
	}
}

// localityMatch is Istio's LocalityMatch: "region/zone/subzone" where
// "*" matches anything and missing parts match any.
func localityMatch(l model.Locality, pattern string) bool {
	parts := append(strings.SplitN(pattern, "/", 3), "", "")
	ok := func(rule, v string, optional bool) bool { return rule == "*" || (optional && rule == "") || rule == v }
	return ok(parts[0], l.Region, false) && ok(parts[1], l.Zone, true) && ok(parts[2], l.Subzone, true)
}

// compactPriorities renumbers priorities 0..N in order, without gaps
// (Envoy requires them contiguous), and sorts the groups by priority.
func compactPriorities(la *endpointv3.ClusterLoadAssignment) {
	var seen []uint32
	for _, grp := range la.GetEndpoints() {
		if !slices.Contains(seen, grp.GetPriority()) {
			seen = append(seen, grp.GetPriority())
		}
	}
	slices.Sort(seen)
	for _, grp := range la.GetEndpoints() {
		grp.Priority = uint32(slices.Index(seen, grp.GetPriority())) //nolint:gosec // fewer than the groups
	}
	slices.SortStableFunc(la.Endpoints, func(a, b *endpointv3.LocalityLbEndpoints) int {
		return int(a.GetPriority()) - int(b.GetPriority())
	})
}
