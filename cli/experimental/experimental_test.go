package experimental

import (
	"strings"
	"testing"
)

func TestEnvoyStatsAskEnvoyWhatIstioctlAsks(t *testing.T) {
	for _, tc := range []struct{ kind, output, want string }{
		{"server", "short", "/debug/envoy/stats"},
		{"", "json", "/debug/envoy/stats?format=json"},
		{"server", "yaml", "/debug/envoy/stats?format=json"},
		{"server", "prom", "/debug/envoy/stats/prometheus"},
		{"server", "prom-merged", "/stats/prometheus"},
		{"clusters", "short", "/debug/envoy/clusters"},
		{"cluster", "json", "/debug/envoy/clusters?format=json"},
	} {
		if got, err := StatsPath(tc.kind, tc.output); err != nil || got != tc.want {
			t.Errorf("%s -o %s: %q %v, want %q", tc.kind, tc.output, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ kind, output, err string }{
		{"clusters", "prom", "want short, json or yaml for clusters"},
		{"server", "table", `--output "table"`},
		{"listeners", "short", `--type "listeners"`},
	} {
		if _, err := StatsPath(tc.kind, tc.output); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s -o %s: %v, want an error with %q", tc.kind, tc.output, err, tc.err)
		}
	}
}
