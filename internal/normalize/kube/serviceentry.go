package kube

import (
	"maps"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
)

// ServiceEntryPodShard names the EndpointSet of the pods a ServiceEntry's
// workloadSelector selects, per ServiceEntry.
func ServiceEntryPodShard(seName string) string { return "pods-" + seName }

// ServiceEntryPods returns, for each host of a ServiceEntry with a
// workloadSelector, the endpoints of the pods of its namespace the
// selector matches, as Istio's ServiceEntry controller takes them from
// the Kubernetes registry's workload instances: pods that are running
// (not terminal, not being deleted) with an address and Ready
// (PodCache.onEvent, shouldPodBeInEndpoints, IsPodReady); on each port of
// the ServiceEntry, the pod's container port of that name, else the
// port's targetPort, else its number
// (convertWorkloadInstanceToServiceInstance). nil when it has no
// selector.
func ServiceEntryPods(se *istio.Object, pods []*corev1.Pod) []*registryv1.EndpointSet {
	spec, ok := se.Spec.(*networking.ServiceEntry)
	sel := spec.GetWorkloadSelector().GetLabels()
	if !ok || len(sel) == 0 {
		return nil
	}
	var eps []*registryv1.Endpoint
	for _, pod := range pods {
		if pod.Namespace != se.Meta.Namespace || !inEndpoints(pod) || !normalize.SelectorMatches(sel, pod.Labels) {
			continue
		}
		named := containerPorts(pod)
		var ports []*registryv1.EndpointPort
		for _, p := range spec.GetPorts() {
			n := p.GetNumber()
			switch {
			case named[p.GetName()] > 0:
				n = named[p.GetName()]
			case p.GetTargetPort() > 0:
				n = p.GetTargetPort()
			}
			ports = append(ports, &registryv1.EndpointPort{ServicePortName: p.GetName(), Number: n})
		}
		slices.SortFunc(ports, func(a, b *registryv1.EndpointPort) int {
			return strings.Compare(a.GetServicePortName(), b.GetServicePortName())
		})
		for _, addr := range podAddresses(pod) {
			ep := &registryv1.Endpoint{
				Address: addr, Ports: ports, Labels: maps.Clone(pod.Labels), ServiceAccount: pod.Spec.ServiceAccountName,
				Health: registryv1.HealthStatus_HEALTH_STATUS_HEALTHY, WorkloadName: pod.Name, WorkloadNamespace: pod.Namespace,
				Network: pod.Labels[NetworkLabel], TlsMode: normalize.TLSMode(pod.Labels), NodeName: pod.Spec.NodeName,
			}
			if r, sz := pod.Labels[RegionLabel], pod.Labels[SubzoneLabel]; r != "" || sz != "" {
				ep.Locality = &registryv1.Locality{Region: r, Subzone: sz}
			}
			eps = append(eps, ep)
		}
	}
	normalize.SortEndpoints(eps)
	var out []*registryv1.EndpointSet
	for _, host := range spec.GetHosts() {
		out = append(out, &registryv1.EndpointSet{
			ServiceHostname: host, ServiceNamespace: se.Meta.Namespace, Shard: ServiceEntryPodShard(se.Meta.Name), Endpoints: eps,
		})
	}
	return out
}

// inEndpoints is Istio's shouldPodBeInEndpoints and IsPodReady.
func inEndpoints(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		return false
	}
	if len(podAddresses(pod)) == 0 {
		return false
	}
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// podAddresses are a pod's addresses, the primary first.
func podAddresses(pod *corev1.Pod) []string {
	var out []string
	if pod.Status.PodIP != "" {
		out = append(out, pod.Status.PodIP)
	}
	for _, ip := range pod.Status.PodIPs {
		if !slices.Contains(out, ip.IP) {
			out = append(out, ip.IP)
		}
	}
	return out
}

// containerPorts are a pod's named TCP container ports, the first of a
// name winning, including those of restartable init containers (native
// sidecars), as Istio's getPortMap.
func containerPorts(pod *corev1.Pod) map[string]uint32 {
	out := map[string]uint32{}
	add := func(cs []corev1.Container, all bool) {
		for _, c := range cs {
			if !all && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == "" || (p.Protocol != "" && p.Protocol != corev1.ProtocolTCP) {
					continue
				}
				if _, ok := out[p.Name]; !ok {
					out[p.Name] = portNumber(int(p.ContainerPort))
				}
			}
		}
	}
	add(pod.Spec.Containers, true)
	add(pod.Spec.InitContainers, false)
	return out
}
