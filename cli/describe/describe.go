// Package describe is `flotilla x describe pod`: what configuration
// applies to one workload and why, as istioctl experimental describe pod
// tells it: the Services it is an endpoint of, the DestinationRule and
// VirtualService its namespace's sidecars use for each (the subsets that
// select it, the routes that reach it), the mTLS mode its
// PeerAuthentications make, and the AuthorizationPolicies,
// RequestAuthentications and Sidecar that apply to it. It is decided
// from galley's configuration and registry by the same push context
// discovery builds, not from a proxy's config dump.
package describe

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Workload is the pod described.
type Workload struct {
	Name, Namespace string
	ServiceAccount  string
	IP              string
	Labels          map[string]string
}

// FindWorkload finds the pod name in namespace among the registry's
// endpoints (galley's, from Kubernetes' EndpointSlices and
// WorkloadEntries): its labels, service account and address.
func FindWorkload(pc *model.PushContext, name, namespace string) (Workload, bool) {
	for _, svc := range pc.Services() {
		for _, ep := range pc.Endpoints(svc) {
			if ep.GetWorkloadName() == name && ep.GetWorkloadNamespace() == namespace {
				return Workload{Name: name, Namespace: namespace, ServiceAccount: ep.GetServiceAccount(), IP: ep.GetAddress(), Labels: ep.GetLabels()}, true
			}
		}
	}
	return Workload{}, false
}

// services are the Services w is an endpoint of: one of their endpoints
// is it, or (a Kubernetes Service of its namespace) their selector
// selects it.
func services(pc *model.PushContext, w Workload) []*registryv1.Service {
	var out []*registryv1.Service
	for _, svc := range pc.Services() {
		selects := svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE && svc.GetNamespace() == w.Namespace &&
			len(svc.GetSelector()) > 0 && model.LabelsMatch(svc.GetSelector(), w.Labels)
		if !selects {
			selects = slices.ContainsFunc(pc.Endpoints(svc), func(ep *registryv1.Endpoint) bool {
				return ep.GetWorkloadName() == w.Name && ep.GetWorkloadNamespace() == w.Namespace
			})
		}
		if selects {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b *registryv1.Service) int { return cmp.Compare(a.GetHostname(), b.GetHostname()) })
	return out
}

const rule = "--------------------\n"

// Describe writes what applies to w and why.
func Describe(out io.Writer, pc *model.PushContext, w Workload) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Pod: %s.%s\n", w.Name, w.Namespace)
	if w.ServiceAccount != "" {
		fmt.Fprintf(&b, "   Identity: spiffe://%s/ns/%s/sa/%s\n", pc.TrustDomain, w.Namespace, w.ServiceAccount)
	}
	if w.IP != "" {
		fmt.Fprintf(&b, "   Address: %s\n", w.IP)
	}
	if len(w.Labels) > 0 {
		keys := slices.Sorted(maps.Keys(w.Labels))
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + w.Labels[k]
		}
		fmt.Fprintf(&b, "   Labels: %s\n", strings.Join(parts, ","))
	}
	proxy := &model.Proxy{Type: model.SidecarProxy, Namespace: w.Namespace, Labels: w.Labels, ServiceAccount: w.ServiceAccount}
	scope := pc.Scope(proxy)
	svcs := services(pc, w)
	if len(svcs) == 0 {
		b.WriteString("   Not an endpoint of any Service or ServiceEntry: nothing routes to it by name\n")
	}
	for _, svc := range svcs {
		b.WriteString(rule)
		describeService(&b, pc, scope, proxy, svc, w)
	}
	b.WriteString(rule)
	describePolicies(&b, pc, scope, w)
	_, err := io.WriteString(out, b.String())
	return err
}

