package model

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/envoytypes"
)

// EnvoyFilter is a networking.istio.io EnvoyFilter with its patches
// decoded (Istio's EnvoyFilterWrapper).
type EnvoyFilter struct {
	Name, Namespace string
	Spec            *networking.EnvoyFilter
	created         time.Time
	// Patches are the spec's patches that can apply, in spec order.
	Patches []*EnvoyFilterPatch
	// Problems are the patches left out, and why (a value that does not
	// decode as its applyTo's message: validation refuses those, so only
	// configuration that skipped it has them).
	Problems []string
}

// Key is "namespace/name".
func (ef *EnvoyFilter) Key() string { return ef.Namespace + "/" + ef.Name }

// EnvoyFilterPatch is one config patch of an EnvoyFilter, ready to apply
// (Istio's EnvoyFilterConfigPatchWrapper).
type EnvoyFilterPatch struct {
	// Filter is the EnvoyFilter that holds the patch; Index its place in
	// spec.configPatches.
	Filter  *EnvoyFilter
	Index   int
	ApplyTo networking.EnvoyFilter_ApplyTo
	// Operation is the patch's, with Istio's conversion: INSERT_* on
	// anything but filters and routes is ADD.
	Operation networking.EnvoyFilter_Patch_Operation
	// Match is never nil (a missing match matches ANY context).
	Match *networking.EnvoyFilter_EnvoyConfigObjectMatch
	// Value is the patch's value as Envoy's message of ApplyTo (nil for
	// REMOVE); it must not be changed, only cloned.
	Value proto.Message

	versionRegex   *regexp.Regexp
	versionNoMatch bool
}

// Name is how reports name the patch: "namespace/name patch 2 (HTTP_FILTER INSERT_BEFORE)".
func (p *EnvoyFilterPatch) Name() string {
	return fmt.Sprintf("EnvoyFilter %s patch %d (%s %s)", p.Filter.Key(), p.Index, p.ApplyTo, p.Operation)
}

// maxProxyVersionLen bounds a proxyVersion expression compiled: a longer
// one matches no proxy (Istio's maxProxyVersionLen, fail closed).
const maxProxyVersionLen = 1024

// newEnvoyFilter decodes an EnvoyFilter's patches as Istio's
// convertToEnvoyFilterWrapper does: values leniently (fields of a newer
// Envoy are ignored), a missing match as ANY, INSERT_* as ADD where
// order means nothing, the proxy version regex compiled once.
func newEnvoyFilter(name, namespace string, created time.Time, spec *networking.EnvoyFilter) *EnvoyFilter {
	ef := &EnvoyFilter{Name: name, Namespace: namespace, Spec: spec, created: created}
	for i, cp := range spec.GetConfigPatches() {
		if cp.GetPatch() == nil {
			ef.Problems = append(ef.Problems, fmt.Sprintf("patch %d has no patch", i))
			continue
		}
		p := &EnvoyFilterPatch{Filter: ef, Index: i, ApplyTo: cp.GetApplyTo(), Operation: cp.GetPatch().GetOperation(), Match: cp.GetMatch()}
		if v := cp.GetPatch().GetValue(); v != nil {
			msg, ok := envoytypes.PatchTarget(p.ApplyTo)
			if !ok {
				ef.Problems = append(ef.Problems, fmt.Sprintf("patch %d: unknown applyTo %s", i, p.ApplyTo))
				continue
			}
			if err := envoytypes.Decode(v, msg, false); err != nil {
				ef.Problems = append(ef.Problems, fmt.Sprintf("patch %d: %v", i, err))
				continue
			}
			p.Value = msg
		} else if p.Operation != networking.EnvoyFilter_Patch_REMOVE {
			ef.Problems = append(ef.Problems, fmt.Sprintf("patch %d: %s without a value", i, p.Operation))
			continue
		}
		if p.Match == nil {
			p.Match = &networking.EnvoyFilter_EnvoyConfigObjectMatch{Context: networking.EnvoyFilter_ANY}
		}
		if v := p.Match.GetProxy().GetProxyVersion(); v != "" {
			if len(v) > maxProxyVersionLen {
				p.versionNoMatch = true
			} else if re, err := regexp.Compile(v); err == nil {
				p.versionRegex = re
			} else {
				p.versionNoMatch = true
			}
		}
		switch p.Operation {
		case networking.EnvoyFilter_Patch_INSERT_BEFORE, networking.EnvoyFilter_Patch_INSERT_AFTER, networking.EnvoyFilter_Patch_INSERT_FIRST:
			switch p.ApplyTo {
			case networking.EnvoyFilter_HTTP_FILTER, networking.EnvoyFilter_NETWORK_FILTER, networking.EnvoyFilter_HTTP_ROUTE, networking.EnvoyFilter_LISTENER_FILTER:
			default:
				p.Operation = networking.EnvoyFilter_Patch_ADD
			}
		}
		ef.Patches = append(ef.Patches, p)
	}
	return ef
}

