package golden

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/textdiff"
)

// Named is a golden document of resources grouped (by the proxy they were
// made for) and named (by their xDS name): group → name → resource. It is
// written as indented JSON with sorted keys, so a resource is found by its
// name and a change is shown per resource.
type Named map[string]map[string]json.RawMessage

// Add puts msgs into group, each under the name name gives it; a group
// with no messages is still recorded (as empty).
func Add[T proto.Message](tb testing.TB, n Named, group string, msgs []T, name func(T) string) {
	tb.Helper()
	g := n[group]
	if g == nil {
		g = map[string]json.RawMessage{}
		n[group] = g
	}
	for _, m := range msgs {
		b, err := protojson.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		k := name(m)
		if _, dup := g[k]; dup {
			tb.Fatalf("%s: two resources named %q", group, k)
		}
		g[k] = b
	}
}

// CheckNamed compares got with the Named document at path; with update it
// writes got there first. A mismatch lists each resource added, removed
// or changed, the changed ones whole with their differing lines marked
// (- want, + got), so the change is read in the resource it belongs to.
func CheckNamed(tb testing.TB, path string, got Named, update bool) {
	tb.Helper()
	gotBytes := Indent(tb, got)
	if update {
		if err := os.WriteFile(path, gotBytes, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	wantBytes, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (run go test -update)", err)
	}
	if bytes.Equal(gotBytes, wantBytes) {
		return
	}
	var want Named
	if err := json.Unmarshal(wantBytes, &want); err != nil {
		tb.Errorf("%s differs and is not a golden document of named resources (%v); run go test -update if the change is intended (- want, + got):\n%s",
			path, err, Diff(string(wantBytes), string(gotBytes)))
		return
	}
	report := NamedDiff(tb, want, got)
	if report == "" { // the same resources, written differently
		report = Diff(string(wantBytes), string(gotBytes))
	}
	tb.Errorf("%s differs; run go test -update if the change is intended (- want, + got):\n%s", path, report)
}

// NamedDiff describes how got differs from want, resource by resource;
// empty when they hold the same resources.
func NamedDiff(tb testing.TB, want, got Named) string {
	tb.Helper()
	var b strings.Builder
	for _, group := range unionKeys(want, got) {
		w, g := want[group], got[group]
		if w == nil && g != nil {
			fmt.Fprintf(&b, "+ %s: a group the golden file does not have (%d resources)\n", group, len(g))
		}
		if g == nil && w != nil {
			fmt.Fprintf(&b, "- %s: a group no longer produced (%d resources)\n", group, len(w))
		}
		for _, name := range unionKeys(w, g) {
			wr, inW := w[name]
			gr, inG := g[name]
			switch {
			case !inW:
				fmt.Fprintf(&b, "=== %s: added %s\n%s", group, name, prefixLines("+ ", string(Indent(tb, gr))))
			case !inG:
				fmt.Fprintf(&b, "=== %s: removed %s\n%s", group, name, prefixLines("- ", string(Indent(tb, wr))))
			default:
				ws, gs := string(Indent(tb, wr)), string(Indent(tb, gr))
				if ws != gs {
					fmt.Fprintf(&b, "=== %s: changed %s\n%s", group, name, textdiff.WithContext(ws, gs, len(ws)+len(gs)))
				}
			}
		}
	}
	return b.String()
}

func unionKeys[V any](a, b map[string]V) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func prefixLines(prefix, s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}
