package translate

import (
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// EnvoyFilter patches, as Istio's pilot/pkg/networking/core/envoyfilter
// applies them, to what the rest of this package generated: after
// generation and before the resources go out. Unlike Istio, which lets
// Envoy refuse a broken result, a resource a patch makes invalid is sent
// unpatched, and the patch is reported (the EnvoyFilter and the patch,
// the resource, the reason). The generated resources are shared by many
// proxies and never changed: a patched one is a clone, built once per
// push context for every proxy with the same patches.

type (
	efPatch   = model.EnvoyFilterPatch
	efContext = networking.EnvoyFilter_PatchContext
)

// patchSet is the patches of one proxy, and the contexts its flavour
// gives resources (flavour.patchContext).
type patchSet struct {
	set *model.EnvoyFilterPatches
	// outbound and inbound are the contexts of the proxy's outbound and
	// inbound resources (GATEWAY for both on a gateway).
	outbound, inbound efContext
	// clusters indexes the cluster patches (clusterPatchIndex).
	clusters *clusterIndex
	// patched holds the resources patched for the set in this push
	// context, by the resource as generated (patchOne).
	patched *sync.Map
	// lists holds the lists of shared clusters patched for the set in
	// this push context (patchClusters).
	lists *clusterLists
}

// memoIn is PushContext.Memo in a map of its own, keyed by a resource.
func memoIn(m *sync.Map, key any, build func() any) any {
	if v, ok := m.Load(key); ok {
		return v
	}
	v, _ := m.LoadOrStore(key, build())
	return v
}

// isInboundCluster reports whether a cluster is of the inbound side (the
// inbound patch context).
func isInboundCluster(name string) bool {
	return strings.HasPrefix(name, inbound+"|") || name == InboundPassthroughCluster
}

// patched is a resource after its patches: nil when a patch removed it.
type patched struct {
	res proto.Message
	// by are the EnvoyFilters whose patches changed it.
	by       []string
	problems []efFinding
}

// efFinding is a problem of the EnvoyFilters it names (their keys).
type efFinding struct {
	filters []string
	msg     string
}

// efProblem records a problem of the EnvoyFilters named by keys: among
// the proxy's problems, and by EnvoyFilter (EnvoyFilterProblems), for
// their status.
func (g *gen) efProblem(keys []string, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	g.problem("%s", msg)
	for _, k := range keys {
		f := efProblem{filter: k, msg: msg}
		if !slices.Contains(g.ef.problems, f) {
			g.ef.problems = append(g.ef.problems, f)
		}
	}
}

// efProblem is one problem of one EnvoyFilter (its key).
type efProblem struct{ filter, msg string }

// envoyFilters returns the proxy's patches; nil when there are none or
// its flavour takes none.
func (g *gen) envoyFilters() *patchSet {
	if g.ef.done {
		return g.ef.set
	}
	g.ef.done = true
	out, in, ok := g.fl.patchContexts()
	if !ok {
		return nil
	}
	set := g.pc.EnvoyFilters(g.p)
	if set == nil {
		return nil
	}
	g.ef.set = &patchSet{set: set, outbound: out, inbound: in}
	for _, ef := range set.Filters {
		for _, p := range ef.Problems {
			g.efProblem([]string{ef.Key()}, "EnvoyFilter %s: %s; left out", ef.Key(), p)
		}
	}
	for _, p := range set.ByApplyTo[networking.EnvoyFilter_BOOTSTRAP] {
		g.efProblem([]string{p.Filter.Key()}, "%s: not applied (as in Istio 1.32, which removed its bootstrap discovery in 1.21: the agent writes Envoy's bootstrap)", p.Name())
	}
	for _, p := range set.ByApplyTo[networking.EnvoyFilter_EXTENSION_CONFIG] {
		if p.Operation != networking.EnvoyFilter_Patch_ADD {
			g.efProblem([]string{p.Filter.Key()}, "%s: not applied (an extension configuration can only be added, as in Istio)", p.Name())
		}
	}
	return g.ef.set
}

// efState is what a generator remembers of its EnvoyFilters.
type efState struct {
	done bool
	set  *patchSet
	// by are the EnvoyFilters that changed each resource, by type and
	// name ("cluster/outbound|80||a.b").
	by map[string][]string
	// problems are the EnvoyFilters' problems, in the order found.
	problems []efProblem
}

// patchedBy records which EnvoyFilters changed a resource.
func (g *gen) patchedBy(kind, name string, by []string) {
	if len(by) == 0 {
		return
	}
	if g.ef.by == nil {
		g.ef.by = map[string][]string{}
	}
	g.ef.by[kind+"/"+name] = by
}

// patchOne applies the patches to one generated resource, through the
// push context's memo: apply applies every patch, in order, to a clone.
// A clone a patch made invalid is dropped for the resource as generated,
// and the first patch that broke it is reported.
func (g *gen) patchOne(kind string, res proto.Message, ps *patchSet, apply func(m proto.Message, ps *patchSet, only func(*efPatch) bool) (removed bool, by []string)) proto.Message {
	return g.usePatched(kind, res, g.patchedOf(kind, res, ps, apply))
}

// patchedOf is what patching res gives, unreported (patchOne).
func (g *gen) patchedOf(kind string, res proto.Message, ps *patchSet, apply func(m proto.Message, ps *patchSet, only func(*efPatch) bool) (removed bool, by []string)) *patched {
	if ps.patched == nil {
		// Per client, patch set and contexts: a sidecar and a gateway
		// share a client and may share a set, but patch in different
		// contexts.
		ps.patched = g.pc.Memo(fmt.Sprintf("ef-patched|%s|%d|%d|%p", g.client.name, ps.outbound, ps.inbound, ps.set), func() any { return &sync.Map{} }).(*sync.Map)
	}
	// A resource shared by proxies of the same patches is looked at once:
	// what it became, or that no patch can touch it (mayPatch depends on
	// nothing else, but for an inbound cluster, which it matches against
	// the proxy's own services).
	if v, ok := ps.patched.Load(res); ok {
		return v.(*patched)
	}
	if !g.mayPatch(res, ps) {
		untouched := &patched{res: res}
		if c, ok := res.(*clusterv3.Cluster); !ok || !isInboundCluster(c.GetName()) {
			ps.patched.Store(res, untouched)
		}
		return untouched
	}
	return memoIn(ps.patched, res, func() any {
		out := &patched{}
		c := proto.Clone(res)
		removed, by := apply(c, ps, nil)
		if removed {
			out.by = by
			return out
		}
		if len(by) == 0 {
			out.res = res
			return out
		}
		err := Validate(c)
		if err == nil {
			err = checkPatched(c)
		}
		if err == nil {
			out.res, out.by = c, by
			g.pc.Share(c)
			return out
		}
		// Find the patch that broke it: apply the patches one more at a
		// time.
		all := ps.flat()
		for i := range all {
			c := proto.Clone(res)
			if removed, _ := apply(c, ps, func(p *efPatch) bool { return slices.Index(all, p) <= i }); removed {
				continue
			}
			e := Validate(c)
			if e == nil {
				e = checkPatched(c)
			}
			if e != nil {
				out.problems = append(out.problems, efFinding{[]string{all[i].Filter.Key()}, fmt.Sprintf("%s: makes %s %s invalid (%v); %s sent as generated, without the EnvoyFilters' patches",
					all[i].Name(), kind, resourceName(res), e, kind)})
				break
			}
		}
		if len(out.problems) == 0 {
			out.problems = append(out.problems, efFinding{by, fmt.Sprintf("EnvoyFilters %s make %s %s invalid (%v); sent as generated", strings.Join(by, ", "), kind, resourceName(res), err)})
		}
		out.res = res
		return out
	}).(*patched)
}

// clusterLists are the patched lists of one patch set in a push context,
// by the hash of the list (with seed; a match is checked in full).
type clusterLists struct {
	seed maphash.Seed
	m    sync.Map
}

// clusterList is a list of shared clusters patched for one patch set:
// what each became, and which of them have something to report.
type clusterList struct {
	built   []*builtCluster
	patched []*patched
	notable []int // the indexes of patched whose by or problems are set
}

// patchClusters patches a proxy's clusters. Those every proxy of a scope
// shares (all but the inbound ones, which depend on the proxy's own
// services) are patched as a list, once per push context and patch set
// for each list: the proxies of one scope then find their patched
// clusters with one lookup rather than one per cluster. Their order is
// kept.
func (g *gen) patchClusters(built []*builtCluster, ps *patchSet) []*clusterv3.Cluster {
	if ps.lists == nil {
		ps.lists = g.pc.Memo(fmt.Sprintf("ef-cluster-lists|%s|%d|%d|%p", g.client.name, ps.outbound, ps.inbound, ps.set), func() any {
			return &clusterLists{seed: maphash.MakeSeed()}
		}).(*clusterLists)
	}
	var h maphash.Hash
	h.SetSeed(ps.lists.seed)
	n := 0
	for _, b := range built {
		if !isInboundCluster(b.c.GetName()) {
			maphash.WriteComparable(&h, b)
			n++
		}
	}
	key := h.Sum64()
	// sameList says whether l is of the proxy's shared clusters.
	sameList := func(l *clusterList) bool {
		if len(l.built) != n {
			return false
		}
		j := 0
		for _, b := range built {
			if !isInboundCluster(b.c.GetName()) {
				if l.built[j] != b {
					return false
				}
				j++
			}
		}
		return true
	}
	v, ok := ps.lists.m.Load(key)
	list, _ := v.(*clusterList)
	if !ok || !sameList(list) {
		shared := make([]*builtCluster, 0, n)
		for _, b := range built {
			if !isInboundCluster(b.c.GetName()) {
				shared = append(shared, b)
			}
		}
		list = &clusterList{built: shared, patched: make([]*patched, len(shared))}
		for i, b := range shared {
			list.patched[i] = g.patchedOf("cluster", b.c, ps, g.patchCluster)
			if len(list.patched[i].by) > 0 || len(list.patched[i].problems) > 0 {
				list.notable = append(list.notable, i)
			}
		}
		if !ok {
			ps.lists.m.Store(key, list)
		}
	}
	for _, i := range list.notable {
		g.usePatched("cluster", list.built[i].c, list.patched[i])
	}
	out := make([]*clusterv3.Cluster, 0, len(built))
	j := 0
	for _, b := range built {
		var res proto.Message
		if isInboundCluster(b.c.GetName()) {
			res = g.patchOne("cluster", b.c, ps, g.patchCluster)
		} else {
			res = list.patched[j].res
			j++
		}
		if res != nil {
			out = append(out, res.(*clusterv3.Cluster))
		}
	}
	return out
}

// usePatched reports what patching res gave, and returns the resource to
// send (nil: removed).
func (g *gen) usePatched(kind string, res proto.Message, v *patched) proto.Message {
	for _, p := range v.problems {
		g.efProblem(p.filters, "%s", p.msg)
	}
	g.patchedBy(kind, resourceName(res), v.by)
	return v.res
}

// mayPatch reports whether a patch can apply to res: every patch of a
// cluster, a route configuration or a listener (and of what they hold)
// must first match the resource itself, which is cheap to check; only
// then is it cloned and patched.
func (g *gen) mayPatch(res proto.Message, ps *patchSet) bool {
	switch r := res.(type) {
	case *clusterv3.Cluster:
		ctx, hosts := ps.outbound, []string(nil)
		if isInboundCluster(r.GetName()) {
			ctx = ps.inbound
			hosts = g.inboundHosts(r.GetName())
		}
		idx := g.clusterPatchIndex(ps)
		_, _, _, host := splitClusterName(r.GetName())
		for _, cands := range [][]*efPatch{idx.rest, idx.byName[r.GetName()], idx.byService[host]} {
			for _, p := range cands {
				if contextMatch(ctx, p) && clusterMatch(r, p, hosts) {
					return true
				}
			}
		}
		for _, h := range hosts {
			for _, p := range idx.byService[h] {
				if contextMatch(ctx, p) && clusterMatch(r, p, hosts) {
					return true
				}
			}
		}
		return false
	case *routev3.RouteConfiguration:
		for _, a := range routeApplyTos {
			if slices.ContainsFunc(ps.set.ByApplyTo[a], func(p *efPatch) bool {
				return contextMatch(ps.outbound, p) && routeConfigurationMatch(ps.outbound, r, p)
			}) {
				return true
			}
		}
		return false
	case *listenerv3.Listener:
		ctx := ps.outbound
		if r.GetTrafficDirection() == corev3.TrafficDirection_INBOUND {
			ctx = ps.inbound
		}
		for _, a := range listenerApplyTos {
			if slices.ContainsFunc(ps.set.ByApplyTo[a], func(p *efPatch) bool { return contextMatch(ctx, p) && listenerMatch(r, p) }) {
				return true
			}
		}
		// The route patches of an inbound connection manager's own
		// routes.
		if ctx == networking.EnvoyFilter_SIDECAR_INBOUND {
			for _, a := range routeApplyTos {
				if slices.ContainsFunc(ps.set.ByApplyTo[a], func(p *efPatch) bool { return contextMatch(ctx, p) }) {
					return true
				}
			}
		}
		return false
	}
	return true
}

// clusterIndex is a patch set's cluster patches by what their match
// names first: the cluster's name, else its service; rest are the
// others. Only a cluster's own candidates need matching (mayPatch).
type clusterIndex struct {
	byName, byService map[string][]*efPatch
	rest              []*efPatch
}

// clusterPatchIndex builds the index once per push for every proxy of
// the set.
func (g *gen) clusterPatchIndex(ps *patchSet) *clusterIndex {
	if ps.clusters != nil {
		return ps.clusters
	}
	ps.clusters = g.pc.Memo(fmt.Sprintf("ef-cluster-index|%p", ps.set), func() any {
		idx := &clusterIndex{byName: map[string][]*efPatch{}, byService: map[string][]*efPatch{}}
		for _, p := range ps.set.ByApplyTo[networking.EnvoyFilter_CLUSTER] {
			m := p.Match.GetCluster()
			switch {
			case m.GetName() != "":
				idx.byName[m.GetName()] = append(idx.byName[m.GetName()], p)
			case m.GetService() != "":
				idx.byService[m.GetService()] = append(idx.byService[m.GetService()], p)
			default:
				idx.rest = append(idx.rest, p)
			}
		}
		return idx
	}).(*clusterIndex)
	return ps.clusters
}

// The applyTos of what a route configuration holds, and of what a
// listener holds.
var (
	routeApplyTos = []networking.EnvoyFilter_ApplyTo{
		networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE,
	}
	listenerApplyTos = []networking.EnvoyFilter_ApplyTo{
		networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_LISTENER_FILTER, networking.EnvoyFilter_FILTER_CHAIN,
		networking.EnvoyFilter_NETWORK_FILTER, networking.EnvoyFilter_HTTP_FILTER,
	}
)

// checkPatched is what Envoy refuses that generated validation does not
// catch: an HTTP connection manager whose last filter is not the router
// (or another terminal filter).
func checkPatched(m proto.Message) error {
	l, ok := m.(*listenerv3.Listener)
	if !ok {
		return nil
	}
	chains := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			if f.GetName() != hcmFilter || f.GetTypedConfig() == nil {
				continue
			}
			h := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
				return fmt.Errorf("filter chain %q: %s: %w", fc.GetName(), hcmFilter, err)
			}
			fs := h.GetHttpFilters()
			if len(fs) == 0 || !terminalHTTPFilters[fs[len(fs)-1].GetName()] {
				return fmt.Errorf("filter chain %q: the last HTTP filter must be a terminal one (the router)", fc.GetName())
			}
		}
	}
	return nil
}

