package xds

import (
	"fmt"
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
	h := heldSet(nil).update(func() []*nameVersion {
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
			if got := h.update(nil, unknown); len(got) != len(h) || &got[0] != &h[0] {
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

func held(pairs ...string) heldSet {
	var h heldSet
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, &nameVersion{name: pairs[i], version: pairs[i+1]})
	}
	return h
}

func pairs(h heldSet) []string {
	var out []string
	for _, e := range h {
		out = append(out, e.name, e.version)
	}
	return out
}

func TestHeldSetUpdateReplacesAddsAndRemovesInNameOrder(t *testing.T) {
	base := held("a", "1", "c", "1", "e", "1")
	for _, tc := range []struct {
		name    string
		put     heldSet
		removed []string
		want    []string
	}{
		{"nothing", nil, nil, []string{"a", "1", "c", "1", "e", "1"}},
		{"replaced", held("c", "2"), nil, []string{"a", "1", "c", "2", "e", "1"}},
		{
			"added before, between and after", held("f", "1", "b", "1", "0", "1"), nil,
			[]string{"0", "1", "a", "1", "b", "1", "c", "1", "e", "1", "f", "1"},
		},
		{"removed, and a name not held", nil, []string{"c", "zz"}, []string{"a", "1", "e", "1"}},
		{"put and removed at once", held("b", "2"), []string{"a", "e"}, []string{"b", "2", "c", "1"}},
		{"a name both put and removed is held", held("c", "3"), []string{"c"}, []string{"a", "1", "c", "3", "e", "1"}},
		{"of a name put twice, the last", held("d", "1", "d", "2"), nil, []string{"a", "1", "c", "1", "d", "2", "e", "1"}},
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
	if len(h) != 2 || h[0] != a.nameVersion || h[1] != b.nameVersion {
		t.Fatalf("heldOf = %q, want a then b, the encodings' own", pairs(h))
	}
}

func TestEqualHeldSetsAreInternedToOneCopy(t *testing.T) {
	a, b, b2 := &nameVersion{"a", "1"}, &nameVersion{"b", "1"}, &nameVersion{"b", "2"}
	var in heldSets
	first := in.intern(heldSet{a, b})
	again := in.intern(heldSet(nil).update(heldSet{b, a}, nil)) // built apart, the same encodings
	if &first[0] != &again[0] || len(again) != 2 {
		t.Fatalf("equal sets were not shared: %q and %q", pairs(first), pairs(again))
	}
	if cap(first) != len(first) {
		t.Fatalf("the interned set keeps room to spare: cap %d, len %d", cap(first), len(first))
	}
	for name, other := range map[string]heldSet{
		"another encoding of a name": {a, b2},
		"fewer resources":            {a},
		"another order":              {b, a}, // never built by update, but not the same set
	} {
		if got := in.intern(other); &got[0] == &first[0] || !slices.Equal(got, other) {
			t.Errorf("%s: interned as %q, want its own %q", name, pairs(got), pairs(other))
		}
	}
	if in.intern(nil) != nil || in.intern(heldSet{}) != nil {
		t.Error("an empty set is not nil")
	}
}

func TestAnInternedSetNoStreamHoldsIsForgotten(t *testing.T) {
	var in heldSets
	keep := in.intern(heldSet{{"kept", "1"}})
	for i := range 100 {
		in.intern(heldSet{{"dropped", strconv.Itoa(i)}})
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
	if got := in.intern(heldSet{keep[0]}); &got[0] != &keep[0] {
		t.Fatal("the set still held is no longer shared")
	}
}
