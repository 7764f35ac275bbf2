package validation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	telemetry "istio.io/api/telemetry/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// certificateVerification: a DestinationRule originating SIMPLE or
// MUTUAL TLS without caCertificates, for the whole host or a port, as
// Istio's CaCertificateAnalyzer (IST0128, IST0129): the proxy then checks
// the server's certificate against the system's roots only, or, with a
// credentialName, against what that Secret holds. As Istio's, a
// credentialName counts only on a rule with a workload selector.
func (a *analysis) certificateVerification() {
	for _, o := range a.in.Objects {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		unverified := func(tls *networking.ClientTLSSettings) bool {
			m := tls.GetMode()
			return (m == networking.ClientTLSSettings_SIMPLE || m == networking.ClientTLSSettings_MUTUAL) && tls.GetCaCertificates() == "" &&
				(tls.GetCredentialName() == "" || dr.GetWorkloadSelector() == nil)
		}
		if tls := dr.GetTrafficPolicy().GetTls(); unverified(tls) {
			a.report(CodeNoServerCertificateVerification, refOf(o), "spec.trafficPolicy.tls",
				"TLS mode %s without caCertificates: the server's certificate for host %s is not verified against a CA of this rule's", tls.GetMode(), dr.GetHost())
		}
		for i, p := range dr.GetTrafficPolicy().GetPortLevelSettings() {
			if tls := p.GetTls(); unverified(tls) {
				a.report(CodeNoServerCertificateVerification, refOf(o), fmt.Sprintf("spec.trafficPolicy.portLevelSettings[%d].tls", i),
					"TLS mode %s without caCertificates: the server's certificate for host %s at port %d is not verified against a CA of this rule's", tls.GetMode(), dr.GetHost(), p.GetPort().GetNumber())
			}
		}
	}
}

// serviceEntryAddresses: a ServiceEntry without addresses with a TCP (or
// unset) protocol port, as Istio's ProtocolAddressesAnalyzer (IST0134):
// TCP traffic is told apart by destination address, so without one the
// port's traffic to this host cannot be routed as its own. Not reported
// when the ServiceEntry has addresses allocated (status.addresses, Istio's
// addressAllocated), nor when the mesh's proxies capture DNS and allocate
// addresses (ISTIO_META_DNS_CAPTURE with ISTIO_META_DNS_AUTO_ALLOCATE or
// PILOT_ENABLE_IP_AUTOALLOCATE in defaultConfig.proxyMetadata).
func (a *analysis) serviceEntryAddresses() {
	md := a.in.Mesh.GetDefaultConfig().GetProxyMetadata()
	if md["ISTIO_META_DNS_CAPTURE"] == "true" && (md["ISTIO_META_DNS_AUTO_ALLOCATE"] == "true" || md["PILOT_ENABLE_IP_AUTOALLOCATE"] == "true") {
		return
	}
	for _, o := range a.in.Objects {
		se, ok := o.Spec.(*networking.ServiceEntry)
		if st, _ := o.Status.(*networking.ServiceEntryStatus); !ok || len(se.GetAddresses()) > 0 || len(st.GetAddresses()) > 0 {
			continue
		}
		for i, p := range se.GetPorts() {
			if p.GetProtocol() == "" || strings.EqualFold(p.GetProtocol(), "TCP") {
				a.report(CodeServiceEntryAddressesRequired, refOf(o), fmt.Sprintf("spec.ports[%d]", i),
					"port %d serves TCP (or no protocol) and the ServiceEntry has no addresses: its traffic cannot be told apart from other TCP traffic to that port", p.GetNumber())
			}
		}
	}
}

