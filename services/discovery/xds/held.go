package xds

// This file holds what a stream remembers of each type, in forms that
// thousands of streams can afford. The names it subscribes to are interned, so
// streams asking for the same names share one copy. What it holds is one
// pointer per resource, to the name and version that the resource's encoding
// carries.

import (
	"hash/maphash"
	"iter"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unique"
	"unsafe"
	"weak"

	"google.golang.org/protobuf/encoding/protowire"
)

// nameSet is a set of resource names. It is sorted, has no duplicates, is
// immutable, and is interned (package unique). Every stream subscribed to
// the same names shares one copy of them: a thousand sidecars watching the
// same six hundred clusters hold those names once, not a thousand times.
// The zero value is the empty set. Two sets are equal exactly when their
// values are (==).
type nameSet struct {
	// packed is the names in order, each preceded by its length as a
	// varint.
	packed unique.Handle[string]
	n      int
}

// makeNameSet is the set of names, "*" left out: in xDS it names no
// resource but asks for all of them, which the callers keep apart.
func makeNameSet(names []string) nameSet {
	sorted := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "*" })
	if len(sorted) == 0 {
		return nameSet{}
	}
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	size := 0
	for _, n := range sorted {
		size += protowire.SizeVarint(uint64(len(n))) + len(n)
	}
	b := make([]byte, 0, size)
	for _, n := range sorted {
		b = protowire.AppendVarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	return nameSet{packed: unique.Make(string(b)), n: len(sorted)}
}

func (s nameSet) len() int { return s.n }

// list is the names, sorted. The strings share the interned copy's bytes.
func (s nameSet) list() []string {
	if s.n == 0 {
		return nil
	}
	p := s.packed.Value()
	out := make([]string, 0, s.n)
	for len(p) > 0 {
		var n string
		n, p = next(p)
		out = append(out, n)
	}
	return out
}

// next splits the first name off packed.
func next(packed string) (name, rest string) {
	l, k := 0, 0
	for shift := 0; ; shift += 7 {
		c := packed[k]
		k++
		l |= int(c&0x7f) << shift
		if c < 0x80 {
			break
		}
	}
	return packed[k : k+l], packed[k+l:]
}

// sameAs reports whether names, "*" left out, are the set's names in
// its order. It allocates nothing: a request that names what the last
// one did, in the same order (Envoy's ACKs do), costs no new set.
func (s nameSet) sameAs(names []string) bool {
	var p string
	if s.n > 0 {
		p = s.packed.Value()
	}
	for _, n := range names {
		if n == "*" {
			continue
		}
		if p == "" {
			return false
		}
		var have string
		have, p = next(p)
		if have != n {
			return false
		}
	}
	return p == ""
}

// with is the set with add added and remove removed, in that order. A
// request that changes nothing (names held already subscribed, names not
// held unsubscribed) costs a walk of the set and allocates no new one.
func (s nameSet) with(add, remove []string) nameSet {
	if !s.changedBy(add, remove) {
		return s
	}
	gone := make(map[string]bool, len(remove))
	for _, n := range remove {
		gone[n] = true
	}
	var out []string
	for _, n := range append(s.list(), add...) {
		if !gone[n] {
			out = append(out, n)
		}
	}
	return makeNameSet(out)
}

// changedBy reports whether adding add and then removing remove changes
// the set ("*" names nothing): one walk of the set beside the requests'
// names, sorted.
func (s nameSet) changedBy(add, remove []string) bool {
	add = slices.DeleteFunc(slices.Clone(add), func(n string) bool { return n == "*" })
	if len(add) == 0 && len(remove) == 0 {
		return false
	}
	removing := make(map[string]bool, len(remove))
	for _, n := range remove {
		removing[n] = true
	}
	for _, n := range add {
		if !removing[n] { // added then removed: no change by itself
			removing[n] = false
		}
	}
	want := make([]string, 0, len(removing)) // names whose presence matters, in order
	for n := range removing {
		want = append(want, n)
	}
	slices.Sort(want)
	var p string
	if s.n > 0 {
		p = s.packed.Value()
	}
	for _, n := range want {
		held := false
		for p != "" {
			var have string
			have, rest := next(p)
			if have >= n {
				held = have == n
				break
			}
			p = rest
		}
		if held == removing[n] { // held and removed, or not held and added
			return true
		}
	}
	return false
}

// bytes is the size of the set's names as it holds them.
func (s nameSet) bytes() int {
	if s.n == 0 {
		return 0
	}
	return len(s.packed.Value())
}

// nameVersion is a resource's name and version. Each encoded resource
// carries one, and every stream that holds that encoding points at it.
type nameVersion struct{ name, version string }

