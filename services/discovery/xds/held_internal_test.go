package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNameSetIsTheSortedNamesWithoutDuplicates(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string
		want  []string
	}{
		{"empty", nil, nil},
		{"one", []string{"a"}, []string{"a"}},
		{"unsorted with a duplicate", []string{"c", "a", "b", "a"}, []string{"a", "b", "c"}},
		{"the empty name", []string{"", "x"}, []string{"", "x"}},
		{"a name of the largest size", []string{strings.Repeat("n", maxNameBytes), "m"}, []string{"m", strings.Repeat("n", maxNameBytes)}},
		{"names of lengths that take one, two and three varint bytes", []string{strings.Repeat("c", 1<<14), strings.Repeat("b", 128), "a"}, []string{"a", strings.Repeat("b", 128), strings.Repeat("c", 1<<14)}},
		{"the wildcard is no name", []string{"*", "a", "*"}, []string{"a"}},
		{"only the wildcard", []string{"*"}, nil},
		{"names with the bytes the packing uses", []string{"\x00\x01", "\xff\xff", "a\x00b"}, []string{"\x00\x01", "a\x00b", "\xff\xff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := makeNameSet(tc.names)
			if got := s.list(); !slices.Equal(got, tc.want) {
				t.Fatalf("list() = %q, want %q", got, tc.want)
			}
			if s.len() != len(tc.want) {
				t.Fatalf("len() = %d, want %d", s.len(), len(tc.want))
			}
		})
	}
}

func TestNameSetsOfTheSameNamesAreEqualWhateverTheOrder(t *testing.T) {
	a := makeNameSet([]string{"x", "y", "z"})
	if b := makeNameSet([]string{"z", "x", "y", "x"}); a != b {
		t.Fatal("the same names in another order make another set")
	}
	if c := makeNameSet([]string{"x", "y"}); a == c {
		t.Fatal("fewer names make the same set")
	}
	if makeNameSet(nil) != (nameSet{}) || makeNameSet([]string{}) != (nameSet{}) {
		t.Fatal("no names is not the zero set")
	}
}

func TestNameSetWithAddsThenRemoves(t *testing.T) {
	s := makeNameSet([]string{"a", "b"})
	for _, tc := range []struct {
		name        string
		add, remove []string
		want        []string
	}{
		{"nothing", nil, nil, []string{"a", "b"}},
		{"add", []string{"c", "a"}, nil, []string{"a", "b", "c"}},
		{"remove", nil, []string{"a", "absent"}, []string{"b"}},
		{"added and removed", []string{"c"}, []string{"c", "b"}, []string{"a"}},
		{"all removed", nil, []string{"a", "b"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.with(tc.add, tc.remove).list(); !slices.Equal(got, tc.want) {
				t.Fatalf("with(%q, %q) = %q, want %q", tc.add, tc.remove, got, tc.want)
			}
		})
	}
	if got := s.list(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("with changed the set it was called on: %q", got)
	}
}

func TestNameSetSameAsIsTheSetsNamesInItsOrder(t *testing.T) {
	s := makeNameSet([]string{"b", "a", "c"})
	for _, tc := range []struct {
		names []string
		want  bool
	}{
		{[]string{"a", "b", "c"}, true},
		{[]string{"*", "a", "b", "*", "c"}, true},
		{[]string{"c", "b", "a"}, false}, // the same set, another order: makeNameSet tells
		{[]string{"a", "b"}, false},
		{[]string{"a", "b", "c", "d"}, false},
		{nil, false},
	} {
		if got := s.sameAs(tc.names); got != tc.want {
			t.Errorf("sameAs(%q) = %v, want %v", tc.names, got, tc.want)
		}
	}
	if !(nameSet{}).sameAs(nil) || !(nameSet{}).sameAs([]string{"*"}) || (nameSet{}).sameAs([]string{"a"}) {
		t.Error("the empty set is not exactly no names")
	}
}