// telemetrySelectors: more than one Telemetry of a namespace without a
// workload selector, as Istio's DefaultSelectorAnalyzer (IST0160): which
// applies is undefined. A Telemetry with targetRefs applies to what it
// targets, not to the namespace, and is not counted (Istio counts it).
func (a *analysis) telemetrySelectors() {
	byNamespace := map[string][]*istio.Object{}
	for _, o := range a.in.Objects {
		t, ok := o.Spec.(*telemetry.Telemetry)
		if !ok || t.GetSelector() != nil || len(t.GetTargetRefs()) > 0 || t.GetTargetRef() != nil {
			continue
		}
		byNamespace[o.Meta.Namespace] = append(byNamespace[o.Meta.Namespace], o)
	}
	for ns, ts := range byNamespace {
		if len(ts) < 2 {
			continue
		}
		names := make([]string, len(ts))
		for i, t := range ts {
			names[i] = t.Meta.Name
		}
		slices.SortFunc(names, cmp.Compare)
		for _, t := range ts {
			a.report(CodeMultipleTelemetriesWithoutSelector, refOf(t), "",
				"Telemetries %s of namespace %s have no workload selector: which one applies is undefined", strings.Join(names, ", "), ns)
		}
	}
}

// meshHostConflicts: VirtualServices of the mesh gateway (the sidecars)
// that define the same host for the same namespaces, as Istio's
// ConflictingMeshGatewayHostsAnalyzer (IST0109): which one a sidecar
// uses is undefined. A host is keyed by where it is exported (each
// exportTo namespace, or everywhere) and its name qualified in the
// VirtualService's namespace; one exported everywhere conflicts with any
// it overlaps (a wildcard covering it) exported to a namespace.
func (a *analysis) meshHostConflicts() {
	type key struct{ scope, host string }
	byKey := map[key][]*istio.Object{}
	var keys []key
	for _, o := range a.in.Objects {
		vs, ok := o.Spec.(*networking.VirtualService)
		if !ok || (len(vs.GetGateways()) > 0 && !slices.Contains(vs.GetGateways(), model.MeshGateway)) {
			continue
		}
		for _, sc := range exportScopes(vs.GetExportTo(), o.Meta.Namespace) {
			for _, h := range vs.GetHosts() {
				k := key{sc, fqdn(h, o.Meta.Namespace, a.suffix)}
				if byKey[k] == nil {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], o)
			}
		}
	}
	reported := map[istio.ID]bool{}
	for _, k := range keys {
		list := slices.Clone(byKey[k])
		if k.scope != "*" {
			for _, other := range keys {
				if other.scope == "*" && (model.HostMatches(k.host, other.host) || model.HostMatches(other.host, k.host)) {
					list = append(list, byKey[other]...)
				}
			}
		}
		var names []string
		for _, o := range list {
			names = append(names, o.Meta.Namespace+"/"+o.Meta.Name)
		}
		slices.Sort(names)
		if names = slices.Compact(names); len(names) < 2 {
			continue
		}
		for _, o := range list {
			if reported[o.ID()] {
				continue
			}
			reported[o.ID()] = true
			a.report(CodeConflictingMeshHosts, refOf(o), "spec.hosts",
				"the VirtualServices %s associated with mesh gateway define the same host %s/%s which can lead to undefined behavior; merge them into one", strings.Join(names, ","), k.scope, k.host)
		}
	}
}

// gatewayConflicts: Gateways selecting the same workloads whose servers on
// one port list the same host with the same bind, as Istio's
// ConflictingGatewayAnalyzer (IST0145): the gateway serves only one of
// them. Selectors are the same when equal as label sets, or when one
// holds the other and a workload matches both.
func (a *analysis) gatewayConflicts() {
	var gws []*istio.Object
	for _, o := range a.in.Objects {
		if _, ok := o.Spec.(*networking.Gateway); ok {
			gws = append(gws, o)
		}
	}
	sameWorkloads := func(x, y map[string]string) bool {
		if maps.Equal(x, y) {
			return true
		}
		if !model.LabelsMatch(x, y) && !model.LabelsMatch(y, x) {
			return false
		}
		return slices.ContainsFunc(a.workloads, func(w Workload) bool { return model.LabelsMatch(x, w.Labels) && model.LabelsMatch(y, w.Labels) })
	}
	for _, o := range gws {
		gw := o.Spec.(*networking.Gateway) //nolint:forcetypeassert // gathered above
		for i, srv := range gw.GetServers() {
			var with []string
			for _, other := range gws {
				ogw := other.Spec.(*networking.Gateway) //nolint:forcetypeassert // gathered above
				if other.ID() == o.ID() || !sameWorkloads(gw.GetSelector(), ogw.GetSelector()) {
					continue
				}
				conflict := slices.ContainsFunc(ogw.GetServers(), func(os *networking.Server) bool {
					return os.GetPort().GetNumber() == srv.GetPort().GetNumber() && os.GetBind() == srv.GetBind() &&
						slices.ContainsFunc(srv.GetHosts(), func(h string) bool { return slices.Contains(os.GetHosts(), h) })
				})
				if conflict {
					with = append(with, other.Meta.Namespace+"/"+other.Meta.Name)
				}
			}
			if len(with) == 0 {
				continue
			}
			slices.Sort(with)
			a.report(CodeConflictingGateways, refOf(o), fmt.Sprintf("spec.servers[%d]", i),
				"conflict with gateways %s (workload selector %s, port %d, hosts %s)", strings.Join(with, ","), selectorString(gw.GetSelector()), srv.GetPort().GetNumber(), strings.Join(srv.GetHosts(), ","))
		}
	}
}

