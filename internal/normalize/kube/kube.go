// Package kube turns Kubernetes Services, EndpointSlices and Pods (and the
// WorkloadEntries a Service selects) into the registry model, as package
// normalize does for ServiceEntries. It is galley's alone: only galley reads
// Kubernetes, and only this package of the registry's links its API types.
package kube

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Kubernetes annotations and labels galley reads.
const (
	ExportToAnnotation = "networking.istio.io/exportTo"
	NetworkLabel       = "topology.istio.io/network"
	SubzoneLabel       = "topology.istio.io/subzone"
	RegionLabel        = "topology.kubernetes.io/region"
)

// Hostname is a Service's fully qualified name.
func Hostname(name, namespace, domainSuffix string) string {
	return name + "." + namespace + ".svc." + domainSuffix
}

// Service converts a core/v1 Service.
func Service(svc *corev1.Service, domainSuffix, clusterID string) *registryv1.Service {
	out := &registryv1.Service{
		Hostname:   Hostname(svc.Name, svc.Namespace, domainSuffix),
		Name:       svc.Name,
		Namespace:  svc.Namespace,
		Labels:     maps.Clone(svc.Labels),
		SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
		Selector:   maps.Clone(svc.Spec.Selector),
		Location:   registryv1.Location_LOCATION_MESH_INTERNAL,
		ClusterId:  clusterID,
		Resolution: registryv1.Resolution_RESOLUTION_STATIC,
	}
	if len(out.Labels) == 0 {
		out.Labels = nil
	}
	if len(out.Selector) == 0 {
		out.Selector = nil
	}
	for _, p := range svc.Spec.Ports {
		target := portNumber(p.TargetPort.IntValue())
		if target == 0 {
			target = portNumber(int(p.Port)) // named or unset target port: endpoints say
		}
		app := ""
		if p.AppProtocol != nil {
			app = *p.AppProtocol
		}
		out.Ports = append(out.Ports, &registryv1.ServicePort{
			Name:       p.Name,
			Number:     portNumber(int(p.Port)),
			Protocol:   registry.KubernetesPortProtocol(p.Name, app, string(p.Protocol)),
			TargetPort: target,
		})
	}
	slices.SortFunc(out.Ports, func(a, b *registryv1.ServicePort) int { return cmp.Compare(a.GetNumber(), b.GetNumber()) })
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP} // as written by hand; the apiserver fills both
	}
	for _, ip := range ips {
		if ip != "" && ip != corev1.ClusterIPNone {
			out.Addresses = append(out.Addresses, ip)
		}
	}
	slices.Sort(out.Addresses)
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		out.Resolution = registryv1.Resolution_RESOLUTION_DNS
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		// Headless: clients address pods directly; forward as addressed.
		out.Resolution = registryv1.Resolution_RESOLUTION_NONE
	}
	if v := svc.Annotations[ExportToAnnotation]; v != "" {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out.ExportTo = append(out.ExportTo, e)
			}
		}
		slices.Sort(out.ExportTo)
	}
	return out
}

// ExternalNameShard names the EndpointSet of an ExternalName Service.
const ExternalNameShard = "external-name"

// ExternalNameEndpoints is the single EndpointSet of an ExternalName
// Service: its external name, on every port.
func ExternalNameEndpoints(svc *corev1.Service, domainSuffix string) *registryv1.EndpointSet {
	ep := &registryv1.Endpoint{
		Address:           svc.Spec.ExternalName,
		Health:            registryv1.HealthStatus_HEALTH_STATUS_HEALTHY,
		WorkloadNamespace: svc.Namespace,
	}
	for _, p := range svc.Spec.Ports {
		ep.Ports = append(ep.Ports, &registryv1.EndpointPort{ServicePortName: p.Name, Number: portNumber(int(p.Port))})
	}
	slices.SortFunc(ep.Ports, func(a, b *registryv1.EndpointPort) int {
		return strings.Compare(a.GetServicePortName(), b.GetServicePortName())
	})
	return &registryv1.EndpointSet{
		ServiceHostname:  Hostname(svc.Name, svc.Namespace, domainSuffix),
		ServiceNamespace: svc.Namespace,
		Shard:            ExternalNameShard,
		Endpoints:        []*registryv1.Endpoint{ep},
	}
}

// PodLookup finds a pod by namespace and name; nil when unknown.
type PodLookup func(namespace, name string) *corev1.Pod