func FuzzNameSetListsWhatItWasMadeOf(f *testing.F) {
	f.Add("a\nb\nc", "b")
	f.Add("\x00\n\xff\n", "")
	f.Fuzz(func(t *testing.T, joined, removed string) {
		names := strings.Split(joined, "\n")
		want := slices.Compact(slices.Sorted(slices.Values(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "*" }))))
		s := makeNameSet(names)
		if got := s.list(); !slices.Equal(got, want) || s.len() != len(want) {
			t.Fatalf("makeNameSet(%q).list() = %q (len %d), want %q", names, got, s.len(), want)
		}
		if !s.sameAs(want) || (len(want) > 0 && s.sameAs(want[1:])) {
			t.Fatalf("sameAs of %q is wrong", want)
		}
		if got := s.with(nil, []string{removed}).list(); slices.Contains(got, removed) || len(got) != len(want)-boolInt(slices.Contains(want, removed)) {
			t.Fatalf("removing %q from %q: %q", removed, want, got)
		}
	})
}

// FuzzNameSetChangedByIsWhetherWithChangesIt: changedBy, which walks the
// set without building one, agrees with building the set.
func FuzzNameSetChangedByIsWhetherWithChangesIt(f *testing.F) {
	f.Add("a\nb\nc", "b\nd", "d\na")
	f.Add("a\nb", "a", "zz")
	f.Add("", "*", "")
	f.Fuzz(func(t *testing.T, joined, add, remove string) {
		s := makeNameSet(strings.Split(joined, "\n"))
		a, r := strings.Split(add, "\n"), strings.Split(remove, "\n")
		gone := map[string]bool{}
		for _, n := range r {
			gone[n] = true
		}
		var rebuilt []string
		for _, n := range append(s.list(), a...) {
			if !gone[n] {
				rebuilt = append(rebuilt, n)
			}
		}
		want := makeNameSet(rebuilt) != s
		if got := s.changedBy(a, r); got != want {
			t.Fatalf("%q changedBy(%q, %q) = %v, want %v", s.list(), a, r, got, want)
		}
	})
}

// TestARequestThatChangesNothingCostsItsOwnSizeNotTheSets: unsubscribing
// a name never subscribed, or subscribing one held, from a stream holding
// 4,000 names of 1 KB allocates what the request's name does, not a copy
// of the set (each such request once rebuilt the whole set); nor does
// forgetting it from what the stream holds.
func TestARequestThatChangesNothingCostsItsOwnSizeNotTheSets(t *testing.T) {
	names := make([]string, 4_000)
	for i := range names {
		names[i] = fmt.Sprintf("outbound|80||svc-%06d.default.svc.cluster.local", i) + strings.Repeat("x", 950)
	}
	s := makeNameSet(names)
	h := heldSet{}.update(func() []*nameVersion {
		out := make([]*nameVersion, len(names))
		for i, n := range names {
			out[i] = &nameVersion{name: n, version: "1"}
		}
		return out
	}(), nil)
	unknown, known := []string{"never-subscribed"}, []string{names[1234]}
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 100 {
			f()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 100
	}
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"unsubscribe an unknown name", func() {
			if s.with(nil, unknown) != s {
				t.Fatal("the set changed")
			}
		}},
		{"subscribe a name held", func() {
			if s.with(known, nil) != s {
				t.Fatal("the set changed")
			}
		}},
		{"forget a name not held", func() {
			if got := h.update(nil, unknown); got.len() != h.len() || &got.chunks[0][0] != &h.chunks[0][0] {
				t.Fatal("the held set was copied")
			}
		}},
	} {
		if n := allocated(tc.f); n > 1<<10 {
			t.Errorf("%s: %d bytes allocated per request on a set of %d KiB", tc.name, n, s.bytes()>>10)
		}
	}
	if s.with(nil, known) == s {
		t.Fatal("unsubscribing a name held did not change the set")
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nvs is the names and versions of pairs, in their order.
func nvs(pairs ...string) []*nameVersion {
	var out []*nameVersion
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, &nameVersion{name: pairs[i], version: pairs[i+1]})
	}
	return out
}

