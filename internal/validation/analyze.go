package validation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
)

// Input is the configuration Analyze looks at, as one world: galley's
// registry and config (live), local files, or both with files overlaid.
type Input struct {
	// Objects are the Istio objects, each once (the caller resolves
	// overlays). ServiceEntries' hosts join Services here.
	Objects []*istio.Object
	// Services are Kubernetes Services in registry form (Services made
	// from ServiceEntries are derived from Objects: leave them out).
	Services []*registryv1.Service
	// Endpoints are the Kubernetes Services' EndpointSets.
	Endpoints []*registryv1.EndpointSet
	// Workloads are workloads the endpoints do not list: the Pods and
	// Pod templates of the input files.
	Workloads []Workload
	// Namespaces are the namespaces the input holds, with their labels
	// (live: the cluster's; files: their Namespace objects); the
	// namespace checks look at these only.
	Namespaces map[string]map[string]string
	// Mesh is the mesh configuration; nil is Istio's defaults.
	Mesh *meshv1alpha1.MeshConfig
	// DomainSuffix qualifies short hosts (default cluster.local).
	DomainSuffix string
	// HaveServices and HaveWorkloads say whether the input holds the
	// mesh's Services and its workloads (live analysis: both; files:
	// whether they hold any). The analyzers that need them run only then
	// and say so otherwise (CodeAnalyzerSkipped), rather than call every
	// host unknown.
	HaveServices, HaveWorkloads bool
	// Admitted are the objects galley serves already (live analysis):
	// they may carry galley's internal annotations, which it refuses on
	// what a user writes (files).
	Admitted map[istio.ID]bool
}

// Workload is a workload by its labels: a Pod, or the Pod template of a
// Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob.
type Workload struct {
	Kind, Namespace, Name string
	Labels                map[string]string
}

// Ref names the object a message is about.
type Ref struct {
	Kind, Namespace, Name string
}

