package ingest

import "time"

// batching is discovery's debounce policy, apart from clocks and timers.
// A change that comes after the mesh was idle (no change for idleQuiets
// quiet periods) waits only first for others: a lone change goes out at
// once. Each further change of the same batch doubles the wait, up to
// quiet, so a burst is still merged into one push. A batch that starts
// while the mesh is busy (less than that after the last change) waits
// quiet, as every batch did before: a rollout, whose changes come in
// bursts a fraction of a second apart, is pushed as often as with a fixed
// window, plus once for its first change. The wait counts from the
// batch's last change; Ingest.Run also sends every batch at the latest max
// after its first change, as Istio's debounce (PILOT_DEBOUNCE_AFTER,
// PILOT_DEBOUNCE_MAX in pilot/pkg/xds/discovery.go's debounce) does.
type batching struct {
	first, quiet time.Duration
	// last is when the last change came; wait is how long the pending
	// batch waits after it (pending: whether there is one).
	last    time.Time
	wait    time.Duration
	pending bool
}

// idleQuiets is how many quiet periods without a change make the mesh
// idle (3 s by default). A rollout's bursts are a fraction of a second to
// a few seconds apart (test/cluster's rollout of 200 pods: 33–53 pushes
// over 23 s with a fixed window); idle after one quiet period, each gap
// between them added a push at its start (76 pushes), after thirty the
// pushes were within the fixed window's spread (BENCHMARKS.md, issue 48).
const idleQuiets = 30

// changed records a change at now.
func (b *batching) changed(now time.Time) {
	switch {
	case b.pending:
		b.wait = min(2*b.wait, b.quiet)
	case b.last.IsZero() || now.Sub(b.last) >= idleQuiets*b.quiet:
		b.wait = b.first
	default:
		b.wait = b.quiet
	}
	b.pending, b.last = true, now
}

// due is when the pending batch goes out if no other change comes.
func (b *batching) due() time.Time { return b.last.Add(b.wait) }

// sent records that the pending batch went out.
func (b *batching) sent() { b.pending = false }