// terminalHTTPFilters are the HTTP filters Envoy lets end a chain.
var terminalHTTPFilters = map[string]bool{
	"envoy.filters.http.router":         true,
	"envoy.router":                      true,
	"envoy.filters.http.upstream_codec": true,
}

func resourceName(m proto.Message) string {
	if n, ok := m.(interface{ GetName() string }); ok {
		return n.GetName()
	}
	return ""
}

// flat is every patch of the set, in the order they apply.
func (ps *patchSet) flat() []*efPatch {
	var out []*efPatch
	for _, a := range slices.Sorted(maps.Keys(ps.set.ByApplyTo)) {
		out = append(out, ps.set.ByApplyTo[a]...)
	}
	return out
}

// has reports whether the set has a patch of one of applyTos.
func (ps *patchSet) has(applyTos []networking.EnvoyFilter_ApplyTo) bool {
	return ps != nil && slices.ContainsFunc(applyTos, func(a networking.EnvoyFilter_ApplyTo) bool { return len(ps.set.ByApplyTo[a]) > 0 })
}

// patches are the set's patches of applyTo that only allows (nil: all).
func (ps *patchSet) patches(a networking.EnvoyFilter_ApplyTo, only func(*efPatch) bool) []*efPatch {
	all := ps.set.ByApplyTo[a]
	if only == nil {
		return all
	}
	var out []*efPatch
	for _, p := range all {
		if only(p) {
			out = append(out, p)
		}
	}
	return out
}

