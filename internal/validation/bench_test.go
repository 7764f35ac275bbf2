package validation

import (
	"os"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// BenchmarkValidateRealisticMix validates the documentation-shaped objects of
// testdata/valid.yaml (every kind, simple and involved) round-robin, with a
// subset context, and reports objects per second.
func BenchmarkValidateRealisticMix(b *testing.B) {
	data, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		b.Fatal(err)
	}
	var objs []*istio.Object
	for _, d := range istio.Decode("valid.yaml", data, "default") {
		if d.Err != nil {
			b.Fatal(d.Err)
		}
		objs = append(objs, d.Object)
	}
	ctx := subsets{"reviews.prod.svc.cluster.local": {"v1", "v2", "v3"}, "ratings": {"v1"}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		res := Validate(objs[i%len(objs)], ctx)
		if !res.OK() {
			b.Fatal(res.Err())
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "objects/s")
}