// gatewayCertificates is Istio's CertificateAnalyzer
// (gateway/certificate.go, IST0138): a TLS server of a Gateway with the
// certificate (the same credentialName, or the same serverCertificate and
// privateKey files) of a server of another Gateway whose selector
// includes this one's. A client that reuses an HTTP/2 connection for both
// gateways' hosts (the certificate covers them) reaches the wrong
// gateway's routes and gets 404s.
func (a *analysis) gatewayCertificates() {
	var gws []*istio.Object
	for _, o := range a.in.Objects {
		if _, ok := o.Spec.(*networking.Gateway); ok {
			gws = append(gws, o)
		}
	}
	sameCertificate := func(x, y *networking.ServerTLSSettings) bool {
		switch {
		case x.GetCredentialName() != "" || y.GetCredentialName() != "":
			return x.GetCredentialName() == y.GetCredentialName()
		case x.GetServerCertificate() == "" || x.GetPrivateKey() == "":
			return false
		}
		return x.GetServerCertificate() == y.GetServerCertificate() && x.GetPrivateKey() == y.GetPrivateKey()
	}
	for _, o := range gws {
		gw := o.Spec.(*networking.Gateway) //nolint:forcetypeassert // gathered above
		for i, srv := range gw.GetServers() {
			if srv.GetTls() == nil {
				continue
			}
			var with []string
			for _, other := range gws {
				ogw := other.Spec.(*networking.Gateway) //nolint:forcetypeassert // gathered above
				// Istio's selectorSubset: the other's selector has every
				// label of this one's.
				if other.ID() == o.ID() || !model.LabelsMatch(gw.GetSelector(), ogw.GetSelector()) {
					continue
				}
				if slices.ContainsFunc(ogw.GetServers(), func(os *networking.Server) bool {
					return os.GetTls() != nil && sameCertificate(srv.GetTls(), os.GetTls())
				}) {
					with = append(with, other.Meta.Namespace+"/"+other.Meta.Name)
				}
			}
			if len(with) == 0 {
				continue
			}
			slices.Sort(with)
			a.report(CodeGatewayDuplicateCertificate, refOf(o), fmt.Sprintf("spec.servers[%d].tls", i),
				"the certificate is also served by gateways %s on the same workloads: clients that reuse HTTP/2 connections across their hosts may get 404s", strings.Join(with, ","))
		}
	}
}