// proxyMatch is Istio's proxyMatch: the proxy's Istio version against the
// patch's regex, and each metadata entry the patch names.
func (p *EnvoyFilterPatch) proxyMatch(px *Proxy) bool {
	pm := p.Match.GetProxy()
	if pm == nil {
		return true
	}
	if p.versionNoMatch {
		return false
	}
	if p.versionRegex != nil && (px.IstioVersion == "" || !p.versionRegex.MatchString(px.IstioVersion)) {
		return false
	}
	for k, v := range pm.GetMetadata() {
		got, ok := px.Metadata[k]
		if !ok || got != v {
			return false
		}
	}
	return true
}

// EnvoyFilterPatches are the patches that apply to one proxy, in the
// order they apply (PushContext.EnvoyFilters).
type EnvoyFilterPatches struct {
	// Filters are the EnvoyFilters that apply, in order.
	Filters []*EnvoyFilter
	// ByApplyTo holds the patches by what they apply to, each list in
	// order.
	ByApplyTo map[networking.EnvoyFilter_ApplyTo][]*EnvoyFilterPatch
	// Key names the set: proxies with the same key get the same patches,
	// and the same set (PushContext.EnvoyFilters).
	Key string
}

// EnvoyFilters returns the patches that apply to a proxy, nil when none
// do (Istio's PushContext.EnvoyFilters): the root namespace's EnvoyFilters
// and the proxy namespace's whose workloadSelector matches its labels (no
// selector: every proxy of the namespace), ordered by priority, then root
// namespace first, then oldest, then by name; of those, the patches whose
// proxy match matches. EnvoyFilters with targetRefs attach to the Gateway
// API gateways they name in their namespace, never by selector
// (attaches).
// Proxyless clients get none (Istio's gRPC generator applies none).
func (pc *PushContext) EnvoyFilters(p *Proxy) *EnvoyFilterPatches {
	if p.ProxylessGRPC() || len(pc.cfg.envoyFilters) == 0 {
		return nil
	}
	var matched []*EnvoyFilter
	pick := func(ns string) {
		for _, ef := range pc.cfg.envoyFilters[ns] {
			if !attaches(ef.Spec.GetWorkloadSelector().GetLabels(), ef.Spec.GetTargetRefs(), ns, p.Namespace, p.Labels) {
				continue
			}
			matched = append(matched, ef)
		}
	}
	if pc.RootNamespace != "" {
		pick(pc.RootNamespace)
	}
	if p.Namespace != pc.RootNamespace {
		pick(p.Namespace)
	}
	if len(matched) == 0 {
		return nil
	}
	slices.SortStableFunc(matched, func(a, b *EnvoyFilter) int {
		if c := cmp.Compare(a.Spec.GetPriority(), b.Spec.GetPriority()); c != 0 {
			return c
		}
		if a.Namespace != b.Namespace && (a.Namespace == pc.RootNamespace || b.Namespace == pc.RootNamespace) {
			if a.Namespace == pc.RootNamespace {
				return -1
			}
			return 1
		}
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return strings.Compare(a.Name+"."+a.Namespace, b.Name+"."+b.Namespace)
	})
	out := &EnvoyFilterPatches{Filters: matched, ByApplyTo: map[networking.EnvoyFilter_ApplyTo][]*EnvoyFilterPatch{}}
	var key strings.Builder
	for _, ef := range matched {
		for _, cp := range ef.Patches {
			if cp.proxyMatch(p) {
				out.ByApplyTo[cp.ApplyTo] = append(out.ByApplyTo[cp.ApplyTo], cp)
				key.WriteString(ef.Key() + "#" + strconv.Itoa(cp.Index) + ";")
			}
		}
	}
	if key.Len() == 0 {
		return nil
	}
	// Proxies with the same patches share one set: its address keys what
	// is built from it.
	out.Key = key.String()
	return pc.Memo("model|envoyfilters|"+out.Key, func() any { return out }).(*EnvoyFilterPatches)
}