// contextMatch is Istio's commonConditionMatch.
func contextMatch(ctx efContext, p *efPatch) bool {
	return p.Match.GetContext() == ctx || p.Match.GetContext() == networking.EnvoyFilter_ANY
}

// addsIn is whether an ADD of a whole cluster or listener applies in ctx:
// a patch without a context adds only to a sidecar's outbound side and
// to gateways (Istio's InsertedClusters, patchListeners).
func addsIn(ctx efContext, p *efPatch) bool {
	if p.Match.GetContext() == networking.EnvoyFilter_ANY {
		return ctx == networking.EnvoyFilter_SIDECAR_OUTBOUND || ctx == networking.EnvoyFilter_GATEWAY
	}
	return p.Match.GetContext() == ctx
}

// adds reports whether p adds a whole cluster or listener to the proxy:
// on its outbound side or, on a sidecar, its inbound side (addsIn).
func (ps *patchSet) adds(p *efPatch) bool {
	if p.Operation != networking.EnvoyFilter_Patch_ADD {
		return false
	}
	return addsIn(ps.outbound, p) || (ps.inbound != ps.outbound && addsIn(ps.inbound, p))
}

// tracker records the patches that changed something: the
// EnvoyFilters, and how many patches.
type tracker struct {
	by []string
	n  int
}

func (t *tracker) applied(p *efPatch) {
	t.n++
	if k := p.Filter.Key(); !slices.Contains(t.by, k) {
		t.by = append(t.by, k)
	}
}

// --- merging, as Istio's pkg/proto/merge and util.MergeAnyWithAny ---

