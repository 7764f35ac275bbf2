package client

import "testing"

func TestSplit(t *testing.T) {
	for want, counts := range map[string]map[string]int{
		"split: no answers":                                  {},
		"split: v1 80% (40) · v2 20% (10)":                   {"v2": 10, "v1": 40},
		"split: v2 100% (50)":                                {"v2": 50},
		"split: v1 33% (1) · v2 33% (1) · error 33% (1)":     {"error": 1, "v1": 1, "v2": 1},
		"split: v1 25% (1) · denied 50% (2) · error 25% (1)": {"error": 1, "denied": 2, "v1": 1},
	} {
		if got := Split(counts); got != want {
			t.Errorf("Split(%v) = %q, want %q", counts, got, want)
		}
	}
}

func TestRunNeedsABootstrap(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	if err := Run(t.Context(), Options{Target: "xds:///x", Rate: 1, Interval: 1, Timeout: 1}); err == nil {
		t.Fatal("ran without a bootstrap")
	}
}