// ingressSubsets is Istio's DestinationHostAnalyzer.analyzeSubset
// (IST0140): a route of a VirtualService bound to a Gateway sends to a
// host without a subset while another VirtualService sends to that host's
// subsets. The gateway's requests go to the host as a whole: the other
// VirtualService's subset rules do not apply to them (a gateway is not
// routed twice).
func (a *analysis) ingressSubsets() {
	type withSubsets struct {
		ref   Ref
		hosts map[string]bool // destination hosts routed by subset, resolved
	}
	var subsetted []withSubsets
	for _, o := range a.in.Objects {
		vs, ok := o.Spec.(*networking.VirtualService)
		if !ok {
			continue
		}
		hosts := map[string]bool{}
		for _, h := range vs.GetHttp() {
			for _, d := range h.GetRoute() {
				if d.GetDestination().GetSubset() != "" {
					hosts[model.ResolveHost(d.GetDestination().GetHost(), o.Meta.Namespace, a.suffix)] = true
				}
			}
		}
		if len(hosts) > 0 {
			subsetted = append(subsetted, withSubsets{refOf(o), hosts})
		}
	}
	for _, o := range a.in.Objects {
		vs, ok := o.Spec.(*networking.VirtualService)
		if !ok || len(vs.GetGateways()) == 0 || (len(vs.GetGateways()) == 1 && vs.GetGateways()[0] == "mesh") {
			continue
		}
		for i, h := range vs.GetHttp() {
			for j, d := range h.GetRoute() {
				if d.GetDestination().GetSubset() != "" {
					continue
				}
				host := model.ResolveHost(d.GetDestination().GetHost(), o.Meta.Namespace, a.suffix)
				var others []string // Istio reports each; one message names them all
				for _, other := range subsetted {
					if other.ref != refOf(o) && other.hosts[host] {
						others = append(others, other.ref.Namespace+"/"+other.ref.Name)
					}
				}
				if len(others) > 0 {
					slices.Sort(others)
					a.report(CodeIngressRouteRulesNotAffected, refOf(o), fmt.Sprintf("spec.http[%d].route[%d].destination.host", i, j),
						"subsets in VirtualService %s have no effect on the requests of this gateway VirtualService: it routes to host %s as a whole", strings.Join(others, ", "), d.GetDestination().GetHost())
				}
			}
		}
	}
}

// selectorString is a label selector as Kubernetes prints one: its
// key=value pairs by key, comma-separated.
func selectorString(sel map[string]string) string {
	parts := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+"="+sel[k])
	}
	return strings.Join(parts, ",")
}

// claimRoutesAuthenticated: a VirtualService routing on JWT claims
// (@request.auth.claims) through a Gateway whose workloads no
// RequestAuthentication applies to, as Istio's JWTClaimRouteAnalyzer
// (IST0149): no token is verified there, so no claim is ever seen and
// those routes never match.
func (a *analysis) claimRoutesAuthenticated() {
	if !a.in.HaveWorkloads {
		return
	}
	for _, o := range a.in.Objects {
		vs, ok := o.Spec.(*networking.VirtualService)
		if !ok {
			continue
		}
		claim := ""
		for _, h := range vs.GetHttp() {
			for _, m := range h.GetMatch() {
				for _, set := range []map[string]*networking.StringMatch{m.GetHeaders(), m.GetWithoutHeaders()} {
					for _, k := range slices.Sorted(maps.Keys(set)) {
						if _, ok := authz.RoutingClaim(k); ok && claim == "" {
							claim = k
						}
					}
				}
			}
		}
		if claim == "" {
			continue
		}
		for i, g := range vs.GetGateways() {
			gw := a.gatewayObjs[gatewayKey(o.Meta.Namespace, g)]
			if g == model.MeshGateway || gw == nil {
				continue
			}
			sel := gw.Spec.(*networking.Gateway).GetSelector() //nolint:forcetypeassert // gatewayObjs holds Gateways
			for _, w := range a.workloads {
				if !model.LabelsMatch(sel, w.Labels) || len(a.pc.WorkloadRequestAuthentications(w.Namespace, w.Labels)) > 0 {
					continue
				}
				a.report(CodeClaimRouteWithoutAuthn, refOf(o), fmt.Sprintf("spec.gateways[%d]", i),
					"the virtual service uses the JWT claim based routing (key: %s) but found no request authentication for the gateway (%s) pod (%s/%s): a RequestAuthentication must apply to the gateway's pods to verify the token and make its claims available for routing",
					claim, gw.Key(), w.Namespace, w.Name)
			}
		}
	}
}