// EndpointSlice converts one EndpointSlice into the EndpointSet of the same
// name, enriched with what its pods say (labels, service account, node,
// network, TLS mode). ok is false for slices that do not belong to a
// Service or hold FQDN addresses.
func EndpointSlice(slice *discoveryv1.EndpointSlice, pods PodLookup, domainSuffix string) (set *registryv1.EndpointSet, service string, ok bool) {
	service = slice.Labels[discoveryv1.LabelServiceName]
	if service == "" || slice.AddressType == discoveryv1.AddressTypeFQDN {
		return nil, "", false
	}
	var ports []*registryv1.EndpointPort
	for _, p := range slice.Ports {
		if p.Port == nil {
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		ports = append(ports, &registryv1.EndpointPort{ServicePortName: name, Number: portNumber(int(*p.Port))})
	}
	slices.SortFunc(ports, func(a, b *registryv1.EndpointPort) int {
		return strings.Compare(a.GetServicePortName(), b.GetServicePortName())
	})
	set = &registryv1.EndpointSet{
		ServiceHostname:  Hostname(service, slice.Namespace, domainSuffix),
		ServiceNamespace: slice.Namespace,
		Shard:            slice.Name,
	}
	for _, e := range slice.Endpoints {
		var pod *corev1.Pod
		if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" && pods != nil {
			pod = pods(cmp.Or(ref.Namespace, slice.Namespace), ref.Name)
		}
		for _, addr := range e.Addresses {
			ep := &registryv1.Endpoint{
				Address:           addr,
				Ports:             ports,
				Health:            health(e.Conditions),
				WorkloadNamespace: slice.Namespace,
			}
			if e.NodeName != nil {
				ep.NodeName = *e.NodeName
			}
			// A pod's own name in a headless Service (validated by the
			// apiserver; checked again, as it becomes part of a DNS name).
			if e.Hostname != nil && len(validation.IsDNS1123Label(*e.Hostname)) == 0 {
				ep.Hostname = *e.Hostname
			}
			if e.Zone != nil && *e.Zone != "" {
				ep.Locality = &registryv1.Locality{Zone: *e.Zone}
			}
			if pod != nil {
				ep.Labels = maps.Clone(pod.Labels)
				if len(ep.Labels) == 0 {
					ep.Labels = nil
				}
				ep.ServiceAccount = pod.Spec.ServiceAccountName
				ep.WorkloadName = pod.Name
				ep.Network = pod.Labels[NetworkLabel]
				ep.TlsMode = normalize.TLSMode(pod.Labels)
				if ep.NodeName == "" {
					ep.NodeName = pod.Spec.NodeName
				}
				if r, sz := pod.Labels[RegionLabel], pod.Labels[SubzoneLabel]; r != "" || sz != "" {
					if ep.Locality == nil {
						ep.Locality = &registryv1.Locality{}
					}
					ep.Locality.Region, ep.Locality.Subzone = r, sz
				}
			} else if e.TargetRef != nil {
				ep.WorkloadName = e.TargetRef.Name
			}
			set.Endpoints = append(set.Endpoints, ep)
		}
	}
	normalize.SortEndpoints(set.Endpoints)
	return set, service, true
}

// health maps EndpointSlice conditions: terminating endpoints drain, ready
// (or unknown readiness) ones are healthy.
func health(c discoveryv1.EndpointConditions) registryv1.HealthStatus {
	switch {
	case c.Terminating != nil && *c.Terminating:
		return registryv1.HealthStatus_HEALTH_STATUS_DRAINING
	case c.Ready == nil || *c.Ready:
		return registryv1.HealthStatus_HEALTH_STATUS_HEALTHY
	default:
		return registryv1.HealthStatus_HEALTH_STATUS_UNHEALTHY
	}
}

// portNumber converts a Kubernetes port (validated 0-65535 by the apiserver)
// without wrapping anything out of range.
func portNumber(n int) uint32 {
	if n < 0 || n > 65535 {
		return 0
	}
	return uint32(n)
}

// WorkloadEntryShard names the EndpointSet of a Service's WorkloadEntries.
const WorkloadEntryShard = "workloadentries"

// WorkloadEntries returns the endpoints a Kubernetes Service gets from
// WorkloadEntries (VMs and other non-pod workloads) in its namespace that
// its selector matches, as Istio does; ok is false when none match.
func WorkloadEntries(svc *corev1.Service, workloads []*istio.Object, domainSuffix string) (*registryv1.EndpointSet, bool) {
	var ports []*networking.ServicePort
	for _, p := range svc.Spec.Ports {
		target := portNumber(p.TargetPort.IntValue())
		if target == 0 {
			target = portNumber(int(p.Port))
		}
		ports = append(ports, &networking.ServicePort{Name: p.Name, Number: portNumber(int(p.Port)), TargetPort: target})
	}
	eps := normalize.WorkloadEntries(workloads, svc.Namespace, svc.Spec.Selector, ports)
	if len(eps) == 0 {
		return nil, false
	}
	return &registryv1.EndpointSet{
		ServiceHostname:  Hostname(svc.Name, svc.Namespace, domainSuffix),
		ServiceNamespace: svc.Namespace,
		Shard:            WorkloadEntryShard,
		Endpoints:        eps,
	}, true
}