func (r Ref) String() string {
	if r.Name == "" {
		return r.Kind
	}
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

func refOf(o *istio.Object) Ref {
	return Ref{Kind: o.Kind.Kind, Namespace: o.Meta.Namespace, Name: o.Meta.Name}
}

// Message is one finding of Analyze.
type Message struct {
	Code   Code
	Object Ref
	// Path is the field, e.g. "spec.http[0].route[1].destination.host";
	// empty for the object as a whole.
	Path string
	Text string
}

// Severity is the message's code's.
func (m Message) Severity() Severity { return m.Code.Severity() }

func (m Message) String() string {
	s := fmt.Sprintf("%s [%s] (%s)", m.Severity(), m.Code, m.Object)
	if m.Path != "" {
		s += " " + m.Path + ":"
	}
	return s + " " + m.Text
}

// Analyze validates every object (as galley does) and runs the
// cross-object analyzers over the whole input. It is pure; messages are
// ordered by object, then path, then code.
func Analyze(in Input) []Message {
	a := newAnalysis(in)
	subsets := NewSubsetIndex(in.Objects, a.suffix)
	for _, o := range in.Objects {
		r := validate(o, subsets, in.Admitted[o.ID()])
		for _, is := range slices.Concat(r.Errors, r.Warnings) {
			a.report(is.Code, refOf(o), is.Path, "%s", is.Message)
		}
	}
	a.virtualServices()
	a.destinationRules()
	a.sidecars()
	a.gateways()
	a.selectors()
	a.servicePorts()
	a.certificateVerification()
	a.serviceEntryAddresses()
	a.telemetrySelectors()
	a.meshHostConflicts()
	a.gatewayConflicts()
	a.gatewayCertificates()
	a.ingressSubsets()
	a.claimRoutesAuthenticated()
	a.selectorConflicts()
	a.telemetryProviders()
	a.serviceEntryProtocols()
	a.namespaceInjection()
	if !in.HaveServices {
		a.report(CodeAnalyzerSkipped, Ref{Kind: "Analysis"}, "", "no Services or ServiceEntries in the input: the host checks (%s, %s, %s, %s) did not run",
			CodeHostNotFound, CodeUnknownDestRuleHost, CodeSidecarEgressNothing, CodeGatewayPortNotOnService)
	}
	if !in.HaveWorkloads {
		a.report(CodeAnalyzerSkipped, Ref{Kind: "Analysis"}, "", "no workloads (Pods, Deployments, WorkloadEntries) in the input: the selector checks (%s, %s, %s, %s) did not run",
			CodeSubsetSelectsNoWorkload, CodeGatewaySelectsNoWorkload, CodeSelectorMatchesNothing, CodeMTLSConflict)
	}
	slices.SortStableFunc(a.out, func(x, y Message) int {
		return cmp.Or(
			cmp.Compare(x.Object.Kind, y.Object.Kind), cmp.Compare(x.Object.Namespace, y.Object.Namespace), cmp.Compare(x.Object.Name, y.Object.Name),
			cmp.Compare(x.Path, y.Path), cmp.Compare(x.Code, y.Code), cmp.Compare(x.Text, y.Text))
	})
	return slices.CompactFunc(a.out, func(x, y Message) bool { return x == y })
}

type analysis struct {
	in     Input
	suffix string
	pc     *model.PushContext
	// services are every Service: Kubernetes' and ServiceEntries'.
	services    []*registryv1.Service
	workloads   []Workload
	gatewayObjs map[string]*istio.Object // namespace/name
	out         []Message
}

func newAnalysis(in Input) *analysis {
	a := &analysis{in: in, suffix: cmp.Or(in.DomainSuffix, model.DefaultDomainSuffix), gatewayObjs: map[string]*istio.Object{}}
	store := model.NewStore()
	if in.Mesh != nil {
		store.PutMesh(in.Mesh)
	}
	var workloadEntries []*istio.Object
	for _, o := range in.Objects {
		if o.Kind.Kind == istio.WorkloadEntry {
			workloadEntries = append(workloadEntries, o)
		}
	}
	for _, o := range in.Objects {
		store.PutObject(o)
		switch o.Kind.Kind {
		case istio.ServiceEntry:
			svcs, sets := normalize.ServiceEntry(o, workloadEntries)
			for _, s := range svcs {
				store.PutService(s)
			}
			for _, es := range sets {
				store.PutEndpointSet(es)
			}
		case istio.Gateway:
			a.gatewayObjs[o.Key()] = o
		case istio.WorkloadEntry:
			a.workloads = append(a.workloads, Workload{Kind: istio.WorkloadEntry, Namespace: o.Meta.Namespace, Name: o.Meta.Name, Labels: workloadEntryLabels(o)})
		}
	}
	for _, s := range in.Services {
		store.PutService(s)
	}
	for _, es := range in.Endpoints {
		store.PutEndpointSet(es)
	}
	a.pc, _ = store.Build(model.BuildOptions{DomainSuffix: a.suffix}, nil, 1)
	a.services = a.pc.Services()
	a.workloads = append(a.workloads, in.Workloads...)
	for _, svc := range a.services {
		for _, ep := range a.pc.Endpoints(svc) {
			// A ServiceEntry's endpoints are its WorkloadEntries (above)
			// or its own: an inline endpoint with labels is a workload
			// (a VM, or a process of a local run, its proxy carrying
			// those labels); one without is an address only.
			if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY && (ep.GetWorkloadName() != "" || len(ep.GetLabels()) == 0) {
				continue
			}
			a.workloads = append(a.workloads, endpointWorkload(svc, ep))
		}
	}
	return a
}

func workloadEntryLabels(o *istio.Object) map[string]string {
	we, _ := o.Spec.(*networking.WorkloadEntry)
	if l := we.GetLabels(); len(l) > 0 {
		return l
	}
	return o.Meta.Labels
}

func (a *analysis) report(code Code, obj Ref, path, format string, args ...any) {
	a.out = append(a.out, Message{Code: code, Object: obj, Path: path, Text: fmt.Sprintf(format, args...)})
}

// visibleServices returns the services host names (exactly, or through a
// ServiceEntry's wildcard host) that namespace from sees.
func (a *analysis) visibleServices(host, from string) []*registryv1.Service {
	fq := model.ResolveHost(host, from, a.suffix)
	var out []*registryv1.Service
	for _, svc := range a.services {
		if !hostsMeet(svc.GetHostname(), fq) {
			continue
		}
		if svc.GetNamespace() == from || model.ExportedTo(svc.GetExportTo(), a.pc.Mesh.GetDefaultServiceExportTo(), svc.GetNamespace(), from) {
			out = append(out, svc)
		}
	}
	return out
}

// hostsMeet reports whether two hosts name one service: equal, or one a
// wildcard covering the other.
func hostsMeet(a, b string) bool {
	switch {
	case a == b:
		return true
	case strings.HasPrefix(a, "*"):
		return model.HostMatches(a, b)
	case strings.HasPrefix(b, "*"):
		return model.HostMatches(b, a)
	}
	return false
}

// serviceWorkloads returns the workloads behind a service: those its
// selector picks in its namespace, and, for a ServiceEntry or a Service
// without selector, its own endpoints.
func (a *analysis) serviceWorkloads(svc *registryv1.Service) []Workload {
	var out []Workload
	if sel := svc.GetSelector(); len(sel) > 0 {
		for _, w := range a.workloads {
			if w.Namespace == svc.GetNamespace() && model.LabelsMatch(sel, w.Labels) {
				out = append(out, w)
			}
		}
	}
	if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY || len(svc.GetSelector()) == 0 {
		for _, ep := range a.pc.Endpoints(svc) {
			out = append(out, endpointWorkload(svc, ep))
		}
	}
	return out
}

// endpointWorkload is an endpoint of svc as a workload.
func endpointWorkload(svc *registryv1.Service, ep *registryv1.Endpoint) Workload {
	return Workload{
		Kind: "Endpoint", Namespace: cmp.Or(ep.GetWorkloadNamespace(), svc.GetNamespace()), Name: cmp.Or(ep.GetWorkloadName(), ep.GetAddress()), Labels: ep.GetLabels(),
	}
}

// virtualServices: destinations and mirrors naming unknown hosts, and
// gateways that do not exist (Istio's destinationhosts and gateways
// analyzers).
func (a *analysis) virtualServices() {
	for _, o := range a.in.Objects {
		vs, ok := o.Spec.(*networking.VirtualService)
		if !ok {
			continue
		}
		ref := refOf(o)
		host := func(path, h string) {
			if a.in.HaveServices && h != "" && len(a.visibleServices(h, o.Meta.Namespace)) == 0 {
				a.report(CodeHostNotFound, ref, path, "host %q: no Service or ServiceEntry visible from namespace %s has it", h, o.Meta.Namespace)
			}
		}
		for i, h := range vs.GetHttp() {
			p := fmt.Sprintf("spec.http[%d]", i)
			for j, d := range h.GetRoute() {
				host(fmt.Sprintf("%s.route[%d].destination.host", p, j), d.GetDestination().GetHost())
			}
			if m := h.GetMirror(); m != nil {
				host(p+".mirror.host", m.GetHost())
			}
			for j, m := range h.GetMirrors() {
				host(fmt.Sprintf("%s.mirrors[%d].destination.host", p, j), m.GetDestination().GetHost())
			}
			for j, m := range h.GetMatch() {
				a.gatewayRefs(ref, fmt.Sprintf("%s.match[%d].gateways", p, j), m.GetGateways())
			}
		}
		for i, t := range vs.GetTcp() {
			for j, d := range t.GetRoute() {
				host(fmt.Sprintf("spec.tcp[%d].route[%d].destination.host", i, j), d.GetDestination().GetHost())
			}
			for j, m := range t.GetMatch() {
				a.gatewayRefs(ref, fmt.Sprintf("spec.tcp[%d].match[%d].gateways", i, j), m.GetGateways())
			}
		}
		for i, t := range vs.GetTls() {
			for j, d := range t.GetRoute() {
				host(fmt.Sprintf("spec.tls[%d].route[%d].destination.host", i, j), d.GetDestination().GetHost())
			}
			for j, m := range t.GetMatch() {
				a.gatewayRefs(ref, fmt.Sprintf("spec.tls[%d].match[%d].gateways", i, j), m.GetGateways())
			}
		}
		a.gatewayRefs(ref, "spec.gateways", vs.GetGateways())
		a.hostsOnGateways(o, vs)
	}
}

// gatewayKey resolves a gateway name as Istio does: "ns/name", a name in
// namespace ns, or "name.ns.svc.<suffix>".
func gatewayKey(ns, g string) string {
	switch {
	case strings.Contains(g, "/"):
		return g
	case strings.Contains(g, "."):
		parts := strings.SplitN(g, ".", 3)
		return parts[1] + "/" + parts[0]
	}
	return ns + "/" + g
}

// hostsOnGateways: a VirtualService bound to a Gateway none of whose
// servers' hosts (those of the VirtualService's namespace or any) match a
// host of its own, as Istio's GatewayAnalyzer (IST0132,
// vsHostInGateway): the gateway serves it for none of them.
func (a *analysis) hostsOnGateways(o *istio.Object, vs *networking.VirtualService) {
	for i, g := range vs.GetGateways() {
		gw, ok := a.gatewayObjs[gatewayKey(o.Meta.Namespace, g)]
		if g == model.MeshGateway || !ok {
			continue
		}
		var hosts []string
		for _, srv := range gw.Spec.(*networking.Gateway).GetServers() {
			for _, h := range srv.GetHosts() {
				ns, name, scoped := strings.Cut(h, "/")
				switch {
				case !scoped:
					hosts = append(hosts, h)
				case ns == "*" || ns == o.Meta.Namespace || (ns == "." && gw.Meta.Namespace == o.Meta.Namespace):
					hosts = append(hosts, name)
				}
			}
		}
		found := slices.ContainsFunc(hosts, func(gh string) bool {
			return slices.ContainsFunc(vs.GetHosts(), func(vh string) bool { return model.HostMatches(gh, vh) || model.HostMatches(vh, gh) })
		})
		if !found {
			a.report(CodeHostNotFoundInGateway, refOf(o), fmt.Sprintf("spec.gateways[%d]", i),
				"one or more host %v defined in VirtualService %s/%s not found in Gateway %s", vs.GetHosts(), o.Meta.Namespace, o.Meta.Name, gw.Key())
		}
	}
}

// gatewayRefs checks gateway names as Istio resolves them: "ns/name", a
// name in the VirtualService's namespace, or "name.ns.svc.<suffix>".
func (a *analysis) gatewayRefs(ref Ref, path string, names []string) {
	for i, g := range names {
		if g == model.MeshGateway {
			continue
		}
		key := gatewayKey(ref.Namespace, g)
		if a.gatewayObjs[key] == nil {
			a.report(CodeGatewayNotFound, ref, fmt.Sprintf("%s[%d]", path, i), "gateway %q: there is no Gateway %s", g, key)
		}
	}
}

// destinationRules: unknown hosts, subsets selecting no workload (Istio's
// subset analyzer), several DestinationRules for one host, and TLS
// settings a STRICT PeerAuthentication refuses.
func (a *analysis) destinationRules() {
	type hostKey struct{ namespace, host string }
	first := map[hostKey]*istio.Object{}
	drs := slices.Clone(a.in.Objects)
	slices.SortStableFunc(drs, istio.CreationOrder)
	for _, o := range drs {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		ref := refOf(o)
		fq := model.ResolveHost(dr.GetHost(), o.Meta.Namespace, a.suffix)
		if len(dr.GetWorkloadSelector().GetMatchLabels()) == 0 {
			k := hostKey{o.Meta.Namespace, fq}
			if prev := first[k]; prev != nil {
				a.report(CodeConflictingDestRules, ref, "spec.host", "DestinationRule %s is older and also applies to host %s in namespace %s: the two are merged as Istio merges them (this one's subsets the older lacks are added; its traffic policy is used only if the older has none)", prev.Key(), fq, o.Meta.Namespace)
			} else {
				first[k] = o
			}
		}
		if !a.in.HaveServices {
			continue
		}
		svcs := a.visibleServices(dr.GetHost(), o.Meta.Namespace)
		if len(svcs) == 0 {
			a.report(CodeUnknownDestRuleHost, ref, "spec.host", "host %q: no Service or ServiceEntry visible from namespace %s has it", dr.GetHost(), o.Meta.Namespace)
			continue
		}
		if !a.in.HaveWorkloads {
			continue
		}
		for _, svc := range svcs {
			if strings.HasPrefix(svc.GetHostname(), "*") || strings.HasPrefix(fq, "*") {
				continue // a wildcard names no one service's workloads
			}
			ws := a.serviceWorkloads(svc)
			for i, s := range dr.GetSubsets() {
				sel := maps.Clone(s.GetLabels())
				if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY {
					maps.Copy(sel, svc.GetSelector())
				}
				if !slices.ContainsFunc(ws, func(w Workload) bool { return model.LabelsMatch(sel, w.Labels) }) {
					a.report(CodeSubsetSelectsNoWorkload, ref, fmt.Sprintf("spec.subsets[%d].labels", i), "subset %q selects no workload of %s (labels %s)", s.GetName(), svc.GetHostname(), labelString(sel))
				}
			}
			a.mtlsConflicts(ref, dr, svc, ws)
		}
	}
}

// mtlsConflicts reports the DestinationRule's TLS settings (its own and
// per port) that are not ISTIO_MUTUAL toward a port PeerAuthentication
// makes STRICT for a workload behind svc.
func (a *analysis) mtlsConflicts(ref Ref, dr *networking.DestinationRule, svc *registryv1.Service, ws []Workload) {
	if svc.GetLocation() == registryv1.Location_LOCATION_MESH_EXTERNAL || len(ws) == 0 {
		return
	}
	conflict := func(path string, tls *networking.ClientTLSSettings, ports []*registryv1.ServicePort) {
		mode := tls.GetMode()
		if tls == nil || mode == networking.ClientTLSSettings_ISTIO_MUTUAL {
			return
		}
		for _, port := range ports {
			for _, w := range ws {
				if a.pc.WorkloadMTLS(w.Namespace, w.Labels, cmp.Or(port.GetTargetPort(), port.GetNumber())) == model.Strict {
					a.report(CodeMTLSConflict, ref, path+".mode", "TLS mode %s toward port %d of %s, but PeerAuthentication makes %s %s/%s STRICT: its connections are refused",
						mode, port.GetNumber(), svc.GetHostname(), w.Kind, w.Namespace, w.Name)
					return
				}
			}
		}
	}
	levels := map[uint32]bool{}
	for i, pl := range dr.GetTrafficPolicy().GetPortLevelSettings() {
		levels[pl.GetPort().GetNumber()] = true
		for _, port := range svc.GetPorts() {
			if port.GetNumber() == pl.GetPort().GetNumber() {
				conflict(fmt.Sprintf("spec.trafficPolicy.portLevelSettings[%d].tls", i), pl.GetTls(), []*registryv1.ServicePort{port})
			}
		}
	}
	rest := slices.DeleteFunc(slices.Clone(svc.GetPorts()), func(p *registryv1.ServicePort) bool { return levels[p.GetNumber()] })
	conflict("spec.trafficPolicy.tls", dr.GetTrafficPolicy().GetTls(), rest)
}

// sidecars: egress hosts that import nothing.
func (a *analysis) sidecars() {
	if !a.in.HaveServices {
		return
	}
	for _, o := range a.in.Objects {
		sc, ok := o.Spec.(*networking.Sidecar)
		if !ok {
			continue
		}
		for i, eg := range sc.GetEgress() {
			for j, h := range eg.GetHosts() {
				ns, host, ok := strings.Cut(h, "/")
				if !ok || ns == "~" || host == "*" && ns == "*" {
					continue
				}
				if ns == "." {
					ns = o.Meta.Namespace
				}
				if !a.imports(o.Meta.Namespace, ns, host) {
					a.report(CodeSidecarEgressNothing, refOf(o), fmt.Sprintf("spec.egress[%d].hosts[%d]", i, j), "%q imports nothing: no service or VirtualService of %s matches %s", h, nsName(ns), host)
				}
			}
		}
	}
}

func nsName(ns string) string {
	if ns == "*" {
		return "any namespace"
	}
	return "namespace " + ns
}

// imports reports whether a Sidecar of namespace from imports anything
// with egress host ns/host.
func (a *analysis) imports(from, ns, host string) bool {
	for _, svc := range a.services {
		if (ns == "*" || svc.GetNamespace() == ns) && model.HostMatches(host, svc.GetHostname()) &&
			(svc.GetNamespace() == from || model.ExportedTo(svc.GetExportTo(), a.pc.Mesh.GetDefaultServiceExportTo(), svc.GetNamespace(), from)) {
			return true
		}
	}
	for _, vs := range a.pc.VirtualServices() {
		if ns != "*" && vs.Namespace != ns {
			continue
		}
		for _, h := range vs.Hosts {
			if model.HostMatches(host, h) {
				return true
			}
		}
	}
	return false
}

// gateways: a selector that selects no workload, and server ports no
// Service in front of the gateway workloads exposes (Istio's gateway
// analyzer).
func (a *analysis) gateways() {
	if !a.in.HaveWorkloads {
		return
	}
	for _, o := range a.in.Objects {
		gw, ok := o.Spec.(*networking.Gateway)
		if !ok {
			continue
		}
		sel := gw.GetSelector()
		var selected []Workload
		for _, w := range a.workloads {
			if model.LabelsMatch(sel, w.Labels) {
				selected = append(selected, w)
			}
		}
		if len(selected) == 0 {
			a.report(CodeGatewaySelectsNoWorkload, refOf(o), "spec.selector", "the selector %s matches no workload", labelString(sel))
			continue
		}
		if !a.in.HaveServices {
			continue
		}
		ports := map[uint32]bool{}
		for _, svc := range a.services {
			if svc.GetSourceKind() != registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE || len(svc.GetSelector()) == 0 {
				continue
			}
			if !slices.ContainsFunc(selected, func(w Workload) bool {
				return w.Namespace == svc.GetNamespace() && model.LabelsMatch(svc.GetSelector(), w.Labels)
			}) {
				continue
			}
			for _, p := range svc.GetPorts() {
				ports[p.GetNumber()], ports[cmp.Or(p.GetTargetPort(), p.GetNumber())] = true, true
			}
		}
		for i, s := range gw.GetServers() {
			if n := s.GetPort().GetNumber(); n != 0 && !ports[n] {
				a.report(CodeGatewayPortNotOnService, refOf(o), fmt.Sprintf("spec.servers[%d].port.number", i), "port %d is on no port or target port of the Services selecting the gateway workloads (%s)", n, labelString(sel))
			}
		}
	}
}

// selectors: policies and Sidecars whose selector matches no workload in
// their namespace (every namespace for the root namespace's authorization
// and request authentication policies), as Istio's NoMatchingWorkloadsFound.
func (a *analysis) selectors() {
	if !a.in.HaveWorkloads {
		return
	}
	for _, o := range a.in.Objects {
		path, sel := "spec.selector.matchLabels", map[string]string(nil)
		switch s := o.Spec.(type) {
		case *networking.Sidecar:
			path, sel = "spec.workloadSelector.labels", s.GetWorkloadSelector().GetLabels()
		case *security.AuthorizationPolicy:
			sel = s.GetSelector().GetMatchLabels()
		case *security.PeerAuthentication:
			sel = s.GetSelector().GetMatchLabels()
		case *security.RequestAuthentication:
			sel = s.GetSelector().GetMatchLabels()
		default:
		}
		if len(sel) == 0 {
			continue
		}
		// An AuthorizationPolicy or RequestAuthentication of the root
		// namespace selects in every namespace; a PeerAuthentication or
		// Sidecar selects in its own only (discovery's lookups, as Istio's).
		root := o.Meta.Namespace == a.pc.RootNamespace && (o.Kind.Kind == istio.AuthorizationPolicy || o.Kind.Kind == istio.RequestAuthentication)
		if !slices.ContainsFunc(a.workloads, func(w Workload) bool {
			return (root || w.Namespace == o.Meta.Namespace) && model.LabelsMatch(sel, w.Labels)
		}) {
			a.report(CodeSelectorMatchesNothing, refOf(o), path, "the selector %s matches no workload in %s", labelString(sel), scopeName(root, o.Meta.Namespace))
		}
	}
}

func scopeName(root bool, ns string) string {
	if root {
		return "the mesh"
	}
	return "namespace " + ns
}

// servicePorts: Kubernetes Service ports without a protocol (Istio's
// PortNameIsNotUnderNamingConvention), system namespaces aside.
func (a *analysis) servicePorts() {
	for _, svc := range a.in.Services {
		if svc.GetSourceKind() != registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE || systemNamespace(svc.GetNamespace()) {
			continue
		}
		// An ExternalName Service is the only Kubernetes one resolved by
		// DNS (normalize/kube.Service). Istio's PortNameAnalyzer says
		// IST0150 for its ports, counting a port named tcp too.
		externalName := svc.GetResolution() == registryv1.Resolution_RESOLUTION_DNS
		for _, p := range svc.GetPorts() {
			if externalName && (p.GetProtocol() == registryv1.Protocol_PROTOCOL_UNSPECIFIED || p.GetName() == "tcp") {
				a.report(CodeExternalNamePortName, Ref{Kind: "Service", Namespace: svc.GetNamespace(), Name: svc.GetName()}, "spec.ports",
					"port %d (%q) of an ExternalName Service: name it for its protocol (http-, tls-, ..., or set appProtocol): the proxies may not forward TCP traffic to it, or unmatched traffic on it, correctly", p.GetNumber(), p.GetName())
				continue
			}
			if p.GetProtocol() == registryv1.Protocol_PROTOCOL_UNSPECIFIED {
				// Registry ports are sorted by number, not in the Service's
				// order: the message names the port.
				a.report(CodePortNameWithoutProtocol, Ref{Kind: "Service", Namespace: svc.GetNamespace(), Name: svc.GetName()}, "spec.ports",
					"port %d (%q) has no appProtocol and its name has no protocol prefix (http-, grpc-, tcp-, ...)", p.GetNumber(), p.GetName())
			}
		}
	}
}

func systemNamespace(ns string) bool {
	switch ns {
	case "kube-system", "kube-public", "kube-node-lease", "local-path-storage":
		return true
	}
	return false
}

func labelString(l map[string]string) string {
	if len(l) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}