// mergeValue merges src into dst as the patch's operation says: MERGE
// appends lists, MERGE_AND_REPLACE_LIST replaces those src sets; both
// replace durations whole and merge the rest field by field.
func mergeValue(op networking.EnvoyFilter_Patch_Operation, dst, src proto.Message) {
	mergeMessage(dst.ProtoReflect(), src.ProtoReflect(), op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST)
}

func isMerge(op networking.EnvoyFilter_Patch_Operation) bool {
	return op == networking.EnvoyFilter_Patch_MERGE || op == networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST
}

const durationName = "google.protobuf.Duration"

func mergeMessage(dst, src protoreflect.Message, replaceList bool) {
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			dl := dst.Mutable(fd).List()
			if replaceList {
				dl.Truncate(0)
			}
			sl := v.List()
			for i := range sl.Len() {
				if fd.Message() != nil {
					e := dl.NewElement()
					mergeMessage(e.Message(), sl.Get(i).Message(), replaceList)
					dl.Append(e)
				} else {
					dl.Append(cloneScalar(fd, sl.Get(i)))
				}
			}
		case fd.IsMap():
			dm := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					nv := dm.NewValue()
					mergeMessage(nv.Message(), mv.Message(), replaceList)
					dm.Set(k, nv)
				} else {
					dm.Set(k, cloneScalar(fd.MapValue(), mv))
				}
				return true
			})
		case fd.Message() != nil:
			if fd.Message().FullName() == durationName {
				dst.Set(fd, protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect()))
				return true
			}
			mergeMessage(dst.Mutable(fd).Message(), v.Message(), replaceList)
		default:
			dst.Set(fd, cloneScalar(fd, v))
		}
		return true
	})
	if u := src.GetUnknown(); len(u) > 0 {
		dst.SetUnknown(append(dst.GetUnknown(), u...))
	}
}

func cloneScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	if fd.Kind() == protoreflect.BytesKind {
		return protoreflect.ValueOfBytes(slices.Clone(v.Bytes()))
	}
	return v
}

// mergeAny merges src's message into dst's (Istio's MergeAnyWithAny);
// an error when either does not decode or their types differ.
func mergeAny(dst, src *anypb.Any) (*anypb.Any, error) {
	d, err := dst.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	s, err := src.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	if d.ProtoReflect().Descriptor().FullName() != s.ProtoReflect().Descriptor().FullName() {
		return nil, fmt.Errorf("cannot merge %s into %s", s.ProtoReflect().Descriptor().FullName(), d.ProtoReflect().Descriptor().FullName())
	}
	mergeMessage(d.ProtoReflect(), s.ProtoReflect(), false)
	return anypb.New(d)
}

// --- list operations, as Istio's replaceFunc, insertBeforeFunc, insertAfterFunc ---

func clone[T proto.Message](v proto.Message) T { return proto.Clone(v).(T) }

// insertAt inserts v before the first element matching, or after it;
// false when none matches.
func insertAt[E any](s []E, match func(E) bool, v E, after bool) ([]E, bool) {
	i := slices.IndexFunc(s, match)
	if i < 0 {
		return s, false
	}
	if after {
		i++
	}
	return slices.Insert(s, i, v), true
}

// listOp applies an ADD, INSERT_* or REPLACE or REMOVE patch of a list
// element (filters, routes): has says whether the patch names an element
// to match, match whether an element is it. Istio's semantics: without a
// match INSERT_AFTER appends and INSERT_BEFORE prepends, while REPLACE and
// REMOVE do nothing; INSERT_FIRST prepends (with a match, only when an
// element matches).
func listOp[E proto.Message](s []E, p *efPatch, has bool, match func(E) bool) ([]E, bool) {
	v := func() E { return clone[E](p.Value) }
	switch p.Operation {
	case networking.EnvoyFilter_Patch_ADD:
		return append(s, v()), true
	case networking.EnvoyFilter_Patch_INSERT_FIRST:
		if has && !slices.ContainsFunc(s, match) {
			return s, false
		}
		return append([]E{v()}, s...), true
	case networking.EnvoyFilter_Patch_INSERT_AFTER:
		if !has {
			return append(s, v()), true
		}
		return insertAt(s, match, v(), true)
	case networking.EnvoyFilter_Patch_INSERT_BEFORE:
		if !has {
			return append([]E{v()}, s...), true
		}
		return insertAt(s, match, v(), false)
	case networking.EnvoyFilter_Patch_REPLACE:
		if !has {
			return s, false
		}
		if i := slices.IndexFunc(s, match); i >= 0 {
			s[i] = v()
			return s, true
		}
	case networking.EnvoyFilter_Patch_REMOVE:
		if !has {
			return s, false
		}
		n := len(s)
		s = slices.DeleteFunc(s, match)
		return s, len(s) != n
	}
	return s, false
}

// --- clusters (Istio's ApplyClusterMerge, InsertedClusters) ---

// patchCluster applies the cluster patches to c in place; removed when a
// REMOVE matched.
func (g *gen) patchCluster(m proto.Message, ps *patchSet, only func(*efPatch) bool) (bool, []string) {
	c := m.(*clusterv3.Cluster)
	ctx, hosts := ps.outbound, []string(nil)
	if strings.HasPrefix(c.GetName(), inbound+"|") || c.GetName() == InboundPassthroughCluster {
		ctx, hosts = ps.inbound, g.inboundHosts(c.GetName())
	}
	var t tracker
	for _, p := range ps.patches(networking.EnvoyFilter_CLUSTER, only) {
		if !contextMatch(ctx, p) || !clusterMatch(c, p, hosts) {
			continue
		}
		switch {
		case p.Operation == networking.EnvoyFilter_Patch_REMOVE:
			t.applied(p)
			return true, t.by
		case isMerge(p.Operation):
			if mergeClusterSocket(c, p.Value.(*clusterv3.Cluster)) {
				t.applied(p)
				continue
			}
			mergeValue(p.Operation, c, p.Value)
			t.applied(p)
		}
	}
	return false, t.by
}

