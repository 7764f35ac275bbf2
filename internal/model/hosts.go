package model

import (
	"slices"
	"strings"
)

// Export-to values with a meaning of their own.
const (
	exportAll  = "*"
	exportSelf = "."
	exportNone = "~"
)

// ResolveHost qualifies a short name the way Istio does: a name without
// dots ("reviews") written in namespace ns means
// "reviews.<ns>.svc.<domainSuffix>"; anything with a dot, and wildcards,
// are taken as written.
func ResolveHost(host, ns, domainSuffix string) string {
	if host == "" || host == "*" || strings.Contains(host, ".") {
		return host
	}
	return host + "." + ns + ".svc." + domainSuffix
}

// HostMatches reports whether pattern ("reviews.default.svc.cluster.local",
// "*.example.com" or "*") matches host. A wildcard host matches the same
// or a narrower wildcard.
func HostMatches(pattern, host string) bool {
	if pattern == "*" || pattern == host {
		return true
	}
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return strings.HasSuffix(strings.TrimPrefix(host, "*"), suffix)
	}
	return false
}

// ExportedTo reports whether something in namespace own with exportTo list
// is visible in namespace to. An empty list means fallback (the mesh
// default, itself empty meaning everywhere).
func ExportedTo(list, fallback []string, own, to string) bool {
	if len(list) == 0 {
		list = fallback
	}
	if len(list) == 0 {
		return true
	}
	for _, e := range list {
		switch e {
		case exportAll:
			return true
		case exportSelf:
			if own == to {
				return true
			}
		case exportNone:
		default:
			if e == to {
				return true
			}
		}
	}
	return false
}

// exportedToAll reports whether an exportTo list (else the fallback, else
// everywhere, as ExportedTo reads them) exports to every namespace.
func exportedToAll(list, fallback []string) bool {
	if len(list) == 0 {
		list = fallback
	}
	return len(list) == 0 || slices.Contains(list, exportAll)
}

// LabelsMatch reports whether every selector label is in labels. An empty
// selector matches everything.
func LabelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
