package translate

import (
	"net/netip"
	"strings"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
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
// A headless Kubernetes Service's pods are there by their own names too
// ("<hostname>.<service host>", e.g. mysql-0.mysql.default.svc.cluster.local,
// as cluster DNS answers them): the endpoints' hostnames. Endpoints are of
// one network (Flotilla serves no multi-network mesh).
func (g *gen) nameTable() *ndsv1.NameTable {
	return g.pc.Memo(g.scopeKey("nds", "", false, false), func() any {
		out := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{}}
		for _, svc := range g.scope.Services() {
			kube := svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE
			shortNames := kube && !strings.HasSuffix(svc.GetHostname(), clusterSetSuffix)
			registry := proxycontract.NameTableExternal
			if kube {
				registry = proxycontract.NameTableKubernetes
			}
			ips := g.serviceAddresses(svc)
			if len(ips) == 0 && svc.GetResolution() == registryv1.Resolution_RESOLUTION_NONE && len(svc.GetPorts()) > 0 {
				var pods map[string][]string
				ips, pods = g.readyAddresses(svc)
				for hostname, addrs := range pods {
					if !kube {
						break
					}
					// Istio's BuildNameTable: "<hostname>.<subdomain>" in the
					// Service's namespace, the subdomain being the Service.
					info := &ndsv1.NameTable_NameInfo{Ips: addrs, Registry: registry}
					if shortNames {
						info.Namespace, info.Shortname = svc.GetNamespace(), hostname+"."+svc.GetName()
					}
					out.Table[hostname+"."+svc.GetHostname()] = info
				}
			}
			if len(ips) == 0 {
				continue
			}
			info := &ndsv1.NameTable_NameInfo{Ips: ips, Registry: registry}
			if shortNames {
				info.Namespace, info.Shortname = svc.GetNamespace(), svc.GetName()
			}
			out.Table[svc.GetHostname()] = info
		}
		return out
	}).(*ndsv1.NameTable)
}

// readyAddresses are the addresses of a service's healthy endpoints that
// are IP addresses, each once, in endpoint order (Istio's name table
// leaves out endpoints not ready unless the Service publishes them; the
// registry keeps no such Service setting), and those of the endpoints
// with a hostname, by hostname.
func (g *gen) readyAddresses(svc *registryv1.Service) (all []string, byHostname map[string][]string) {
	seen := map[string]bool{}
	for _, ep := range g.pc.Endpoints(svc) {
		ip, err := netip.ParseAddr(ep.GetAddress())
		if err != nil || ep.GetHealth() != registryv1.HealthStatus_HEALTH_STATUS_HEALTHY || seen[ip.String()] {
			continue
		}
		seen[ip.String()] = true
		all = append(all, ip.String())
		if h := ep.GetHostname(); h != "" {
			if byHostname == nil {
				byHostname = map[string][]string{}
			}
			byHostname[h] = append(byHostname[h], ip.String())
		}
	}
	return all, byHostname
}
