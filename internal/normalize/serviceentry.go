// Package normalize turns ServiceEntries and WorkloadEntries into the one
// registry model (api/proto/flotilla/registry/v1) that discovery reads; its
// subpackage kube does the same for Kubernetes Services, EndpointSlices and
// Pods. This package links no Kubernetes library, so a process that reads
// only Istio YAML (discovery with --config-dir) does not either. Its
// functions are pure: same input, same output, sorted, so that resource
// versions (content hashes) are stable.
package normalize

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// TLSModeLabel is the workload label that says a sidecar terminates mTLS.
const TLSModeLabel = "security.istio.io/tlsMode"

// ServiceEntry returns the Services (one per host) and EndpointSets of a
// ServiceEntry. workloads are candidate WorkloadEntries; those in the
// ServiceEntry's namespace that its workloadSelector matches become
// endpoints.
func ServiceEntry(se *istio.Object, workloads []*istio.Object) ([]*registryv1.Service, []*registryv1.EndpointSet) {
	spec, ok := se.Spec.(*networking.ServiceEntry)
	if !ok {
		return nil, nil
	}
	ns := se.Meta.Namespace
	var ports []*registryv1.ServicePort
	for _, p := range spec.GetPorts() {
		target := p.GetTargetPort()
		if target == 0 {
			target = p.GetNumber()
		}
		ports = append(ports, &registryv1.ServicePort{
			Name: p.GetName(), Number: p.GetNumber(), Protocol: registry.ParseProtocol(p.GetProtocol()), TargetPort: target,
		})
	}
	slices.SortFunc(ports, func(a, b *registryv1.ServicePort) int { return cmp.Compare(a.GetNumber(), b.GetNumber()) })

	var endpoints []*registryv1.Endpoint
	for _, we := range spec.GetEndpoints() {
		endpoints = append(endpoints, endpoint(we, ns, "", spec.GetPorts()))
	}
	if sel := spec.GetWorkloadSelector().GetLabels(); len(sel) > 0 {
		endpoints = append(endpoints, WorkloadEntries(workloads, ns, sel, spec.GetPorts())...)
	}
	SortEndpoints(endpoints)

	allocated := AllocatedAddresses(se)
	var services []*registryv1.Service
	var sets []*registryv1.EndpointSet
	for _, host := range spec.GetHosts() {
		svc := &registryv1.Service{
			Hostname:        host,
			Name:            se.Meta.Name,
			Namespace:       ns,
			Ports:           ports,
			Addresses:       sorted(spec.GetAddresses()),
			Labels:          maps.Clone(se.Meta.Labels),
			ExportTo:        sorted(spec.GetExportTo()),
			Resolution:      resolution(spec.GetResolution()),
			SourceKind:      registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY,
			Selector:        maps.Clone(spec.GetWorkloadSelector().GetLabels()),
			Location:        location(spec.GetLocation()),
			SubjectAltNames: sorted(spec.GetSubjectAltNames()),

			AutoAllocatedAddresses: oneOfEachFamily(allocated[host]),
		}
		services = append(services, svc)
		eps := endpoints
		if len(eps) == 0 && (spec.GetResolution() == networking.ServiceEntry_DNS || spec.GetResolution() == networking.ServiceEntry_DNS_ROUND_ROBIN) &&
			!strings.HasPrefix(host, "*") && len(spec.GetWorkloadSelector().GetLabels()) == 0 {
			// DNS resolution with no endpoints: the host itself is resolved.
			var ports []*registryv1.EndpointPort
			for _, p := range svc.GetPorts() {
				ports = append(ports, &registryv1.EndpointPort{ServicePortName: p.GetName(), Number: p.GetTargetPort()})
			}
			eps = []*registryv1.Endpoint{{Address: host, Ports: ports, Health: registryv1.HealthStatus_HEALTH_STATUS_HEALTHY, WorkloadNamespace: ns}}
		}
		sets = append(sets, shard(ns, host, "se-"+se.Meta.Name, eps)...)
	}
	return services, sets
}

// WorkloadEntries returns the endpoints of the WorkloadEntries in namespace
// that selector matches, serving ports, sorted. An empty selector matches
// none: Istio selects workloads only through labels. An entry whose health
// is checked and not (yet) Healthy has none, as in Istio (its serviceentry
// controller leaves such entries out of the workloads).
func WorkloadEntries(workloads []*istio.Object, namespace string, selector map[string]string, ports []*networking.ServicePort) []*registryv1.Endpoint {
	if len(selector) == 0 {
		return nil
	}
	var eps []*registryv1.Endpoint
	for _, w := range workloads {
		we, ok := w.Spec.(*networking.WorkloadEntry)
		if !ok || w.Meta.Namespace != namespace || !SelectorMatches(selector, we.GetLabels()) || !istio.Healthy(w) {
			continue
		}
		eps = append(eps, endpoint(we, namespace, w.Meta.Name, ports))
	}
	SortEndpoints(eps)
	return eps
}

