// Package textdiff is a line diff (longest common subsequence) for people
// to read: golden files' mismatches, and what a proxy holds against what it
// would be sent (flotilla proxy-status PROXY).
package textdiff

import (
	"fmt"
	"strings"
)

// context is how many unchanged lines are shown around a change.
const context = 3

// maxCells bounds the diff's table (lines of want × lines of got); larger
// inputs are compared over the span between their common head and tail.
const maxCells = 16 << 20

// Diff returns a line diff of want and got: changed lines prefixed "-"
// (want) and "+" (got), with a few unchanged lines around each change and
// "@@ line N" before each hunk.
func Diff(want, got string) string { return WithContext(want, got, context) }

// WithContext is Diff with ctx unchanged lines around each change.
func WithContext(want, got string, ctx int) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Common head and tail need no table.
	head := 0
	for head < len(w) && head < len(g) && w[head] == g[head] {
		head++
	}
	tail := 0
	for tail < len(w)-head && tail < len(g)-head && w[len(w)-1-tail] == g[len(g)-1-tail] {
		tail++
	}
	mw, mg := w[head:len(w)-tail], g[head:len(g)-tail]
	var ops []op
	for i := range head {
		ops = append(ops, op{' ', w[i], i})
	}
	if len(mw)*len(mg) <= maxCells {
		ops = append(ops, lcs(mw, mg, head)...)
	} else {
		for i, l := range mw {
			ops = append(ops, op{'-', l, head + i})
		}
		for _, l := range mg {
			ops = append(ops, op{'+', l, -1})
		}
	}
	for i := len(w) - tail; i < len(w); i++ {
		ops = append(ops, op{' ', w[i], i})
	}
	return render(ops, ctx)
}

type op struct {
	kind byte // ' ', '-', '+'
	line string
	at   int // line index in want, -1 for added lines
}

// lcs diffs a and b through their longest common subsequence; offset is
// a's first line number in the whole input.
func lcs(a, b []string, offset int) []op {
	n, m := len(a), len(b)
	// t[i][j]: length of the LCS of a[i:] and b[j:].
	t := make([][]int32, n+1)
	for i := range t {
		t[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				t[i][j] = t[i+1][j+1] + 1
			} else {
				t[i][j] = max(t[i+1][j], t[i][j+1])
			}
		}
	}
	var out []op
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			out = append(out, op{' ', a[i], offset + i})
			i++
			j++
		case i < n && (j == m || t[i+1][j] >= t[i][j+1]):
			out = append(out, op{'-', a[i], offset + i})
			i++
		default:
			out = append(out, op{'+', b[j], -1})
			j++
		}
	}
	return out
}

func render(ops []op, ctx int) string {
	show := make([]bool, len(ops))
	for i, o := range ops {
		if o.kind == ' ' {
			continue
		}
		for k := max(0, i-ctx); k <= min(len(ops)-1, i+ctx); k++ {
			show[k] = true
		}
	}
	var b strings.Builder
	for i, o := range ops {
		if !show[i] {
			continue
		}
		if i == 0 || !show[i-1] {
			fmt.Fprintf(&b, "@@ line %d\n", lineOf(ops, i))
		}
		fmt.Fprintf(&b, "%c %s\n", o.kind, o.line)
	}
	return b.String()
}

// lineOf is the 1-based line in want where ops[i] stands.
func lineOf(ops []op, i int) int {
	for k := i; k < len(ops); k++ {
		if ops[k].at >= 0 {
			return ops[k].at + 1
		}
	}
	return len(ops)
}
