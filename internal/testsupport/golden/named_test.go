package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

func clusterName(c *clusterv3.Cluster) string { return c.GetName() }

func clusters(t *testing.T, cs ...*clusterv3.Cluster) Named {
	t.Helper()
	n := Named{}
	Add(t, n, "sidecar~10.0.0.1", cs, clusterName)
	return n
}

func cluster(name string, lb clusterv3.Cluster_LbPolicy) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, AltStatName: name + "-stat", LbPolicy: lb}
}

func TestNamedDiffShowsAChangedResourceWholeAndNamesAddedAndRemovedOnes(t *testing.T) {
	want := clusters(t, cluster("outbound|80||a", clusterv3.Cluster_RANDOM), cluster("outbound|80||b", clusterv3.Cluster_RANDOM))
	got := clusters(t, cluster("outbound|80||a", clusterv3.Cluster_LEAST_REQUEST), cluster("outbound|80||c", clusterv3.Cluster_RANDOM))
	d := NamedDiff(t, want, got)
	for _, part := range []string{
		"=== sidecar~10.0.0.1: changed outbound|80||a\n",
		`-   "lbPolicy": "RANDOM"`,
		`+   "lbPolicy": "LEAST_REQUEST"`,
		`    "altStatName": "outbound|80||a-stat"`, // the unchanged lines of the resource too
		"=== sidecar~10.0.0.1: removed outbound|80||b\n- {",
		"=== sidecar~10.0.0.1: added outbound|80||c\n+ {",
	} {
		if !strings.Contains(d, part) {
			t.Errorf("diff lacks %q:\n%s", part, d)
		}
	}
	if d := NamedDiff(t, want, want); d != "" {
		t.Errorf("diff of a document with itself: %q", d)
	}
	if d := NamedDiff(t, want, Named{}); !strings.Contains(d, "- sidecar~10.0.0.1: a group no longer produced (2 resources)") {
		t.Errorf("a group gone is not named:\n%s", d)
	}
}

func TestCheckNamedWritesWithUpdateAndPassesOnTheSameResources(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clusters.golden.json")
	n := clusters(t, cluster("outbound|80||a", clusterv3.Cluster_RANDOM))
	CheckNamed(t, path, n, true)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"outbound|80||a": {`) {
		t.Fatalf("the file does not key resources by name:\n%s", data)
	}
	CheckNamed(t, path, n, false) // fails the test if it differs
}

func TestAddRefusesTwoResourcesWithOneName(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Add(rec, Named{}, "g", []*clusterv3.Cluster{{Name: "x"}, {Name: "x"}}, clusterName)
	}()
	if !strings.Contains(rec.msg, `two resources named "x"`) {
		t.Fatalf("Add with a duplicate name: %q", rec.msg)
	}
}

// fatalRecorder records a Fatalf instead of ending the test (and panics
// to stop the caller, as FailNow would).
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
