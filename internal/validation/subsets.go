package validation

import (
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// SubsetIndex answers the subset question (Context) from a set of
// DestinationRules, as galley's sources and webhook see them.
type SubsetIndex struct {
	// byHost holds the DestinationRules by their fully qualified host.
	byHost map[string][]*istio.Object
	suffix string
}

// NewSubsetIndex indexes DestinationRules; other kinds are ignored.
func NewSubsetIndex(objects []*istio.Object, domainSuffix string) SubsetIndex {
	x := SubsetIndex{suffix: domainSuffix, byHost: map[string][]*istio.Object{}}
	for _, o := range objects {
		if dr, ok := o.Spec.(*networking.DestinationRule); ok && o.Kind.Kind == istio.DestinationRule {
			h := fqdn(dr.GetHost(), o.Meta.Namespace, domainSuffix)
			x.byHost[h] = append(x.byHost[h], o)
		}
	}
	return x
}

// Subsets returns the subsets DestinationRules visible from namespace
// define for host, with hosts compared as Istio resolves them: a name
// without dots is a short name in the object's namespace.
func (x SubsetIndex) Subsets(namespace, host string) ([]string, bool) {
	var names []string
	found := false
	for _, o := range x.byHost[fqdn(host, namespace, x.suffix)] {
		dr, _ := o.Spec.(*networking.DestinationRule)
		if !visible(dr.GetExportTo(), o.Meta.Namespace, namespace) {
			continue
		}
		found = true
		for _, s := range dr.GetSubsets() {
			names = append(names, s.GetName())
		}
	}
	slices.Sort(names)
	return slices.Compact(names), found
}

func fqdn(host, namespace, suffix string) string {
	if strings.Contains(host, ".") || host == "*" {
		return strings.ToLower(host)
	}
	return strings.ToLower(host) + "." + namespace + ".svc." + suffix
}

// visible applies exportTo: empty or "*" is everyone, "." the own namespace.
func visible(exportTo []string, own, from string) bool {
	if len(exportTo) == 0 {
		return true
	}
	for _, e := range exportTo {
		if e == "*" || e == from || (e == "." && own == from) {
			return true
		}
	}
	return false
}
