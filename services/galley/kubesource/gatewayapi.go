package kubesource

import (
	"maps"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// GatewayCluster returns the cluster as the Gateway API's conversion reads
// it (gatewayapi.Cluster), as it is now: the Services with where their
// endpoints are ready, the namespaces' labels, the ServiceEntries' hosts
// and the credential Secrets this source watches. It copies the indexes,
// sharing the informers' objects, which nothing changes.
func (s *Source) GatewayCluster() gatewayapi.Cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &gatewayCluster{
		domain:     s.o.DomainSuffix,
		namespaces: map[string]map[string]string{},
		services:   map[string]*gatewayapi.Service{},
		entries:    map[string]*networking.ServiceEntry{},
		hosts:      map[string]bool{},
		secrets:    maps.Clone(s.secrets),
	}
	if s.nsStore != nil {
		for _, obj := range s.nsStore.List() {
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				c.namespaces[m.Name] = m.Labels
			}
		}
	}
	for key, svc := range s.services {
		gs := &gatewayapi.Service{
			Labels: svc.Labels, LoadBalancer: svc.Spec.Type == corev1.ServiceTypeLoadBalancer,
			ReadyPorts: map[int32]bool{}, TargetPorts: map[int32][]int32{}, PortNames: map[string]int32{},
		}
		for _, ip := range svc.Spec.ClusterIPs {
			if ip != corev1.ClusterIPNone {
				gs.ClusterIPs = append(gs.ClusterIPs, ip)
			}
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			gs.External = append(gs.External, in.IP+in.Hostname)
		}
		for _, p := range svc.Spec.Ports {
			gs.Ports = append(gs.Ports, p.Port)
			gs.PortNames[p.Name] = p.Port
		}
		c.services[key] = gs
		c.hosts[svc.Name+"."+svc.Namespace+".svc."+s.o.DomainSuffix] = true
	}
	for _, slice := range s.slices {
		svc := s.services[slice.Namespace+"/"+slice.Labels[discoveryv1.LabelServiceName]]
		gs := c.services[slice.Namespace+"/"+slice.Labels[discoveryv1.LabelServiceName]]
		if svc == nil || gs == nil || !anyReady(slice) {
			continue
		}
		for _, ep := range slice.Ports {
			for _, sp := range svc.Spec.Ports {
				if ep.Name != nil && sp.Name == *ep.Name && ep.Port != nil {
					gs.ReadyPorts[sp.Port] = true
					gs.TargetPorts[sp.Port] = append(gs.TargetPorts[sp.Port], *ep.Port)
				}
			}
		}
	}
	for id, o := range s.published {
		if id.Kind != istio.ServiceEntry {
			continue
		}
		if se, ok := o.Spec.(*networking.ServiceEntry); ok {
			c.entries[o.Key()] = se
			for _, h := range se.GetHosts() {
				c.hosts[h] = true
			}
		}
	}
	return c
}

func anyReady(slice *discoveryv1.EndpointSlice) bool {
	for _, e := range slice.Endpoints {
		if e.Conditions.Ready == nil || *e.Conditions.Ready {
			return true
		}
	}
	return false
}

// gatewayCluster is a copy of what GatewayCluster reads.
type gatewayCluster struct {
	domain     string
	namespaces map[string]map[string]string
	services   map[string]*gatewayapi.Service
	entries    map[string]*networking.ServiceEntry
	hosts      map[string]bool
	secrets    map[string]*corev1.Secret
}

func (c *gatewayCluster) Namespaces() map[string]map[string]string { return c.namespaces }

func (c *gatewayCluster) Service(namespace, name string) (*gatewayapi.Service, bool) {
	s, ok := c.services[namespace+"/"+name]
	return s, ok
}

func (c *gatewayCluster) ServiceEntryHosts(namespace, name string) ([]string, bool) {
	se, ok := c.entries[namespace+"/"+name]
	return se.GetHosts(), ok
}

func (c *gatewayCluster) ServiceEntryPorts(namespace, name string) map[string]uint32 {
	se := c.entries[namespace+"/"+name]
	out := make(map[string]uint32, len(se.GetPorts()))
	for _, p := range se.GetPorts() {
		out[p.GetName()] = p.GetNumber()
	}
	return out
}

// HostnameKnown: a Service's or a ServiceEntry's host; ServiceEntries'
// exportTo is not read (a route naming a host it cannot see binds, and
// the proxies that cannot see it get no cluster for it).
func (c *gatewayCluster) HostnameKnown(hostname, _ string) bool {
	return c.hosts[strings.ToLower(hostname)]
}

func (c *gatewayCluster) Secret(namespace, name string) (map[string][]byte, bool) {
	s, ok := c.secrets[namespace+"/"+name]
	if !ok {
		return nil, false
	}
	return s.Data, true
}

// ConfigMap: galley watches only its own namespace's ConfigMaps, so a
// Gateway's parametersRef and CA ConfigMaps are not found (reported in
// the Gateway's status).
func (c *gatewayCluster) ConfigMap(string, string) (map[string]string, bool) { return nil, false }
