package model

import (
	"maps"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// mergeDelegates replaces, in every VirtualService with hosts, each http
// entry that delegates by the delegate VirtualService's entries merged
// under it, as Istio's mergeVirtualServicesIfNeeded does: a delegate is
// "name" in the root's namespace or "namespace"; it must be exported to
// the root's namespace; a missing or hidden delegate drops only that
// entry (reported on the root). A delegate's destinations are resolved
// in its own namespace. The specs in the store are not modified.
func mergeDelegates(vss []*VirtualService, defaultExportTo []string, domainSuffix string) {
	byName := map[string]*VirtualService{}
	for _, vs := range vss {
		if len(vs.Spec.GetHosts()) == 0 {
			byName[vs.Namespace+"/"+vs.Name] = vs
		}
	}
	for _, root := range vss {
		if len(root.Spec.GetHosts()) == 0 || !hasDelegate(root.Spec) {
			continue
		}
		merged := proto.CloneOf(root.Spec)
		merged.Http = nil
		for _, hr := range root.Spec.GetHttp() {
			d := hr.GetDelegate()
			if d == nil {
				merged.Http = append(merged.Http, hr)
				continue
			}
			ns := d.GetNamespace()
			if ns == "" {
				ns = root.Namespace
			}
			del := byName[ns+"/"+d.GetName()]
			switch {
			case del == nil:
				root.Problems = append(root.Problems, "delegate VirtualService "+ns+"/"+d.GetName()+" not found; its http entry is left out")
				continue
			case !ExportedTo(del.Spec.GetExportTo(), defaultExportTo, del.Namespace, root.Namespace):
				root.Problems = append(root.Problems, "delegate VirtualService "+ns+"/"+d.GetName()+" is not exported to "+root.Namespace+"; its http entry is left out")
				continue
			}
			for _, sub := range del.Spec.GetHttp() {
				sub = proto.CloneOf(sub)
				resolveDestinations(sub, del.Namespace, domainSuffix)
				if m := mergeHTTPRoute(hr, sub); m != nil {
					merged.Http = append(merged.Http, m)
				} else {
					root.Problems = append(root.Problems, "delegate VirtualService "+ns+"/"+d.GetName()+": route "+sub.GetName()+" matches nothing its root entry matches; left out")
				}
			}
		}
		root.Spec = merged
	}
}

func hasDelegate(vs *networking.VirtualService) bool {
	for _, hr := range vs.GetHttp() {
		if hr.GetDelegate() != nil {
			return true
		}
	}
	return false
}

// resolveDestinations qualifies a delegate route's destination and
// mirror hosts in the delegate's namespace, so they mean the same under
// the root's.
func resolveDestinations(hr *networking.HTTPRoute, ns, domainSuffix string) {
	for _, d := range hr.GetRoute() {
		if d.GetDestination() != nil {
			d.Destination.Host = ResolveHost(d.GetDestination().GetHost(), ns, domainSuffix)
		}
	}
	if m := hr.GetMirror(); m != nil {
		m.Host = ResolveHost(m.GetHost(), ns, domainSuffix)
	}
	for _, m := range hr.GetMirrors() {
		if m.GetDestination() != nil {
			m.Destination.Host = ResolveHost(m.GetDestination().GetHost(), ns, domainSuffix)
		}
	}
}

// mergeHTTPRoute puts a delegate's route under its root entry (Istio's
// mergeHTTPRoute): its matches become the intersections with the root's
// (nil when none intersect), its name "root-delegate", and what it leaves
// unset of rewrite, direct response, timeout, retries, fault, mirrors,
// CORS and headers comes from the root.
func mergeHTTPRoute(root, sub *networking.HTTPRoute) *networking.HTTPRoute {
	matches, ok := mergeMatches(root.GetMatch(), sub.GetMatch())
	if !ok {
		return nil
	}
	sub.Match = matches
	switch {
	case sub.GetName() == "":
		sub.Name = root.GetName()
	case root.GetName() != "":
		sub.Name = root.GetName() + "-" + sub.GetName()
	}
	if sub.Rewrite == nil {
		sub.Rewrite = root.GetRewrite()
	}
	if sub.DirectResponse == nil {
		sub.DirectResponse = root.GetDirectResponse()
	}
	if sub.Timeout == nil {
		sub.Timeout = root.GetTimeout()
	}
	if sub.Retries == nil {
		sub.Retries = root.GetRetries()
	}
	if sub.Fault == nil {
		sub.Fault = root.GetFault()
	}
	if sub.Mirror == nil {
		sub.Mirror = root.GetMirror()
	}
	if sub.MirrorPercentage == nil {
		sub.MirrorPercentage = root.GetMirrorPercentage()
	}
	if sub.Mirrors == nil {
		sub.Mirrors = root.GetMirrors()
	}
	if sub.CorsPolicy == nil {
		sub.CorsPolicy = root.GetCorsPolicy()
	}
	if sub.Headers == nil {
		sub.Headers = root.GetHeaders()
	}
	return sub
}

// mergeMatches intersects a delegate route's matches with its root
// entry's (Istio's mergeHTTPMatchRequests): every delegate match must fit
// under at least one root match, and becomes one match per root match it
// fits under; no root matches keep the delegate's, no delegate matches
// take the root's.
func mergeMatches(root, sub []*networking.HTTPMatchRequest) ([]*networking.HTTPMatchRequest, bool) {
	if len(root) == 0 {
		return sub, true
	}
	if len(sub) == 0 {
		return root, true
	}
	var out []*networking.HTTPMatchRequest
	for _, s := range sub {
		found := false
		for _, r := range root {
			if matchConflict(r, s) {
				continue
			}
			out = append(out, mergeMatch(r, s))
			found = true
		}
		if !found {
			return nil, false
		}
	}
	return out, len(out) > 0
}

func mergeMatch(root, sub *networking.HTTPMatchRequest) *networking.HTTPMatchRequest {
	out := proto.CloneOf(sub)
	switch {
	case out.GetName() == "":
		out.Name = root.GetName()
	case root.GetName() != "":
		out.Name = root.GetName() + "-" + out.GetName()
	}
	if out.Uri == nil {
		out.Uri = root.GetUri()
	}
	if out.Scheme == nil {
		out.Scheme = root.GetScheme()
	}
	if out.Method == nil {
		out.Method = root.GetMethod()
	}
	if out.Authority == nil {
		out.Authority = root.GetAuthority()
	}
	out.Headers = mergeMaps(root.GetHeaders(), sub.GetHeaders())
	out.WithoutHeaders = mergeMaps(root.GetWithoutHeaders(), sub.GetWithoutHeaders())
	out.QueryParams = mergeMaps(root.GetQueryParams(), sub.GetQueryParams())
	if out.GetPort() == 0 {
		out.Port = root.GetPort()
	}
	out.SourceLabels = mergeMaps(root.GetSourceLabels(), sub.GetSourceLabels())
	if out.GetSourceNamespace() == "" {
		out.SourceNamespace = root.GetSourceNamespace()
	}
	if len(out.GetGateways()) == 0 {
		out.Gateways = root.GetGateways()
	}
	return out
}

// mergeMaps is root's entries with sub's on top; nil when both are empty.
func mergeMaps[V any](root, sub map[string]V) map[string]V {
	if len(root) == 0 && len(sub) == 0 {
		return nil
	}
	out := maps.Clone(root)
	if out == nil {
		out = map[string]V{}
	}
	maps.Copy(out, sub)
	return out
}

// matchConflict reports whether a delegate match cannot fit under a root
// match (Istio's hasConflict).
func matchConflict(root, leaf *networking.HTTPMatchRequest) bool {
	pairs := [][2]*networking.StringMatch{
		{root.GetUri(), leaf.GetUri()},
		{root.GetScheme(), leaf.GetScheme()},
		{root.GetMethod(), leaf.GetMethod()},
		{root.GetAuthority(), leaf.GetAuthority()},
	}
	for _, p := range pairs {
		if stringMatchConflict(p[0], p[1]) {
			return true
		}
	}
	for k, v := range leaf.GetHeaders() {
		if stringMatchConflict(root.GetHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetWithoutHeaders() {
		if stringMatchConflict(root.GetWithoutHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetQueryParams() {
		if stringMatchConflict(root.GetQueryParams()[k], v) {
			return true
		}
	}
	if root.GetIgnoreUriCase() != leaf.GetIgnoreUriCase() {
		return true
	}
	if root.GetPort() > 0 && leaf.GetPort() > 0 && root.GetPort() != leaf.GetPort() {
		return true
	}
	if root.GetSourceNamespace() != "" && leaf.GetSourceNamespace() != root.GetSourceNamespace() {
		return true
	}
	for k, v := range leaf.GetSourceLabels() {
		if rv, ok := root.GetSourceLabels()[k]; ok && rv != v {
			return true
		}
	}
	if len(root.GetGateways()) > 0 && len(leaf.GetGateways()) > 0 {
		for _, g := range leaf.GetGateways() {
			found := false
			for _, rg := range root.GetGateways() {
				found = found || rg == g
			}
			if !found {
				return true
			}
		}
	}
	return false
}

// stringMatchConflict is Istio's: unset on either side never conflicts; a
// regex on either side conflicts with anything on the other; an exact
// root takes only the same exact; a prefix root takes a prefix or exact
// value that starts with it.
func stringMatchConflict(root, leaf *networking.StringMatch) bool {
	if root == nil || leaf == nil {
		return false
	}
	if root.GetRegex() != "" || leaf.GetRegex() != "" {
		return true // a regex cannot be proven to contain another match
	}
	if exact := root.GetExact(); exact != "" {
		return leaf.GetPrefix() != "" || leaf.GetExact() != exact
	}
	if prefix := root.GetPrefix(); prefix != "" {
		if p := leaf.GetPrefix(); p != "" {
			return !strings.HasPrefix(p, prefix)
		}
		if e := leaf.GetExact(); e != "" {
			return !strings.HasPrefix(e, prefix)
		}
	}
	return true
}