// held is holding pairs (in name order).
func held(pairs ...string) heldSet { return chunked(nvs(pairs...)) }

func pairs(h heldSet) []string {
	var out []string
	for e := range h.all() {
		out = append(out, e.name, e.version)
	}
	return out
}

func TestHeldSetUpdateReplacesAddsAndRemovesInNameOrder(t *testing.T) {
	base := held("a", "1", "c", "1", "e", "1")
	for _, tc := range []struct {
		name    string
		put     []*nameVersion
		removed []string
		want    []string
	}{
		{"nothing", nil, nil, []string{"a", "1", "c", "1", "e", "1"}},
		{"replaced", nvs("c", "2"), nil, []string{"a", "1", "c", "2", "e", "1"}},
		{
			"added before, between and after", nvs("f", "1", "b", "1", "0", "1"), nil,
			[]string{"0", "1", "a", "1", "b", "1", "c", "1", "e", "1", "f", "1"},
		},
		{"removed, and a name not held", nil, []string{"c", "zz"}, []string{"a", "1", "e", "1"}},
		{"put and removed at once", nvs("b", "2"), []string{"a", "e"}, []string{"b", "2", "c", "1"}},
		{"a name both put and removed is held", nvs("c", "3"), []string{"c"}, []string{"a", "1", "c", "3", "e", "1"}},
		{"of a name put twice, the last", nvs("d", "1", "d", "2"), nil, []string{"a", "1", "c", "1", "d", "2", "e", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := base.update(tc.put, tc.removed)
			if !slices.Equal(pairs(got), tc.want) {
				t.Fatalf("update = %q, want %q", pairs(got), tc.want)
			}
			for i := 0; i < len(tc.want); i += 2 {
				if v, ok := got.version(tc.want[i]); !ok || v != tc.want[i+1] {
					t.Fatalf("version(%q) = %q, %v; want %q", tc.want[i], v, ok, tc.want[i+1])
				}
			}
		})
	}
	if !slices.Equal(pairs(base), []string{"a", "1", "c", "1", "e", "1"}) {
		t.Fatalf("update changed the set it was called on: %q", pairs(base))
	}
	if _, ok := base.version("b"); ok {
		t.Fatal("a name not held has a version")
	}
}

func TestHeldOfPointsAtTheEncodingsVersions(t *testing.T) {
	b := &named{nameVersion: &nameVersion{name: "b", version: "1"}}
	a := &named{nameVersion: &nameVersion{name: "a", version: "2"}}
	h := heldOf([]*named{b, a})
	if all := slices.Collect(h.all()); len(all) != 2 || all[0] != a.nameVersion || all[1] != b.nameVersion {
		t.Fatalf("heldOf = %q, want a then b, the encodings' own", pairs(h))
	}
}

func TestEqualHeldSetsAreInternedToOneCopy(t *testing.T) {
	a, b, b2 := &nameVersion{"a", "1"}, &nameVersion{"b", "1"}, &nameVersion{"b", "2"}
	var in heldSets
	first := in.intern(chunked([]*nameVersion{a, b}))
	again := in.intern(heldSet{}.update([]*nameVersion{b, a}, nil)) // built apart, the same encodings
	if &first.chunks[0][0] != &again.chunks[0][0] || again.len() != 2 {
		t.Fatalf("equal sets were not shared: %q and %q", pairs(first), pairs(again))
	}
	if c := first.chunks[len(first.chunks)-1]; cap(c) != len(c) {
		t.Fatalf("the interned chunk keeps room to spare: cap %d, len %d", cap(c), len(c))
	}
	for name, other := range map[string][]*nameVersion{
		"another encoding of a name": {a, b2},
		"fewer resources":            {a},
		"another order":              {b, a}, // never built by update, but not the same set
	} {
		got := in.intern(chunked(other))
		if &got.chunks[0][0] == &first.chunks[0][0] && got.len() == first.len() || !slices.Equal(slices.Collect(got.all()), other) {
			t.Errorf("%s: interned as %q, want its own %q", name, pairs(got), pairs(chunked(other)))
		}
	}
	if in.intern(heldSet{}).len() != 0 || in.intern(chunked(nil)).chunks != nil {
		t.Error("an empty set holds something")
	}
}