// mergeClusterSocket merges a patch's transport socket into the
// cluster's of the same name, at the level of its typed config (Istio's
// mergeTransportSocketCluster); true when it handled the patch.
func mergeClusterSocket(c, v *clusterv3.Cluster) bool {
	ts := v.GetTransportSocket()
	if ts == nil {
		return false
	}
	var dst *corev3.TransportSocket
	if len(c.GetTransportSocketMatches()) > 0 {
		for _, m := range c.GetTransportSocketMatches() {
			if m.GetTransportSocket().GetName() == ts.GetName() {
				dst = m.GetTransportSocket()
				break
			}
		}
		if dst == nil {
			// Merging would leave both a socket and socket matches:
			// Istio drops the patch.
			return true
		}
	} else if c.GetTransportSocket().GetName() == ts.GetName() {
		dst = c.GetTransportSocket()
	}
	if dst == nil {
		c.TransportSocket = clone[*corev3.TransportSocket](ts)
		return true
	}
	if dst.GetTypedConfig() != nil && ts.GetTypedConfig() != nil {
		if merged, err := mergeAny(dst.GetTypedConfig(), ts.GetTypedConfig()); err == nil {
			dst.ConfigType = &corev3.TransportSocket_TypedConfig{TypedConfig: merged}
		}
	}
	return true
}

// clusterMatch is Istio's clusterMatch: by name alone when the match
// names one, else by subset, service (an inbound cluster's services) and
// port of the cluster's name.
func clusterMatch(c *clusterv3.Cluster, p *efPatch, hosts []string) bool {
	m := p.Match.GetCluster()
	if m == nil {
		return true
	}
	if m.GetName() != "" {
		return m.GetName() == c.GetName()
	}
	direction, port, subset, host := splitClusterName(c.GetName())
	if direction == inbound && len(hosts) > 0 {
		if m.GetService() != "" && !slices.Contains(hosts, m.GetService()) {
			return false
		}
	} else if m.GetService() != "" && m.GetService() != host {
		return false
	}
	if m.GetSubset() != "" && m.GetSubset() != subset {
		return false
	}
	return m.GetPortNumber() == 0 || m.GetPortNumber() == port
}

// splitClusterName splits "direction|port|subset|host" (Istio's
// ParseSubsetKey); zero values for other names.
func splitClusterName(name string) (direction string, port uint32, subset, host string) {
	direction, rest, ok := strings.Cut(name, "|")
	if !ok {
		return "", 0, "", ""
	}
	num, rest, ok := strings.Cut(rest, "|")
	if !ok {
		return "", 0, "", ""
	}
	subset, host, ok = strings.Cut(rest, "|")
	if !ok {
		return "", 0, "", ""
	}
	n, _ := strconv.ParseUint(num, 10, 32)
	return direction, uint32(n), subset, host
}

// inboundHosts are the hostnames of the services the proxy serves on an
// inbound cluster's port (what Istio matches an inbound cluster's
// service against).
func (g *gen) inboundHosts(cluster string) []string {
	_, port, _, _ := splitClusterName(cluster)
	var out []string
	for _, in := range g.pc.Instances(g.p) {
		for _, sp := range in.Service.GetPorts() {
			if target, ok := endpointPort(in.Endpoint, sp); ok && target == port && !slices.Contains(out, in.Service.GetHostname()) {
				out = append(out, in.Service.GetHostname())
			}
		}
	}
	return out
}

// addedClusters are the clusters the patches add (Istio's
// InsertedClusters).
func (g *gen) addedClusters() []*clusterv3.Cluster {
	return added[*clusterv3.Cluster](g, networking.EnvoyFilter_CLUSTER, "cluster")
}

// addedExtensionConfigs are the ECDS resources the EXTENSION_CONFIG
// patches add, whatever the context, each checked (Istio's
// InsertedExtensionConfigurations).
func (g *gen) addedExtensionConfigs() []*corev3.TypedExtensionConfig {
	ps := g.envoyFilters()
	if ps == nil {
		return nil
	}
	var out []*corev3.TypedExtensionConfig
	for _, p := range ps.set.ByApplyTo[networking.EnvoyFilter_EXTENSION_CONFIG] {
		if p.Operation != networking.EnvoyFilter_Patch_ADD {
			continue
		}
		ec := p.Value.(*corev3.TypedExtensionConfig)
		if err := Validate(ec); err != nil {
			g.efProblem([]string{p.Filter.Key()}, "%s: extension configuration %s not added: %v", p.Name(), ec.GetName(), err)
			continue
		}
		g.patchedBy("extension configuration", ec.GetName(), []string{p.Filter.Key()})
		out = append(out, ec)
	}
	return out
}

// added are the whole resources (clusters, listeners) the patches of
// applyTo add, each checked: a sidecar's outbound side takes those
// without a context, its inbound side those that say SIDECAR_INBOUND
// (ps.adds).
func added[R interface {
	proto.Message
	GetName() string
}](g *gen, applyTo networking.EnvoyFilter_ApplyTo, kind string,
) []R {
	ps := g.envoyFilters()
	if ps == nil {
		return nil
	}
	var out []R
	for _, p := range ps.set.ByApplyTo[applyTo] {
		if !ps.adds(p) {
			continue
		}
		r := p.Value.(R)
		err := Validate(r)
		if err == nil {
			err = checkPatched(r)
		}
		if err != nil {
			g.efProblem([]string{p.Filter.Key()}, "%s: %s %s not added: %v", p.Name(), kind, r.GetName(), err)
			continue
		}
		g.patchedBy(kind, r.GetName(), []string{p.Filter.Key()})
		out = append(out, r)
	}
	return out
}

// --- route configurations (Istio's ApplyRouteConfigurationPatches) ---

// patchRoute applies the route configuration, virtual host and route
// patches to rc in place (a sidecar's outbound routes, a gateway's).
func (g *gen) patchRoute(m proto.Message, ps *patchSet, only func(*efPatch) bool) (bool, []string) {
	var t tracker
	patchRouteConfiguration(ps.outbound, m.(*routev3.RouteConfiguration), ps, only, &t)
	return false, t.by
}

