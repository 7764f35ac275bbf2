package proc

import (
	"fmt"
	"strings"
)

// DemoSplits returns the demo client's split lines (as its Split prints
// them after "split: ", e.g. "v1 80% (40) · v2 20% (10)") from a log,
// whether the demo's own output or docker compose's "client | …" lines.
func DemoSplits(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if _, rest, ok := strings.Cut(l, "| split: "); ok {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out
}

// DemoCounts reads the number of answers per version from a split line
// (failed calls count as "error").
func DemoCounts(line string) map[string]int {
	counts := map[string]int{}
	for _, part := range strings.Split(line, " · ") {
		var name string
		var pct, n int
		if _, err := fmt.Sscanf(part, "%s %d%% (%d)", &name, &pct, &n); err == nil {
			counts[name] = n
		}
	}
	return counts
}

// DemoRun finds the first n consecutive split lines that ok accepts and
// sums their v1 and v2 answers; found is false when there is no such run
// yet.
func DemoRun(lines []string, n int, ok func(line string) bool) (v1, v2 int, found bool) {
	run := 0
	for _, l := range lines {
		if !ok(l) {
			v1, v2, run = 0, 0, 0
			continue
		}
		c := DemoCounts(l)
		v1, v2, run = v1+c["v1"], v2+c["v2"], run+1
		if run == n {
			return v1, v2, true
		}
	}
	return 0, 0, false
}
