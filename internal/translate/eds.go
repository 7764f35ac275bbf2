package translate

import (
	"cmp"
	"net/netip"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// endpointPort is the port an endpoint serves a service port on.
func endpointPort(ep *registryv1.Endpoint, port *registryv1.ServicePort) (uint32, bool) {
	for _, ept := range ep.GetPorts() {
		if ept.GetServicePortName() == port.GetName() && ept.GetNumber() != 0 {
			return ept.GetNumber(), true
		}
	}
	if len(ep.GetPorts()) > 0 {
		return 0, false
	}
	// An endpoint that lists no ports serves on the target port.
	return cmp.Or(port.GetTargetPort(), port.GetNumber()), true
}

type localityGroup struct {
	priority              uint32
	region, zone, subzone string
}

// loadAssignment groups a service's endpoints for one port and subset by
// locality; a locality's weight is the sum of its endpoints' weights.
// Duplicate addresses are sent once (gRPC clients reject them), endpoints
// that are not IP addresses are left out (EDS takes addresses only). A
// locality setting (nil for none) then shapes it for the proxy's
// locality (applyLocality); failover says whether failover is in force;
// unhealthy whether unhealthy endpoints go too (marked so).
func (g *gen) loadAssignment(name string, svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset,
	loc *networking.LocalityLoadBalancerSetting, failover, unhealthy bool,
) *endpointv3.ClusterLoadAssignment {
	var prioLabels []string
	if failover && len(loc.GetDistribute()) == 0 {
		prioLabels = loc.GetFailoverPriority()
	}
	groups := map[localityGroup]*endpointv3.LocalityLbEndpoints{}
	seen := map[netip.AddrPort]bool{}
	for _, ep := range g.pc.Endpoints(svc) {
		if !model.LabelsMatch(ss.GetLabels(), ep.GetLabels()) {
			continue
		}
		if !unhealthy && ep.GetHealth() == registryv1.HealthStatus_HEALTH_STATUS_UNHEALTHY {
			continue
		}
		num, ok := endpointPort(ep, port)
		if !ok {
			continue
		}
		addr, err := netip.ParseAddr(ep.GetAddress())
		if err != nil {
			continue
		}
		ap := netip.AddrPortFrom(addr, uint16(num)) //nolint:gosec // ports are < 65536, validated by galley
		if seen[ap] {
			continue
		}
		seen[ap] = true
		l := ep.GetLocality()
		k := localityGroup{region: l.GetRegion(), zone: l.GetZone(), subzone: l.GetSubzone()}
		if len(prioLabels) > 0 {
			k.priority = g.failoverPriority(ep, prioLabels)
		}
		grp := groups[k]
		if grp == nil {
			// Always a locality, if an empty one: gRPC clients reject
			// locality groups without one.
			grp = &endpointv3.LocalityLbEndpoints{
				LoadBalancingWeight: wrapperspb.UInt32(0),
				Locality:            &corev3.Locality{Region: k.region, Zone: k.zone, SubZone: k.subzone},
				Priority:            k.priority,
			}
			groups[k] = grp
		}
		w := max(ep.GetWeight(), 1)
		grp.LoadBalancingWeight.Value += w
		grp.LbEndpoints = append(grp.LbEndpoints, lbEndpoint(socketAddress(addr.String(), num), w, health(ep.GetHealth()), g.endpointMetadata(ep)))
	}
	la := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	keys := make([]localityGroup, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b localityGroup) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(a.region, b.region), cmp.Compare(a.zone, b.zone), cmp.Compare(a.subzone, b.subzone))
	})
	for _, k := range keys {
		la.Endpoints = append(la.Endpoints, groups[k])
	}
	if loc != nil {
		g.applyLocality(la, loc, failover)
	}
	return la
}

// endpointMetadata marks endpoints with a sidecar for auto mTLS.
func (g *gen) endpointMetadata(ep *registryv1.Endpoint) *corev3.Metadata {
	if !g.client.envoyClusters || ep.GetTlsMode() != registryv1.TLSMode_TLS_MODE_ISTIO {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		transportSocketMatch: {Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue(tlsModeIstio)}},
	}}
}

// dnsLoadAssignment is the inline assignment of a DNS cluster: the
// endpoints' hostnames, or the service's own hostname when it lists none.
// A LOGICAL_DNS cluster takes exactly one.
func (g *gen) dnsLoadAssignment(name string, svc *registryv1.Service, port *registryv1.ServicePort, ss *networking.Subset, single bool) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for _, ep := range g.pc.Endpoints(svc) {
		if !model.LabelsMatch(ss.GetLabels(), ep.GetLabels()) {
			continue
		}
		num, ok := endpointPort(ep, port)
		if !ok {
			continue
		}
		lbs = append(lbs, lbEndpoint(socketAddress(ep.GetAddress(), num), max(ep.GetWeight(), 1), health(ep.GetHealth()), nil))
	}
	if len(lbs) == 0 && ss == nil {
		lbs = append(lbs, lbEndpoint(socketAddress(svc.GetHostname(), port.GetNumber()), 1, corev3.HealthStatus_UNKNOWN, nil))
	}
	if single && len(lbs) > 1 {
		lbs = lbs[:1]
	}
	la := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(lbs) > 0 {
		la.Endpoints = []*endpointv3.LocalityLbEndpoints{{Locality: &corev3.Locality{}, LbEndpoints: lbs}}
	}
	return la
}

func health(h registryv1.HealthStatus) corev3.HealthStatus {
	switch h {
	case registryv1.HealthStatus_HEALTH_STATUS_HEALTHY:
		return corev3.HealthStatus_HEALTHY
	case registryv1.HealthStatus_HEALTH_STATUS_UNHEALTHY:
		return corev3.HealthStatus_UNHEALTHY
	case registryv1.HealthStatus_HEALTH_STATUS_DRAINING:
		return corev3.HealthStatus_DRAINING
	default:
		return corev3.HealthStatus_UNKNOWN
	}
}

func socketAddress(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       addr,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

func lbEndpoint(addr *corev3.Address, weight uint32, h corev3.HealthStatus, md *corev3.Metadata) *endpointv3.LbEndpoint {
	lb := &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}},
		HealthStatus:   h,
		Metadata:       md,
	}
	if weight > 0 {
		lb.LoadBalancingWeight = wrapperspb.UInt32(weight)
	}
	return lb
}