func patchRouteConfiguration(ctx efContext, rc *routev3.RouteConfiguration, ps *patchSet, only func(*efPatch) bool, t *tracker) {
	for _, p := range ps.patches(networking.EnvoyFilter_ROUTE_CONFIGURATION, only) {
		if isMerge(p.Operation) && contextMatch(ctx, p) && routeConfigurationMatch(ctx, rc, p) {
			mergeValue(p.Operation, rc, p.Value)
			t.applied(p)
		}
	}
	vhps := ps.patches(networking.EnvoyFilter_VIRTUAL_HOST, only)
	var kept []*routev3.VirtualHost
	for _, vh := range rc.GetVirtualHosts() {
		removed := false
		for _, p := range vhps {
			if !contextMatch(ctx, p) || !routeConfigurationMatch(ctx, rc, p) || !virtualHostMatch(vh, p) {
				continue
			}
			switch {
			case p.Operation == networking.EnvoyFilter_Patch_REMOVE:
				removed = true
			case isMerge(p.Operation):
				mergeValue(p.Operation, vh, p.Value)
			case p.Operation == networking.EnvoyFilter_Patch_REPLACE:
				vh = clone[*routev3.VirtualHost](p.Value)
			default:
				continue
			}
			t.applied(p)
			if removed {
				break
			}
		}
		if removed {
			continue
		}
		patchHTTPRoutes(ctx, rc, vh, ps, only, t)
		kept = append(kept, vh)
	}
	for _, p := range vhps {
		if p.Operation == networking.EnvoyFilter_Patch_ADD && contextMatch(ctx, p) && routeConfigurationMatch(ctx, rc, p) {
			kept = append(kept, clone[*routev3.VirtualHost](p.Value))
			t.applied(p)
		}
	}
	rc.VirtualHosts = kept
}

func patchHTTPRoutes(ctx efContext, rc *routev3.RouteConfiguration, vh *routev3.VirtualHost, ps *patchSet, only func(*efPatch) bool, t *tracker) {
	rps := ps.patches(networking.EnvoyFilter_HTTP_ROUTE, only)
	applies := func(p *efPatch) bool {
		return contextMatch(ctx, p) && routeConfigurationMatch(ctx, rc, p) && virtualHostMatch(vh, p)
	}
	// Removes and merges, route by route.
	var kept []*routev3.Route
	for _, r := range vh.GetRoutes() {
		removed := false
		for _, p := range rps {
			if !applies(p) || !routeMatch(r, p) {
				continue
			}
			if p.Operation == networking.EnvoyFilter_Patch_REMOVE {
				removed = true
				t.applied(p)
				break
			}
			if isMerge(p.Operation) {
				mergeValue(p.Operation, r, p.Value)
				t.applied(p)
			}
		}
		if !removed {
			kept = append(kept, r)
		}
	}
	vh.Routes = kept
	// Then the adds and inserts.
	for _, p := range rps {
		if p.Operation == networking.EnvoyFilter_Patch_REMOVE || isMerge(p.Operation) || p.Operation == networking.EnvoyFilter_Patch_REPLACE || !applies(p) {
			continue
		}
		has := p.Match.GetRouteConfiguration().GetVhost().GetRoute() != nil
		var ok bool
		vh.Routes, ok = listOp(vh.Routes, p, has, func(r *routev3.Route) bool { return routeMatch(r, p) })
		if ok {
			t.applied(p)
		}
	}
}

// routeConfigurationMatch is Istio's: a sidecar's by name and by the port
// its name carries; a gateway's by name, port name, gateway and port
// ("https.443.portname.gateway.namespace").
func routeConfigurationMatch(ctx efContext, rc *routev3.RouteConfiguration, p *efPatch) bool {
	m := p.Match.GetRouteConfiguration()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != rc.GetName() {
		return false
	}
	if ctx != networking.EnvoyFilter_GATEWAY {
		return m.GetPortNumber() == 0 || m.GetPortNumber() == routePort(rc.GetName())
	}
	port, portName, gateway := parseGatewayRouteName(rc.GetName())
	if m.GetPortName() != "" && m.GetPortName() != portName {
		return false
	}
	if m.GetGateway() != "" && m.GetGateway() != gateway {
		return false
	}
	return m.GetPortNumber() == 0 || m.GetPortNumber() == port
}

// routePort is the port a sidecar's route configuration is for: its name
// ("80"), an inbound cluster name's port, "host:port"'s port.
func routePort(name string) uint32 {
	if strings.HasPrefix(name, inbound+"|") {
		_, port, _, _ := splitClusterName(name)
		return port
	}
	if _, port, ok := ParseListenerName(name); ok {
		return port
	}
	n, _ := strconv.ParseUint(name, 10, 32)
	return uint32(n)
}

// parseGatewayRouteName splits "http.80" and
// "https.443.portname.gateway.namespace" (Istio's
// ParseGatewayRDSRouteName): the gateway is "namespace/gateway".
func parseGatewayRouteName(name string) (port uint32, portName, gateway string) {
	parts := strings.Split(name, ".")
	if len(parts) < 2 {
		return 0, "", ""
	}
	n, _ := strconv.ParseUint(parts[1], 10, 32)
	if parts[0] == "https" && len(parts) >= 5 {
		return uint32(n), parts[2], parts[4] + "/" + parts[3]
	}
	return uint32(n), "", ""
}

func virtualHostMatch(vh *routev3.VirtualHost, p *efPatch) bool {
	m := p.Match.GetRouteConfiguration().GetVhost()
	if m == nil {
		return true
	}
	return (m.GetName() == "" || m.GetName() == vh.GetName()) &&
		(m.GetDomainName() == "" || slices.Contains(vh.GetDomains(), m.GetDomainName()))
}

func routeMatch(r *routev3.Route, p *efPatch) bool {
	m := p.Match.GetRouteConfiguration().GetVhost().GetRoute()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != r.GetName() {
		return false
	}
	switch m.GetAction() {
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_ROUTE:
		return r.GetRoute() != nil
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_REDIRECT:
		return r.GetRedirect() != nil
	case networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch_DIRECT_RESPONSE:
		return r.GetDirectResponse() != nil
	}
	return true
}

// --- listeners (Istio's ApplyListenerPatches) ---

