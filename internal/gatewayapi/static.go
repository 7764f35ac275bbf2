package gatewayapi

import (
	"slices"
	"strings"
)

// StaticCluster is a Cluster held in memory (the tests', and `flotilla
// analyze`'s over files); its maps are keyed "namespace/name".
type StaticCluster struct {
	Domain       string
	NamespaceSet map[string]map[string]string
	Services     map[string]*Service
	Entries      map[string][]string
	EntryPorts   map[string]map[string]uint32
	Secrets      map[string]map[string][]byte
	ConfigMaps   map[string]map[string]string
}

// NewStaticCluster returns an empty cluster of domain.
func NewStaticCluster(domain string) *StaticCluster {
	return &StaticCluster{
		Domain: domain, NamespaceSet: map[string]map[string]string{}, Services: map[string]*Service{},
		Entries: map[string][]string{}, EntryPorts: map[string]map[string]uint32{}, Secrets: map[string]map[string][]byte{}, ConfigMaps: map[string]map[string]string{},
	}
}

// Namespaces implements Cluster.
func (c *StaticCluster) Namespaces() map[string]map[string]string { return c.NamespaceSet }

// Service implements Cluster.
func (c *StaticCluster) Service(ns, name string) (*Service, bool) {
	s, ok := c.Services[ns+"/"+name]
	return s, ok
}

// ServiceEntryHosts implements Cluster.
func (c *StaticCluster) ServiceEntryHosts(ns, name string) ([]string, bool) {
	h, ok := c.Entries[ns+"/"+name]
	return h, ok
}

// ServiceEntryPorts implements Cluster.
func (c *StaticCluster) ServiceEntryPorts(ns, name string) map[string]uint32 {
	return c.EntryPorts[ns+"/"+name]
}

// HostnameKnown implements Cluster: a Service's host or a
// ServiceEntry's.
func (c *StaticCluster) HostnameKnown(host, _ string) bool {
	for key := range c.Services {
		ns, name, _ := strings.Cut(key, "/")
		if host == name+"."+ns+".svc."+c.Domain {
			return true
		}
	}
	for _, hosts := range c.Entries {
		if slices.Contains(hosts, host) {
			return true
		}
	}
	return false
}

// Secret implements Cluster.
func (c *StaticCluster) Secret(ns, name string) (map[string][]byte, bool) {
	s, ok := c.Secrets[ns+"/"+name]
	return s, ok
}

// ConfigMap implements Cluster.
func (c *StaticCluster) ConfigMap(ns, name string) (map[string]string, bool) {
	s, ok := c.ConfigMaps[ns+"/"+name]
	return s, ok
}