// endpoint converts one WorkloadEntry (inline or standalone) serving ports.
func endpoint(we *networking.WorkloadEntry, ns, name string, ports []*networking.ServicePort) *registryv1.Endpoint {
	ep := &registryv1.Endpoint{
		Address:           we.GetAddress(),
		Labels:            maps.Clone(we.GetLabels()),
		ServiceAccount:    we.GetServiceAccount(),
		Locality:          parseLocality(we.GetLocality()),
		Network:           we.GetNetwork(),
		Health:            registryv1.HealthStatus_HEALTH_STATUS_HEALTHY,
		Weight:            we.GetWeight(),
		WorkloadName:      name,
		WorkloadNamespace: ns,
		TlsMode:           TLSMode(we.GetLabels()),
	}
	for _, p := range ports {
		n, ok := we.GetPorts()[p.GetName()]
		if !ok {
			n = p.GetTargetPort()
		}
		if n == 0 {
			n = p.GetNumber()
		}
		ep.Ports = append(ep.Ports, &registryv1.EndpointPort{ServicePortName: p.GetName(), Number: n})
	}
	slices.SortFunc(ep.Ports, func(a, b *registryv1.EndpointPort) int {
		return strings.Compare(a.GetServicePortName(), b.GetServicePortName())
	})
	return ep
}

// shard splits endpoints into EndpointSets of at most registry.ShardSize,
// named prefix-0, prefix-1, ... Always at least one set, so that a service
// with no endpoints is known to have none.
func shard(ns, host, prefix string, eps []*registryv1.Endpoint) []*registryv1.EndpointSet {
	var out []*registryv1.EndpointSet
	for i := 0; i == 0 || i*registry.ShardSize < len(eps); i++ {
		end := min((i+1)*registry.ShardSize, len(eps))
		out = append(out, &registryv1.EndpointSet{
			ServiceHostname:  host,
			ServiceNamespace: ns,
			Shard:            fmt.Sprintf("%s-%d", prefix, i),
			Endpoints:        eps[i*registry.ShardSize : end],
		})
	}
	return out
}

// SortEndpoints orders endpoints by address, then workload name.
func SortEndpoints(eps []*registryv1.Endpoint) {
	slices.SortFunc(eps, func(a, b *registryv1.Endpoint) int {
		return cmp.Or(strings.Compare(a.GetAddress(), b.GetAddress()), strings.Compare(a.GetWorkloadName(), b.GetWorkloadName()))
	})
}

// SelectorMatches reports whether every label of selector is in labels
// with its value.
func SelectorMatches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func sorted(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return out
}

func parseLocality(s string) *registryv1.Locality {
	if s == "" {
		return nil
	}
	parts := strings.SplitN(s, "/", 3)
	l := &registryv1.Locality{Region: parts[0]}
	if len(parts) > 1 {
		l.Zone = parts[1]
	}
	if len(parts) > 2 {
		l.Subzone = parts[2]
	}
	return l
}

// TLSMode reads a workload's TLSModeLabel.
func TLSMode(labels map[string]string) registryv1.TLSMode {
	switch labels[TLSModeLabel] {
	case "istio":
		return registryv1.TLSMode_TLS_MODE_ISTIO
	case "disabled":
		return registryv1.TLSMode_TLS_MODE_DISABLED
	default:
		return registryv1.TLSMode_TLS_MODE_UNSPECIFIED
	}
}

func resolution(r networking.ServiceEntry_Resolution) registryv1.Resolution {
	switch r {
	case networking.ServiceEntry_STATIC:
		return registryv1.Resolution_RESOLUTION_STATIC
	case networking.ServiceEntry_DNS:
		return registryv1.Resolution_RESOLUTION_DNS
	case networking.ServiceEntry_DNS_ROUND_ROBIN:
		return registryv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN
	case networking.ServiceEntry_DYNAMIC_DNS:
		return registryv1.Resolution_RESOLUTION_DYNAMIC_DNS
	default:
		return registryv1.Resolution_RESOLUTION_NONE
	}
}

func location(l networking.ServiceEntry_Location) registryv1.Location {
	if l == networking.ServiceEntry_MESH_INTERNAL {
		return registryv1.Location_LOCATION_MESH_INTERNAL
	}
	return registryv1.Location_LOCATION_MESH_EXTERNAL
}

// oneOfEachFamily is what Istio's convertServices keeps of a host's
// allocated addresses: the last IPv4 and the last IPv6, IPv4 first.
func oneOfEachFamily(addrs []netip.Addr) []string {
	var v4, v6 string
	for _, a := range addrs {
		if a.Is4() {
			v4 = a.String()
		} else {
			v6 = a.String()
		}
	}
	var out []string
	for _, a := range []string{v4, v6} {
		if a != "" {
			out = append(out, a)
		}
	}
	return out
}