// heldSet is what a proxy holds of one type, as far as the server knows:
// one pointer per resource, sorted by name, in chunks. The pointers go to
// the nameVersion of the encoding that was sent, which the push context
// shares among the proxies it was built for. The chunks' boundaries depend
// on the names alone (a chunk ends after a name whose hash ends in six zero
// bits, or at maxChunk names), so two sets that differ in a few resources
// have the same chunks away from them; interned (heldSets), proxies share
// those chunks. A sidecar holding the mesh's six thousand clusters and its
// own inbound few costs its own chunk and a pointer per chunk, not a copy
// of the six thousand. A heldSet is never changed in place: update returns
// a new one, so a reader may keep one, and streams may share one, without a
// lock. The zero value holds nothing.
type heldSet struct {
	// chunks are non-empty and in order: every name of one is before
	// every name of the next.
	chunks [][]*nameVersion
	n      int
	// keptHead and keptTail count the chunks at either end that update
	// took from the set it updated, as they were: intern leaves them.
	keptHead, keptTail int
}

// The chunks of a heldSet: a chunk ends after a name whose hash has the
// chunkMask bits clear (64 names on average), or at maxChunk names.
const (
	chunkMask = 1<<6 - 1
	maxChunk  = 256
)

// endsChunk reports whether a chunk ends after name (FNV-1a: the same
// boundaries in every process, so replicas and restarts agree).
func endsChunk(name string) bool {
	h := uint32(2166136261)
	for i := range len(name) {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return h&chunkMask == 0
}

// chunked is the set of sorted, one per name.
func chunked(sorted []*nameVersion) heldSet {
	h := heldSet{n: len(sorted)}
	start := 0
	for i, e := range sorted {
		if i+1-start == maxChunk || endsChunk(e.name) || i == len(sorted)-1 {
			h.chunks = append(h.chunks, sorted[start:i+1:i+1])
			start = i + 1
		}
	}
	return h
}

// len is how many resources are held.
func (h heldSet) len() int { return h.n }

// all is what is held, by name.
func (h heldSet) all() iter.Seq[*nameVersion] {
	return func(yield func(*nameVersion) bool) {
		for _, c := range h.chunks {
			for _, e := range c {
				if !yield(e) {
					return
				}
			}
		}
	}
}

func byName(a, b *nameVersion) int { return strings.Compare(a.name, b.name) }

// heldOf is holding exactly res.
func heldOf(res []*named) heldSet { return heldSet{}.update(versions(res), nil) }

// versions are the names and versions of res.
func versions(res []*named) []*nameVersion {
	out := make([]*nameVersion, len(res))
	for i, r := range res {
		out[i] = r.nameVersion
	}
	return out
}

// version is the version held of name.
func (h heldSet) version(name string) (string, bool) {
	// The first chunk whose last name is not before name.
	k, _ := slices.BinarySearchFunc(h.chunks, name, func(c []*nameVersion, n string) int { return strings.Compare(c[len(c)-1].name, n) })
	if k == len(h.chunks) {
		return "", false
	}
	c := h.chunks[k]
	i, ok := slices.BinarySearchFunc(c, name, func(e *nameVersion, n string) int { return strings.Compare(e.name, n) })
	if !ok {
		return "", false
	}
	return c[i].version, true
}

// update is h with put held (replacing what is held of the same names;
// of a name twice in put, the last) and removed no longer held (a name in
// both is held). It rebuilds only the chunks the changes fall in, and the
// ones after them up to where the chunks' boundaries meet the old ones
// again (boundaries depend on the names from a chunk's start, so from a
// shared boundary on the chunks are the old ones); the others are h's, as
// they are (interned already when h was). A push of a few load
// assignments to a proxy holding thousands costs a few chunks, not the
// whole set. The result's chunks are those chunked would cut from the
// merged list (held_internal_test checks it).
func (h heldSet) update(put []*nameVersion, removed []string) heldSet {
	if len(put) == 0 && !h.holdsAny(removed) {
		return heldSet{chunks: h.chunks, n: h.n, keptHead: len(h.chunks)}
	}
	put = slices.Clone(put)
	slices.SortStableFunc(put, byName)
	for k := len(put) - 1; k > 0; k-- {
		if put[k].name == put[k-1].name {
			put = slices.Delete(put, k-1, k) // the later one stays
		}
	}
	var gone map[string]bool
	lastGone := ""
	if len(removed) > 0 {
		gone = make(map[string]bool, len(removed))
		for _, n := range removed {
			gone[n] = true
			lastGone = max(lastGone, n)
		}
	}
	// The first chunk a change can fall in: the first whose last name is
	// not before the first name changed (the last chunk, which ends only
	// because the list does, when every change is after it).
	firstChanged := ""
	switch {
	case len(put) > 0 && gone != nil:
		firstChanged = min(put[0].name, slices.Min(removed))
	case len(put) > 0:
		firstChanged = put[0].name
	default:
		firstChanged = slices.Min(removed)
	}
	first, _ := slices.BinarySearchFunc(h.chunks, firstChanged, func(c []*nameVersion, n string) int { return strings.Compare(c[len(c)-1].name, n) })
	first = max(0, min(first, len(h.chunks)-1))

	out := heldSet{chunks: slices.Clone(h.chunks[:first]), keptHead: first}
	var cur []*nameVersion
	emit := func(e *nameVersion) {
		cur = append(cur, e)
		if len(cur) == maxChunk || endsChunk(e.name) {
			out.chunks = append(out.chunks, cur)
			cur = nil
		}
	}
	j := 0
	for c := first; c < len(h.chunks); c++ {
		// At an old boundary with every change made: the rest is h's.
		if len(cur) == 0 && j == len(put) && (gone == nil || h.chunks[c][0].name > lastGone) && c > first {
			out.chunks = append(out.chunks, h.chunks[c:]...)
			out.keptTail = len(h.chunks) - c
			break
		}
		for _, e := range h.chunks[c] {
			for j < len(put) && put[j].name < e.name {
				emit(put[j])
				j++
			}
			switch {
			case j < len(put) && put[j].name == e.name: // put replaces it
				emit(put[j])
				j++
			case !gone[e.name]:
				emit(e)
			}
		}
	}
	for ; j < len(put); j++ {
		emit(put[j])
	}
	if len(cur) > 0 {
		out.chunks = append(out.chunks, cur)
	}
	for _, c := range out.chunks {
		out.n += len(c)
	}
	if out.n == 0 {
		return heldSet{}
	}
	return out
}

// sameAsHeld reports whether the resources built for names (nil: for
// everything the proxy holds) are exactly what the proxy holds of them, at
// the versions it holds.
func sameAsHeld(res []*named, names []string, held heldSet) bool {
	n := held.len()
	if names != nil {
		n = 0
		for _, name := range names {
			if _, ok := held.version(name); ok {
				n++
			}
		}
	}
	if n != len(res) {
		return false
	}
	for _, r := range res {
		if v, ok := held.version(r.name); !ok || v != r.version {
			return false
		}
	}
	return true
}

// holdsAny reports whether h holds any of names, at a cost that grows
// with names, not with h.
func (h heldSet) holdsAny(names []string) bool {
	for _, n := range names {
		if _, ok := h.version(n); ok {
			return true
		}
	}
	return false
}

// heldSets interns the chunks of heldSets: the proxies of one scope are
// sent the same encodings of a type (every sidecar of a namespace the same
// six hundred load assignments), so they hold equal chunks, and with this
// they hold one copy of each, as nameSet does for the names they ask for.
// Chunks are held weakly: one that no stream holds any more is collected,
// and its entry goes with it. The zero value is ready to use.
type heldSets struct {
	once sync.Once
	seed maphash.Seed

	mu sync.Mutex
	m  map[uint64][]heldRef
}

// heldRef refers weakly to an interned chunk, by its first element.
type heldRef struct {
	first weak.Pointer[*nameVersion]
	n     int
}

// intern is h with each chunk the interned chunk equal to it (the same
// pointers in the same order): the chunk itself, copied to its length,
// where no such chunk is held. The chunks update kept from the set it
// updated are left as they are: when that set was interned, so are they.
func (in *heldSets) intern(h heldSet) heldSet {
	if h.n == 0 {
		return heldSet{}
	}
	in.once.Do(func() { in.seed, in.m = maphash.MakeSeed(), map[uint64][]heldRef{} })
	out := heldSet{chunks: slices.Clone(h.chunks), n: h.n}
	in.mu.Lock()
	defer in.mu.Unlock()
	for i := h.keptHead; i < len(h.chunks)-h.keptTail; i++ {
		out.chunks[i] = in.internChunk(h.chunks[i])
	}
	return out
}

// internChunk is the interned chunk equal to c. Call with mu held.
func (in *heldSets) internChunk(c []*nameVersion) []*nameVersion {
	var mh maphash.Hash
	mh.SetSeed(in.seed)
	for _, p := range c {
		maphash.WriteComparable(&mh, p)
	}
	key := mh.Sum64()
	for _, r := range in.m[key] {
		if first := r.first.Value(); first != nil && r.n == len(c) {
			held := unsafe.Slice(first, r.n) //nolint:gosec // first is the first of the r.n elements interned, and alive (Value)
			if slices.Equal(held, c) {
				return held
			}
		}
	}
	c = slices.Clip(slices.Clone(c)) // update's result shares one array among its chunks
	in.m[key] = append(in.m[key], heldRef{first: weak.Make(&c[0]), n: len(c)})
	runtime.AddCleanup(&c[0], in.forget, key)
	return c
}

// forget drops the entries of key whose sets were collected.
func (in *heldSets) forget(key uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	live := slices.DeleteFunc(in.m[key], func(r heldRef) bool { return r.first.Value() == nil })
	if len(live) == 0 {
		delete(in.m, key)
		return
	}
	in.m[key] = live
}