// patchListener applies the listener, listener filter, filter chain,
// network filter and HTTP filter patches to l in place, and the route
// configuration patches to an inbound connection manager's own routes
// (Istio patches those as it builds them); removed when a REMOVE
// matched.
func (g *gen) patchListener(m proto.Message, ps *patchSet, only func(*efPatch) bool) (bool, []string) {
	l := m.(*listenerv3.Listener)
	ctx := ps.outbound
	if l.GetTrafficDirection() == corev3.TrafficDirection_INBOUND {
		ctx = ps.inbound
	}
	var t tracker
	for _, p := range ps.patches(networking.EnvoyFilter_LISTENER, only) {
		if !contextMatch(ctx, p) || !listenerMatch(l, p) {
			continue
		}
		if p.Operation == networking.EnvoyFilter_Patch_REMOVE {
			t.applied(p)
			return true, t.by
		}
		if isMerge(p.Operation) {
			mergeValue(p.Operation, l, p.Value)
			t.applied(p)
		}
	}
	for _, p := range ps.patches(networking.EnvoyFilter_LISTENER_FILTER, only) {
		if !contextMatch(ctx, p) || !listenerMatch(l, p) {
			continue
		}
		name := p.Match.GetListener().GetListenerFilter()
		match := func(f *listenerv3.ListenerFilter) bool { return f.GetName() == name }
		if isMerge(p.Operation) {
			// Istio merges into every listener filter here; the filter
			// the match names is what is meant.
			if name == "" {
				continue
			}
			for _, f := range l.GetListenerFilters() {
				if match(f) && mergeFilterConfig(f, p.Value.(*listenerv3.ListenerFilter)) {
					t.applied(p)
				}
			}
			continue
		}
		var ok bool
		if l.ListenerFilters, ok = listOp(l.ListenerFilters, p, name != "", match); ok {
			t.applied(p)
		}
	}
	var chains []*listenerv3.FilterChain
	for _, fc := range l.GetFilterChains() {
		if patchFilterChain(ctx, l, fc, ps, only, &t) {
			chains = append(chains, fc)
		}
	}
	if fc := l.GetDefaultFilterChain(); fc != nil && len(fc.GetFilters()) > 0 && !patchFilterChain(ctx, l, fc, ps, only, &t) {
		l.DefaultFilterChain = nil
	}
	for _, p := range ps.patches(networking.EnvoyFilter_FILTER_CHAIN, only) {
		if p.Operation == networking.EnvoyFilter_Patch_ADD && contextMatch(ctx, p) && listenerMatch(l, p) {
			chains = append(chains, clone[*listenerv3.FilterChain](p.Value))
			t.applied(p)
		}
	}
	l.FilterChains = chains
	return false, t.by
}

// patchFilterChain patches one filter chain; false when a REMOVE took it
// (or it has no filters left).
func patchFilterChain(ctx efContext, l *listenerv3.Listener, fc *listenerv3.FilterChain, ps *patchSet, only func(*efPatch) bool, t *tracker) bool {
	for _, p := range ps.patches(networking.EnvoyFilter_FILTER_CHAIN, only) {
		if !contextMatch(ctx, p) || !listenerMatch(l, p) || !filterChainMatch(l, fc, p) {
			continue
		}
		if p.Operation == networking.EnvoyFilter_Patch_REMOVE {
			t.applied(p)
			return false
		}
		if isMerge(p.Operation) {
			if !mergeChainSocket(fc, p.Value.(*listenerv3.FilterChain)) {
				mergeValue(p.Operation, fc, p.Value)
			}
			t.applied(p)
		}
	}
	nps := ps.patches(networking.EnvoyFilter_NETWORK_FILTER, only)
	for _, p := range nps {
		if isMerge(p.Operation) || !contextMatch(ctx, p) || !listenerMatch(l, p) || !filterChainMatch(l, fc, p) {
			continue
		}
		name := p.Match.GetListener().GetFilterChain().GetFilter().GetName()
		var ok bool
		if fc.Filters, ok = listOp(fc.Filters, p, name != "", func(f *listenerv3.Filter) bool { return f.GetName() == name }); ok {
			t.applied(p)
		}
	}
	for _, f := range fc.GetFilters() {
		for _, p := range nps {
			if p.Operation != networking.EnvoyFilter_Patch_MERGE || !contextMatch(ctx, p) || !listenerMatch(l, p) || !filterChainMatch(l, fc, p) || !networkFilterMatch(f, p) {
				continue
			}
			if mergeFilterConfig(f, p.Value.(*listenerv3.Filter)) {
				t.applied(p)
			}
		}
		if f.GetName() == hcmFilter {
			patchHCM(ctx, l, fc, f, ps, only, t)
		}
	}
	return len(fc.GetFilters()) > 0
}

// mergeChainSocket merges a filter chain patch's transport socket into
// the chain's of the same name (Istio's mergeTransportSocketListener);
// true when it handled the patch.
func mergeChainSocket(fc, v *listenerv3.FilterChain) bool {
	ts := v.GetTransportSocket()
	if ts == nil || fc.GetTransportSocket() == nil {
		return false
	}
	if fc.GetTransportSocket().GetName() != ts.GetName() {
		return false
	}
	dst := fc.GetTransportSocket()
	if dst.GetTypedConfig() != nil && ts.GetTypedConfig() != nil {
		if merged, err := mergeAny(dst.GetTypedConfig(), ts.GetTypedConfig()); err == nil {
			dst.ConfigType = &corev3.TransportSocket_TypedConfig{TypedConfig: merged}
		}
	}
	return true
}

// typedFilter is a filter with a name and a typed config: network,
// listener and HTTP filters.
type typedFilter interface {
	proto.Message
	GetName() string
	GetTypedConfig() *anypb.Any
}

// mergeFilterConfig merges a filter patch into a filter: the patch's
// name, when it has one, and its typed config into the filter's (Istio's
// MERGE of filters, MergeAnyWithAny). A filter without a typed config is
// left alone, as in Istio; false then.
func mergeFilterConfig[F typedFilter](f, v F) bool {
	if f.GetTypedConfig() == nil {
		return false
	}
	var merged *anypb.Any
	if v.GetTypedConfig() != nil {
		var err error
		if merged, err = mergeAny(f.GetTypedConfig(), v.GetTypedConfig()); err != nil {
			merged = nil
		}
	}
	name := f.GetName()
	if v.GetName() != "" {
		name = v.GetName()
	}
	switch x := any(f).(type) {
	case *listenerv3.Filter:
		x.Name = name
		if merged != nil {
			x.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: merged}
		}
	case *listenerv3.ListenerFilter:
		x.Name = name
		if merged != nil {
			x.ConfigType = &listenerv3.ListenerFilter_TypedConfig{TypedConfig: merged}
		}
	case *hcmv3.HttpFilter:
		x.Name = name
		if merged != nil {
			x.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: merged}
		}
	}
	return true
}

