package proc

import (
	"fmt"
	"strings"
)

// DemoSplits returns the demo client's split lines (as its Split prints
// them after "split: ", e.g. "v1 80% (40) · v2 20% (10)") from a log,
// whether the demo's own output or docker compose's "client | …" lines;
// the intruder's are left out (IntruderSplits).
func DemoSplits(log string) []string { return splits(log, false) }

// IntruderSplits returns the split lines of the demo's intruder (a client
// the greeter's AuthorizationPolicy refuses): "intruder | split: …" lines
// of make run, "intruder-1 | …" of docker compose.
func IntruderSplits(log string) []string { return splits(log, true) }

func splits(log string, intruder bool) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		prefix, rest, ok := strings.Cut(l, "| split: ")
		if ok && strings.HasPrefix(strings.TrimSpace(prefix), "intruder") == intruder {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out
}

// DemoCounts reads the number of answers per version from a split line
// (failed calls count as "error"); a version answered over mTLS is
// followed by the server's SPIFFE ID, which DemoIdentities reads.
func DemoCounts(line string) map[string]int {
	counts := map[string]int{}
	for _, p := range demoParts(line) {
		counts[p.version] += p.n
	}
	return counts
}

// DemoIdentities reads the server identity each version answered with
// ("" over plaintext) from a split line.
func DemoIdentities(line string) map[string]string {
	ids := map[string]string{}
	for _, p := range demoParts(line) {
		ids[p.version] = p.identity
	}
	return ids
}

type demoPart struct {
	version, identity string
	n                 int
}

// demoParts splits "v1 spiffe://… 80% (40) · v2 20% (10)".
func demoParts(line string) []demoPart {
	var out []demoPart
	for _, part := range strings.Split(line, " · ") {
		f := strings.Fields(part)
		if len(f) < 3 || len(f) > 4 {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(f[len(f)-1], "(%d)", &n); err != nil {
			continue
		}
		p := demoPart{version: f[0], n: n}
		if len(f) == 4 {
			p.identity = f[1]
		}
		out = append(out, p)
	}
	return out
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
