package normalize

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

var update = flag.Bool("update", false, "rewrite golden files")

// check compares what normalisation made of testdata/<case>/input.yaml with
// testdata/<case>/want.golden.json.
func check(t *testing.T, dir string, got []proto.Message) {
	t.Helper()
	golden.Check(t, filepath.Join(dir, "want.golden.json"), golden.JSON(t, got), *update)
}

func loadObjects(t *testing.T, path string) []*istio.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*istio.Object
	for _, d := range istio.Decode(path, data, "default") {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		out = append(out, d.Object)
	}
	return out
}

func TestServiceEntryGoldens(t *testing.T) {
	cases, err := filepath.Glob("testdata/serviceentry-*/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range cases {
		dir := filepath.Dir(in)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs := loadObjects(t, in)
			var workloads []*istio.Object
			for _, o := range objs {
				if o.Kind.Kind == "WorkloadEntry" {
					workloads = append(workloads, o)
				}
			}
			var got []proto.Message
			for _, o := range objs {
				if o.Kind.Kind != "ServiceEntry" {
					continue
				}
				svcs, sets := ServiceEntry(o, workloads)
				for _, s := range svcs {
					got = append(got, s)
				}
				for _, s := range sets {
					got = append(got, s)
				}
			}
			check(t, dir, got)
			// Normalisation is deterministic.
			again, _ := ServiceEntry(objs[0], workloads)
			first, _ := ServiceEntry(objs[0], workloads)
			for i := range again {
				if !proto.Equal(again[i], first[i]) {
					t.Fatal("two runs differ")
				}
			}
		})
	}
}