// patchHCM applies the HTTP filter patches to a connection manager, and
// on the inbound side the route configuration patches to its own routes.
func patchHCM(ctx efContext, l *listenerv3.Listener, fc *listenerv3.FilterChain, f *listenerv3.Filter, ps *patchSet, only func(*efPatch) bool, t *tracker) {
	hps := ps.patches(networking.EnvoyFilter_HTTP_FILTER, only)
	inline := ctx == networking.EnvoyFilter_SIDECAR_INBOUND && (len(ps.patches(networking.EnvoyFilter_ROUTE_CONFIGURATION, only)) > 0 ||
		len(ps.patches(networking.EnvoyFilter_VIRTUAL_HOST, only)) > 0 || len(ps.patches(networking.EnvoyFilter_HTTP_ROUTE, only)) > 0)
	if len(hps) == 0 && !inline {
		return
	}
	h := &hcmv3.HttpConnectionManager{}
	if err := f.GetTypedConfig().UnmarshalTo(h); err != nil {
		return
	}
	before := t.n
	for _, p := range hps {
		if isMerge(p.Operation) || !contextMatch(ctx, p) || !listenerMatch(l, p) || !filterChainMatch(l, fc, p) || !networkFilterMatch(f, p) {
			continue
		}
		sub := p.Match.GetListener().GetFilterChain().GetFilter().GetSubFilter()
		var ok bool
		if h.HttpFilters, ok = listOp(h.HttpFilters, p, sub != nil, func(hf *hcmv3.HttpFilter) bool { return hf.GetName() == sub.GetName() }); ok {
			t.applied(p)
		}
	}
	for _, hf := range h.GetHttpFilters() {
		for _, p := range hps {
			if p.Operation != networking.EnvoyFilter_Patch_MERGE || !contextMatch(ctx, p) || !listenerMatch(l, p) || !filterChainMatch(l, fc, p) || !networkFilterMatch(f, p) {
				continue
			}
			if sub := p.Match.GetListener().GetFilterChain().GetFilter().GetSubFilter(); sub != nil && sub.GetName() != hf.GetName() {
				continue
			}
			if mergeFilterConfig(hf, p.Value.(*hcmv3.HttpFilter)) {
				t.applied(p)
			}
		}
	}
	if rc := h.GetRouteConfig(); inline && rc != nil {
		patchRouteConfiguration(ctx, rc, ps, only, t)
	}
	if t.n != before {
		if a, err := anypb.New(h); err == nil {
			f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		}
	}
}

// listenerMatch is Istio's: by name, and by port except for a patch
// below the listener on the virtual listeners (their chains carry the
// port, filterChainMatch).
func listenerMatch(l *listenerv3.Listener, p *efPatch) bool {
	m := p.Match.GetListener()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != l.GetName() {
		return false
	}
	if p.ApplyTo != networking.EnvoyFilter_LISTENER && virtualListener(l) {
		return true
	}
	return m.GetPortNumber() == 0 || l.GetAddress().GetSocketAddress().GetPortValue() == m.GetPortNumber()
}

func virtualListener(l *listenerv3.Listener) bool {
	return l.GetName() == VirtualInbound || l.GetName() == VirtualOutbound
}

// filterChainMatch is Istio's: on a virtual listener the port is the
// chain's destination port; then name, SNI, transport protocol,
// application protocols (all of a comma-separated list) and destination
// port.
func filterChainMatch(l *listenerv3.Listener, fc *listenerv3.FilterChain, p *efPatch) bool {
	lm := p.Match.GetListener()
	if lm == nil {
		return true
	}
	fcm := fc.GetFilterChainMatch()
	if virtualListener(l) && lm.GetPortNumber() > 0 && fcm.GetDestinationPort().GetValue() != lm.GetPortNumber() {
		return false
	}
	m := lm.GetFilterChain()
	if m == nil {
		return true
	}
	if m.GetName() != "" && m.GetName() != fc.GetName() {
		return false
	}
	if m.GetSni() != "" && !slices.Contains(fcm.GetServerNames(), m.GetSni()) {
		return false
	}
	if m.GetTransportProtocol() != "" && fcm.GetTransportProtocol() != m.GetTransportProtocol() {
		return false
	}
	if m.GetApplicationProtocols() != "" {
		if fcm == nil {
			return false
		}
		for _, ap := range strings.Split(m.GetApplicationProtocols(), ",") {
			if !slices.Contains(fcm.GetApplicationProtocols(), ap) {
				return false
			}
		}
	}
	if m.GetDestinationPort() > 0 && fcm.GetDestinationPort().GetValue() != m.GetDestinationPort() {
		return false
	}
	return true
}

func networkFilterMatch(f *listenerv3.Filter, p *efPatch) bool {
	m := p.Match.GetListener().GetFilterChain().GetFilter()
	return m == nil || m.GetName() == f.GetName()
}

// addedListeners are the listeners the patches add (Istio's
// patchListeners, adds).
func (g *gen) addedListeners() []*listenerv3.Listener {
	return added[*listenerv3.Listener](g, networking.EnvoyFilter_LISTENER, "listener")
}

// patchListeners patches a proxy's listeners (the flavour's, never
// changed) into a new list, with the added ones, sorted by name.
func (g *gen) patchListeners(ls []*listenerv3.Listener) []*listenerv3.Listener {
	ps := g.envoyFilters()
	if ps == nil {
		return ls
	}
	// An inbound connection manager's own routes take the route patches.
	if !ps.has(listenerApplyTos) && !ps.has(routeApplyTos) {
		return ls
	}
	out := make([]*listenerv3.Listener, 0, len(ls))
	for _, l := range ls {
		if pl := g.patchOne("listener", l, ps, g.patchListener); pl != nil {
			out = append(out, pl.(*listenerv3.Listener))
		}
	}
	return withAdded(g, out, g.addedListeners(), nil, "listener")
}

// withAdded adds to the resources (sorted by name) those the patches
// add, that names asks for (nil: all), and that no resource has the name
// of already (reported).
func withAdded[R interface {
	proto.Message
	GetName() string
}](g *gen, have, added []R, names []string, kind string) []R {
	if len(added) == 0 {
		return have // sorted already
	}
	for _, a := range added {
		if names != nil && !slices.Contains(names, a.GetName()) {
			continue
		}
		if slices.ContainsFunc(have, func(r R) bool { return r.GetName() == a.GetName() }) {
			g.efProblem(g.ef.by[kind+"/"+a.GetName()], "EnvoyFilters %s: %s %s is not added: one of that name exists", strings.Join(g.ef.by[kind+"/"+a.GetName()], ", "), kind, a.GetName())
			continue
		}
		have = append(have, a)
	}
	sortByName(have)
	return have
}
