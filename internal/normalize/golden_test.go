package normalize

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares what normalisation made of testdata/<case>/input.yaml with
// testdata/<case>/want.golden.json.
func golden(t *testing.T, dir string, got []proto.Message) {
	t.Helper()
	var parts []json.RawMessage
	for _, m := range got {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, b)
	}
	raw, err := json.Marshal(parts)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	out.WriteByte('\n')
	path := filepath.Join(dir, "want.golden.json")
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("%s differs; rerun with -update if intended. got:\n%s", path, out.String())
	}
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
			golden(t, dir, got)
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
