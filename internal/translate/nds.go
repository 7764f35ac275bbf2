package translate

import (
	"net/netip"
	"strings"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
)

// Registries as the name table names them (Istio's provider IDs).
const (
	kubernetesRegistry = "Kubernetes"
	externalRegistry   = "External"
)

// clusterSetSuffix ends Kubernetes Multi-Cluster Services' hosts, which
// get no short names (they would clash with the cluster.local ones').
const clusterSetSuffix = ".svc.clusterset.local"

// nameTable is what the proxy's agent answers DNS with, as Istio's
// BuildNameTable (pkg/dns/server/name_table.go): every host of the
// proxy's scope with its addresses for this proxy (serviceAddresses: a
// ServiceEntry host's allocated ones when the proxy's DNS is captured);
// a passthrough service without one (a headless Service, a ServiceEntry
// of resolution NONE) resolves to its ready endpoints' addresses; a
// Kubernetes Service also gives its name and namespace, so the agent
// answers its short forms in the pod's search domains. A host with no
// address is left out: the agent forwards its query. Proxies of one scope
// share the table built once per push.
//
// Not here yet: a headless Service's pods by their own names
// ("<hostname>.<subdomain>.<namespace>.svc…"), which need the pods'
// hostname and subdomain in the registry; endpoints are of one network
// (Flotilla serves no multi-network mesh).
func (g *gen) nameTable() *ndsv1.NameTable {
	return g.pc.Memo(g.scopeKey("nds", "", false, false), func() any {
		out := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{}}
		for _, svc := range g.scope.Services() {
			ips := g.serviceAddresses(svc)
			if len(ips) == 0 && svc.GetResolution() == registryv1.Resolution_RESOLUTION_NONE && len(svc.GetPorts()) > 0 {
				ips = g.readyAddresses(svc)
			}
			if len(ips) == 0 {
				continue
			}
			info := &ndsv1.NameTable_NameInfo{Ips: ips, Registry: externalRegistry}
			if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE {
				info.Registry = kubernetesRegistry
				if !strings.HasSuffix(svc.GetHostname(), clusterSetSuffix) {
					info.Namespace, info.Shortname = svc.GetNamespace(), svc.GetName()
				}
			}
			out.Table[svc.GetHostname()] = info
		}
		return out
	}).(*ndsv1.NameTable)
}

// readyAddresses are the addresses of a service's healthy endpoints that
// are IP addresses, each once, in endpoint order (Istio's name table
// leaves out endpoints not ready unless the Service publishes them; the
// registry keeps no such Service setting).
func (g *gen) readyAddresses(svc *registryv1.Service) []string {
	var out []string
	seen := map[string]bool{}
	for _, ep := range g.pc.Endpoints(svc) {
		ip, err := netip.ParseAddr(ep.GetAddress())
		if err != nil || ep.GetHealth() != registryv1.HealthStatus_HEALTH_STATUS_HEALTHY || seen[ip.String()] {
			continue
		}
		seen[ip.String()] = true
		out = append(out, ip.String())
	}
	return out
}