func describeService(b *strings.Builder, pc *model.PushContext, scope *model.Scope, proxy *model.Proxy, svc *registryv1.Service, w Workload) {
	kind := "Service"
	if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY {
		kind = "ServiceEntry host"
	}
	fmt.Fprintf(b, "%s: %s\n", kind, svc.GetHostname())
	for _, p := range svc.GetPorts() {
		target := p.GetTargetPort()
		for _, ep := range pc.Endpoints(svc) {
			if ep.GetWorkloadName() != w.Name || ep.GetWorkloadNamespace() != w.Namespace {
				continue
			}
			for _, epp := range ep.GetPorts() {
				if epp.GetServicePortName() == p.GetName() {
					target = epp.GetNumber()
				}
			}
		}
		fmt.Fprintf(b, "   Port: %s %d/%s targets pod port %d\n", p.GetName(), p.GetNumber(), registry.ProtocolName(p.GetProtocol()), target)
	}
	var matching []string
	dr := scope.DestinationRule(proxy, svc)
	if dr == nil {
		b.WriteString("No DestinationRule: its sidecars' default traffic policy (mTLS by auto mTLS where the pod has a sidecar)\n")
	} else {
		fmt.Fprintf(b, "DestinationRule: %s/%s for %q\n", dr.Namespace, dr.Name, dr.Host)
		var non []string
		for _, ss := range dr.Spec.GetSubsets() {
			if model.LabelsMatch(ss.GetLabels(), w.Labels) {
				matching = append(matching, ss.GetName())
			} else {
				non = append(non, ss.GetName())
			}
		}
		switch {
		case len(dr.Spec.GetSubsets()) == 0:
			b.WriteString("   No subsets\n")
		case len(matching) > 0:
			fmt.Fprintf(b, "   Matching subsets: %s\n", strings.Join(matching, ","))
			if len(non) > 0 {
				fmt.Fprintf(b, "      (Non-matching subsets %s)\n", strings.Join(non, ","))
			}
		default:
			fmt.Fprintf(b, "   No matching subsets (the DestinationRule has %s)\n", strings.Join(non, ","))
		}
		if tls := dr.Spec.GetTrafficPolicy().GetTls(); tls != nil {
			fmt.Fprintf(b, "   Traffic Policy TLS Mode: %s\n", tls.GetMode())
		}
		if len(dr.MergedFrom) > 0 {
			fmt.Fprintf(b, "   Merged with: %s\n", strings.Join(dr.MergedFrom, ","))
		}
	}
	vs := scope.VirtualService(svc.GetHostname())
	if vs == nil {
		b.WriteString("No VirtualService: requests go to every endpoint of the service\n")
		return
	}
	fmt.Fprintf(b, "VirtualService: %s/%s\n", vs.Namespace, vs.Name)
	describeRoutes(b, vs, svc.GetHostname(), pc.DomainSuffix, matching)
}

// describeRoutes says which HTTP and TCP routes of vs send requests to
// host, and whether to a subset that selects the pod, as istioctl's
// printVirtualService does.
func describeRoutes(b *strings.Builder, vs *model.VirtualService, host, suffix string, matching []string) {
	var reach, miss []string
	type dest struct {
		d      *networking.Destination
		weight int32
	}
	check := func(kind string, i int, match string, dests []dest) {
		for _, d := range dests {
			if model.ResolveHost(d.d.GetHost(), vs.Namespace, suffix) != host {
				continue
			}
			line := fmt.Sprintf("%s route #%d", kind, i)
			if match != "" {
				line += " for " + match
			}
			w := d.weight
			if w == 0 && len(dests) == 1 {
				w = 100
			}
			subset := d.d.GetSubset()
			switch {
			case subset == "":
				reach = append(reach, fmt.Sprintf("%s: weight %d", line, w))
			case slices.Contains(matching, subset):
				reach = append(reach, fmt.Sprintf("%s: subset %s, weight %d", line, subset, w))
			default:
				miss = append(miss, fmt.Sprintf("%s: non-matching subset %s", line, subset))
			}
		}
	}
	for i, r := range vs.Spec.GetHttp() {
		var ds []dest
		for _, d := range r.GetRoute() {
			ds = append(ds, dest{d.GetDestination(), d.GetWeight()})
		}
		check("HTTP", i, httpMatch(r.GetMatch()), ds)
	}
	for i, r := range vs.Spec.GetTcp() {
		var ds []dest
		for _, d := range r.GetRoute() {
			ds = append(ds, dest{d.GetDestination(), d.GetWeight()})
		}
		check("TCP", i, "", ds)
	}
	for _, l := range reach {
		fmt.Fprintf(b, "   Reaches the pod: %s\n", l)
	}
	for _, l := range miss {
		fmt.Fprintf(b, "   Not to the pod: %s\n", l)
	}
	if len(reach) == 0 {
		n := len(vs.Spec.GetHttp()) + len(vs.Spec.GetTcp())
		fmt.Fprintf(b, "   WARNING: No destinations match pod subsets (checked %d HTTP/TCP routes)\n", n)
		if len(miss) == 0 {
			b.WriteString("      (no route sends to this host)\n")
		}
	}
}

