package normalize

import (
	"fmt"
	"testing"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

func TestEndpointsAreShardedIntoSetsOfAtMostOneHundred(t *testing.T) {
	for _, tc := range []struct{ endpoints, sets, last int }{{0, 1, 0}, {1, 1, 1}, {100, 1, 100}, {101, 2, 1}, {250, 3, 50}} {
		eps := make([]*registryv1.Endpoint, tc.endpoints)
		for i := range eps {
			eps[i] = &registryv1.Endpoint{Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256)}
		}
		sets := shard("ns", "h.example.com", "se-h", eps)
		if len(sets) != tc.sets || len(sets[len(sets)-1].GetEndpoints()) != tc.last {
			t.Errorf("%d endpoints: %d sets, last holds %d; want %d sets, last %d", tc.endpoints, len(sets), len(sets[len(sets)-1].GetEndpoints()), tc.sets, tc.last)
		}
		for i, s := range sets {
			if s.GetShard() != fmt.Sprintf("se-h-%d", i) {
				t.Errorf("shard %d named %q", i, s.GetShard())
			}
		}
	}
}