func TestAnInternedSetNoStreamHoldsIsForgotten(t *testing.T) {
	var in heldSets
	keep := in.intern(held("kept", "1"))
	for i := range 100 {
		in.intern(held("dropped", strconv.Itoa(i)))
	}
	interned := func() int {
		in.mu.Lock()
		defer in.mu.Unlock()
		n := 0
		for _, refs := range in.m {
			n += len(refs)
		}
		return n
	}
	for range 100 { // cleanups run after a collection, on their own goroutine
		if interned() == 1 {
			break
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := interned(); n != 1 {
		t.Fatalf("%d sets interned after the 100 unheld ones were collected, want the 1 still held", n)
	}
	if got := in.intern(chunked([]*nameVersion{keep.chunks[0][0]})); &got.chunks[0][0] != &keep.chunks[0][0] {
		t.Fatal("the set still held is no longer shared")
	}
}

// The sidecars of a namespace hold the mesh's clusters and each its own
// inbound few: interned, they share the mesh's chunks, and each pays for
// the chunks its own names fall in and a pointer per chunk.
func TestSetsThatDifferInAFewNamesShareEveryOtherChunk(t *testing.T) {
	mesh := make([]*nameVersion, 6_000)
	for i := range mesh {
		mesh[i] = &nameVersion{name: fmt.Sprintf("outbound|80|v1|svc-%d.load.svc.cluster.local", i), version: "1"}
	}
	var in heldSets
	var sets []heldSet
	for p := range 50 {
		// Its own: an inbound cluster (before the mesh's, by name) and one
		// among the mesh's, at a place of its own.
		own := []*nameVersion{{name: fmt.Sprintf("inbound|80||%d", p), version: "1"}, {name: fmt.Sprintf("outbound|80|v1|svc-%d.load.svc.cluster.local-own", p*100), version: "1"}}
		sets = append(sets, in.intern(heldSet{}.update(append(slices.Clone(mesh), own...), nil)))
	}
	chunks := map[**nameVersion]int{}
	for _, h := range sets {
		if h.len() != len(mesh)+2 {
			t.Fatalf("a set holds %d, want %d", h.len(), len(mesh)+2)
		}
		for _, c := range h.chunks {
			if len(c) > maxChunk {
				t.Fatalf("a chunk of %d names, more than %d", len(c), maxChunk)
			}
			chunks[&c[0]] += len(c)
		}
	}
	perSet := len(sets[0].chunks)
	// Each set's own two names change at most two chunks of its own: the
	// rest are the shared ones.
	if distinct := len(chunks); distinct > perSet+2*len(sets) {
		t.Errorf("%d distinct chunks among %d sets of %d chunks each: want at most %d (the shared ones and two of each set's own)",
			distinct, len(sets), perSet, perSet+2*len(sets))
	}
	if perSet < len(mesh)/maxChunk || perSet > len(mesh)/8 {
		t.Errorf("%d chunks for %d names: the chunks are not of the size meant", perSet, len(mesh))
	}
	// Every name is found, at its version, through the chunks.
	for _, e := range mesh[:200] {
		if v, ok := sets[7].version(e.name); !ok || v != "1" {
			t.Fatalf("version(%q) = %q, %v", e.name, v, ok)
		}
	}
	if _, ok := sets[7].version("outbound|80|v1|svc-0.load.svc.cluster.local-own"); ok {
		t.Fatal("another set's own name is held")
	}
}

// merged is what update must hold: base with put (the last of a name)
// and without removed, sorted, cut by chunked from the start.
func merged(base heldSet, put []*nameVersion, removed []string) heldSet {
	named := map[string]*nameVersion{}
	for e := range base.all() {
		named[e.name] = e
	}
	for _, n := range removed {
		delete(named, n)
	}
	for _, e := range put {
		named[e.name] = e
	}
	all := slices.Collect(maps.Values(named))
	slices.SortFunc(all, byName)
	return chunked(all)
}

// TestHeldSetUpdateCutsTheChunksChunkedWouldCut: over random sets and
// changes — names that end chunks and long runs that do not, so that
// chunks are also cut at maxChunk — update's chunks are exactly those
// chunked cuts from the merged list, element for element, and the chunks
// it kept are the old set's own.
func TestHeldSetUpdateCutsTheChunksChunkedWouldCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	name := func() string {
		for {
			n := fmt.Sprintf("outbound|80||svc-%d.ns", rng.IntN(5_000))
			// Three of four names do not end a chunk: runs longer than
			// maxChunk happen.
			if !endsChunk(n) || rng.IntN(4) == 0 {
				return n
			}
		}
	}
	some := func(k int) []*nameVersion {
		out := make([]*nameVersion, k)
		for i := range out {
			out[i] = &nameVersion{name: name(), version: strconv.Itoa(rng.IntN(3))}
		}
		return out
	}
	kept := 0
	for round := range 300 {
		base := heldSet{}.update(some(rng.IntN(2_000)), nil)
		var removed []string
		for range rng.IntN(4) {
			removed = append(removed, name())
		}
		if base.len() > 0 && rng.IntN(2) == 0 {
			removed = append(removed, base.chunks[rng.IntN(len(base.chunks))][0].name) // one held
		}
		put := some(rng.IntN(6))
		if round%10 == 0 {
			put = some(rng.IntN(300))
		}
		got, want := base.update(put, removed), merged(base, put, removed)
		if got.len() != want.len() || len(got.chunks) != len(want.chunks) {
			t.Fatalf("round %d: %d names in %d chunks, want %d in %d", round, got.len(), len(got.chunks), want.len(), len(want.chunks))
		}
		for i := range got.chunks {
			if !slices.Equal(got.chunks[i], want.chunks[i]) {
				t.Fatalf("round %d: chunk %d of %d differs: %d names, want %d", round, i, len(got.chunks), len(got.chunks[i]), len(want.chunks[i]))
			}
		}
		old := map[**nameVersion]bool{}
		for _, c := range base.chunks {
			old[&c[0]] = true
		}
		for i, c := range got.chunks {
			isOld := old[&c[0]]
			if (i < got.keptHead || i >= len(got.chunks)-got.keptTail) != isOld {
				t.Fatalf("round %d: chunk %d is the old set's: %v; kept %d at the head and %d at the tail", round, i, isOld, got.keptHead, got.keptTail)
			}
			if isOld {
				kept++
			}
		}
	}
	if kept == 0 {
		t.Fatal("no update kept a chunk of the set it updated")
	}
}

// TestAPushOfAFewResourcesRebuildsAFewChunks: a proxy holding a thousand
// load assignments sent three of them anew keeps every chunk but those
// the three fall in (and the one after, at most, each).
func TestAPushOfAFewResourcesRebuildsAFewChunks(t *testing.T) {
	all := make([]*nameVersion, 1_000)
	for i := range all {
		all[i] = &nameVersion{name: fmt.Sprintf("outbound|80||svc-%d.load.svc.cluster.local", i), version: "1"}
	}
	var in heldSets
	base := in.intern(heldSet{}.update(all, nil))
	put := []*nameVersion{{name: all[10].name, version: "2"}, {name: all[500].name, version: "2"}, {name: all[990].name, version: "2"}}
	got := in.intern(base.update(put, nil))
	old := map[**nameVersion]bool{}
	for _, c := range base.chunks {
		old[&c[0]] = true
	}
	rebuilt := 0
	for _, c := range got.chunks {
		if !old[&c[0]] {
			rebuilt++
		}
	}
	if rebuilt == 0 || rebuilt > 6 {
		t.Errorf("%d of %d chunks rebuilt for three resources, want 1 to 6", rebuilt, len(got.chunks))
	}
	for _, e := range put {
		if v, _ := got.version(e.name); v != "2" {
			t.Errorf("%s at version %q, want 2", e.name, v)
		}
	}
}