// httpMatch summarises a route's matches ("" for every request).
func httpMatch(ms []*networking.HTTPMatchRequest) string {
	var parts []string
	for _, m := range ms {
		var cond []string
		if u := m.GetUri(); u != nil {
			switch {
			case u.GetExact() != "":
				cond = append(cond, "uri "+u.GetExact())
			case u.GetPrefix() != "":
				cond = append(cond, "uri "+u.GetPrefix()+"*")
			case u.GetRegex() != "":
				cond = append(cond, "uri ~"+u.GetRegex())
			}
		}
		for _, k := range slices.Sorted(maps.Keys(m.GetHeaders())) {
			cond = append(cond, "header "+k)
		}
		if m.GetPort() != 0 {
			cond = append(cond, "port "+strconv.Itoa(int(m.GetPort())))
		}
		if len(cond) == 0 {
			cond = append(cond, "everything")
		}
		parts = append(parts, strings.Join(cond, " and "))
	}
	return strings.Join(parts, "; ")
}

func describePolicies(b *strings.Builder, pc *model.PushContext, scope *model.Scope, w Workload) {
	mode := "PERMISSIVE"
	switch pc.WorkloadMTLS(w.Namespace, w.Labels, 0) {
	case model.Strict:
		mode = "STRICT"
	case model.Disable:
		mode = "DISABLE"
	}
	fmt.Fprintf(b, "Effective PeerAuthentication:\n   Workload mTLS mode: %s\n", mode)
	var applied []string
	for _, pa := range pc.WorkloadPeerAuthentications(w.Namespace, w.Labels) {
		if n := pa.Namespace + "/" + pa.Name; !slices.Contains(applied, n) {
			applied = append(applied, n)
		}
	}
	if len(applied) > 0 {
		fmt.Fprintf(b, "Applied PeerAuthentication:\n   %s\n", strings.Join(applied, ", "))
	}
	if aps := pc.WorkloadAuthorizationPolicies(w.Namespace, w.Labels); len(aps) > 0 {
		b.WriteString("Applied AuthorizationPolicies:\n")
		for _, ap := range aps {
			dry := ""
			if ap.DryRun {
				dry = ", dry run"
			}
			fmt.Fprintf(b, "   %s/%s (%s%s)\n", ap.Namespace, ap.Name, ap.Spec.GetAction(), dry)
		}
	}
	if ras := pc.WorkloadRequestAuthentications(w.Namespace, w.Labels); len(ras) > 0 {
		b.WriteString("Applied RequestAuthentications:\n")
		for _, ra := range ras {
			fmt.Fprintf(b, "   %s/%s\n", ra.Namespace, ra.Name)
		}
	}
	if sc := scope.Sidecar; sc != nil {
		fmt.Fprintf(b, "Sidecar: %s/%s\n", sc.Namespace, sc.Name)
	} else {
		b.WriteString("Sidecar: none (the sidecar sees every service exported to its namespace)\n")
	}
}