// selectorConflicts: Sidecars of a namespace that select the same
// workload, or that have no selector (Istio's sidecar SelectorAnalyzer:
// IST0110, IST0111), and Telemetries that select the same workload
// (Istio's telemetry SelectorAnalyzer, IST0159; those without a selector
// are telemetrySelectors'): which one applies is undefined.
func (a *analysis) selectorConflicts() {
	type kindOf struct {
		selector func(o *istio.Object) (map[string]string, bool) // false: not of the kind
		code     Code
		plural   string
	}
	for _, k := range []kindOf{
		{func(o *istio.Object) (map[string]string, bool) {
			s, ok := o.Spec.(*networking.Sidecar)
			return s.GetWorkloadSelector().GetLabels(), ok
		}, CodeConflictingSidecarSelectors, "Sidecars"},
		{func(o *istio.Object) (map[string]string, bool) {
			t, ok := o.Spec.(*telemetry.Telemetry)
			return t.GetSelector().GetMatchLabels(), ok
		}, CodeConflictingTelemetrySelectors, "Telemetries"},
	} {
		bySelected := map[string][]*istio.Object{} // workload ("ns/kind/name") → the objects selecting it
		var order []string
		withoutSelector := map[string][]*istio.Object{}
		for _, o := range a.in.Objects {
			sel, ok := k.selector(o)
			if !ok {
				continue
			}
			if len(sel) == 0 {
				withoutSelector[o.Meta.Namespace] = append(withoutSelector[o.Meta.Namespace], o)
				continue
			}
			if !a.in.HaveWorkloads {
				continue
			}
			for _, w := range a.workloads {
				if w.Namespace == o.Meta.Namespace && model.LabelsMatch(sel, w.Labels) {
					key := w.Namespace + "/" + w.Kind + "/" + w.Name
					if bySelected[key] == nil {
						order = append(order, key)
					}
					bySelected[key] = append(bySelected[key], o)
				}
			}
		}
		for _, key := range order {
			list := bySelected[key]
			if len(list) < 2 {
				continue
			}
			parts := strings.SplitN(key, "/", 3)
			for _, o := range list {
				a.report(k.code, refOf(o), "spec", "the %s %s in namespace %s select the same workload %s %s, which can lead to undefined behavior",
					k.plural, objectNames(list), parts[0], parts[1], parts[2])
			}
		}
		if k.code != CodeConflictingSidecarSelectors {
			continue
		}
		for ns, list := range withoutSelector {
			if len(list) < 2 {
				continue
			}
			for _, o := range list {
				a.report(CodeMultipleSidecarsWithoutSelector, refOf(o), "", "the Sidecars %s in namespace %s have no workload selector, which can lead to undefined behavior", objectNames(list), ns)
			}
		}
	}
}

