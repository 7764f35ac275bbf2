package discovery_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/test/load"
)

// TestTheLoadToolMeasures runs the load tool small: its numbers are for
// BENCHMARKS.md (make bench-load); here it must work end to end.
func TestTheLoadToolMeasures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := load.Run(ctx, load.Options{
		BinDir: binDir, Self: filepath.Join(binDir, "xdsload"),
		Clients: 20, Services: 50, Changes: 2, Log: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", r)
	if len(r.Changes) != 2 || r.P50 <= 0 || r.Max < r.P99 || r.P99 < r.P50 || r.DiscoveryRSSMiB <= 0 || r.Connected <= 0 {
		t.Fatalf("implausible report: %+v", r)
	}
	for _, c := range r.Changes {
		if c.SentP50 <= 0 || c.SentP50 > c.P50 {
			t.Fatalf("a change was acknowledged before it was sent: %+v", c)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