// objectNames are the objects' names, sorted and comma-separated.
func objectNames(os []*istio.Object) string {
	names := make([]string, len(os))
	for i, o := range os {
		names[i] = o.Meta.Name
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// telemetryProviders: a Telemetry's access logging that names no
// provider while the mesh has no default one, as Istio's
// ProviderAnalyzer (IST0157): it then speaks only for the providers a
// Telemetry above it names (model.MergeLogs), and is ignored where none
// does.
func (a *analysis) telemetryProviders() {
	if len(a.in.Mesh.GetDefaultProviders().GetAccessLogging()) > 0 {
		return
	}
	for _, o := range a.in.Objects {
		t, ok := o.Spec.(*telemetry.Telemetry)
		if !ok {
			continue
		}
		for i, l := range t.GetAccessLogging() {
			if l.GetDisabled().GetValue() || len(l.GetProviders()) > 0 {
				continue
			}
			a.report(CodeTelemetryWithoutProvider, refOf(o), fmt.Sprintf("spec.accessLogging[%d]", i),
				"access logging names no provider and the mesh has no default access logging provider (defaultProviders.accessLogging): it is ignored unless a Telemetry above it (the root namespace's, its namespace's) names one")
		}
	}
}

// serviceEntryProtocols: ServiceEntries that define one host and port
// with different protocols for the same namespaces, as Istio's
// ConflictingServiceEntryProtocolAnalyzer (IST0177): which protocol the
// proxies use for it is undefined. Keyed by where each is exported (each
// exportTo namespace, or everywhere); one exported everywhere conflicts
// with one exported to a namespace.
func (a *analysis) serviceEntryProtocols() {
	type key struct {
		scope, host string
		port        uint32
	}
	type entry struct {
		protocol string
		o        *istio.Object
	}
	index := map[key][]entry{}
	var keys []key
	for _, o := range a.in.Objects {
		se, ok := o.Spec.(*networking.ServiceEntry)
		if !ok {
			continue
		}
		for _, sc := range exportScopes(se.GetExportTo(), o.Meta.Namespace) {
			for _, h := range se.GetHosts() {
				for _, p := range se.GetPorts() {
					k := key{sc, h, p.GetNumber()}
					if index[k] == nil {
						keys = append(keys, k)
					}
					index[k] = append(index[k], entry{strings.ToUpper(p.GetProtocol()), o})
				}
			}
		}
	}
	reported := map[istio.ID]bool{}
	for _, k := range keys {
		entries := slices.Clone(index[k])
		if k.scope != "*" {
			entries = append(entries, index[key{"*", k.host, k.port}]...)
		}
		var protocols, names []string
		for _, e := range entries {
			protocols = append(protocols, e.protocol)
			names = append(names, e.o.Meta.Namespace+"/"+e.o.Meta.Name)
		}
		slices.Sort(protocols)
		slices.Sort(names)
		if protocols = slices.Compact(protocols); len(protocols) < 2 {
			continue
		}
		names = slices.Compact(names)
		for _, e := range entries {
			if reported[e.o.ID()] {
				continue
			}
			reported[e.o.ID()] = true
			a.report(CodeConflictingServiceEntryProtocol, refOf(e.o), "spec.ports",
				"multiple ServiceEntries (%s) define the same host %q and port %d with conflicting protocols (%s)", strings.Join(names, ", "), k.host, k.port, strings.Join(protocols, ", "))
		}
	}
}

// exportScopes are where an object of namespace ns with exportTo is
// visible, as Istio's analyzers key it (exportToScopes): "*" for
// everywhere (no exportTo, or "*" among it), else each namespace named,
// "." being ns.
func exportScopes(exportTo []string, ns string) []string {
	if len(exportTo) == 0 || slices.Contains(exportTo, "*") {
		return []string{"*"}
	}
	var scopes []string
	for _, e := range exportTo {
		if e == "." {
			e = ns
		}
		if !slices.Contains(scopes, e) {
			scopes = append(scopes, e)
		}
	}
	return scopes
}

// namespaceInjection: a namespace labelled both istio-injection and
// istio.io/rev (Istio's injection analyzer, IST0123: istio-injection
// wins, as the webhooks select), and one holding workloads with neither
// (IST0102, Info: they get no sidecar). The system namespaces and the
// mesh's root namespace are never injected and not reported.
func (a *analysis) namespaceInjection() {
	withWorkloads := map[string]bool{}
	for _, w := range a.workloads {
		withWorkloads[w.Namespace] = true
	}
	for _, ns := range slices.Sorted(maps.Keys(a.in.Namespaces)) {
		if slices.Contains([]string{"kube-system", "kube-public", "kube-node-lease", "local-path-storage", a.pc.RootNamespace}, ns) {
			continue
		}
		labels := a.in.Namespaces[ns]
		injection, hasInjection := labels["istio-injection"]
		rev, hasRev := labels[controlplane.RevisionLabel]
		ref := Ref{Kind: "Namespace", Name: ns}
		switch {
		case hasInjection && hasRev:
			a.report(CodeNamespaceMultipleInjectionLabels, ref, "metadata.labels",
				"the namespace has more than one type of injection labels [istio-injection istio.io/rev]: istio-injection=%s wins, and istio.io/rev=%s is not used; keep only one", injection, rev)
		case !hasInjection && !hasRev && withWorkloads[ns]:
			a.report(CodeNamespaceNotInjected, ref, "metadata.labels",
				"the namespace is not enabled for Istio injection: run 'kubectl label namespace %s istio-injection=enabled' to enable it, or 'kubectl label namespace %s istio-injection=disabled' to explicitly mark it as not needing injection", ns, ns)
		}
	}
}
