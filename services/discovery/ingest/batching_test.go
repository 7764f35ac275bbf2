package ingest

import (
	"testing"
	"time"
)

const (
	testFirst = time.Millisecond
	testQuiet = 100 * time.Millisecond
	testMax   = 10 * time.Second
)

var epoch = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

// simulate runs the policy as Ingest.Run does over changes at the given
// offsets from epoch: a batch goes out when it is due with no change
// before, or max after its first change. It returns when each push went
// out.
func simulate(first, quiet, maxWait time.Duration, changes []time.Duration) []time.Duration {
	b := batching{first: first, quiet: quiet}
	var pushes []time.Duration
	var started time.Time
	for i, at := range changes {
		now := epoch.Add(at)
		if b.pending {
			out := earlier(b.due(), started.Add(maxWait))
			if !out.After(now) { // it went out before this change
				pushes = append(pushes, out.Sub(epoch))
				b.sent()
			}
		}
		if !b.pending {
			started = now
		}
		b.changed(now)
		if i == len(changes)-1 {
			pushes = append(pushes, earlier(b.due(), started.Add(maxWait)).Sub(epoch))
		}
	}
	return pushes
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func TestALoneChangeAfterAQuietPeriodWaitsOnlyFirst(t *testing.T) {
	got := simulate(testFirst, testQuiet, testMax, []time.Duration{0, 5 * time.Second})
	want := []time.Duration{testFirst, 5*time.Second + testFirst}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("pushes at %v, want %v", got, want)
	}
}

func TestEachChangeOfAPendingBatchDoublesItsWaitUpToQuiet(t *testing.T) {
	b := batching{first: testFirst, quiet: testQuiet}
	var waits []time.Duration
	for range 10 { // all at once, faster than any wait
		b.changed(epoch)
		waits = append(waits, b.due().Sub(epoch))
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 100, 100, 100}
	for i := range want {
		if waits[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", waits, want)
		}
	}
}

func TestABatchThatStartsWhileChangesKeepComingWaitsQuiet(t *testing.T) {
	b := batching{first: testFirst, quiet: testQuiet}
	b.changed(epoch)
	b.sent()
	b.changed(epoch.Add(testQuiet - time.Millisecond))
	if got := b.due().Sub(epoch.Add(testQuiet - time.Millisecond)); got != testQuiet {
		t.Fatalf("a change %s after the last one waits %s, want quiet %s", testQuiet-time.Millisecond, got, testQuiet)
	}
	b.sent()
	busy := epoch.Add(testQuiet - time.Millisecond + (idleQuiets-1)*testQuiet)
	b.changed(busy)
	if got := b.due().Sub(busy); got != testQuiet {
		t.Fatalf("a change %d quiet periods after the last one waits %s, want quiet %s", idleQuiets-1, got, testQuiet)
	}
	b.sent()
	idle := busy.Add(idleQuiets * testQuiet)
	b.changed(idle)
	if got := b.due().Sub(idle); got != testFirst {
		t.Fatalf("a change %d quiet periods after the last one waits %s, want first %s", idleQuiets, got, testFirst)
	}
}

// TestUnderChurnThePushesAreThoseOfAFixedWindowPlusOnePerBurst: the
// adaptive window against Istio's fixed one (first = quiet) on bursts of
// changes at several rates, separated by idle gaps: at most one more
// push per burst (its first change, sent at once), and no later push;
// and on bursts separated by gaps longer than quiet but shorter than idle
// (a rollout's), one more push in all.
func TestUnderChurnThePushesAreThoseOfAFixedWindowPlusOnePerBurst(t *testing.T) {
	for _, every := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond, 99 * time.Millisecond} {
		var changes []time.Duration
		at := time.Duration(0)
		const bursts = 5
		for range bursts {
			for range 50 {
				changes = append(changes, at)
				at += every
			}
			at += (idleQuiets + 1) * testQuiet
		}
		fixed := simulate(testQuiet, testQuiet, testMax, changes)
		adaptive := simulate(testFirst, testQuiet, testMax, changes)
		if len(adaptive) > len(fixed)+bursts {
			t.Errorf("changes every %s: %d pushes, a fixed window %d: more than one more per burst", every, len(adaptive), len(fixed))
		}
		if last, fixedLast := adaptive[len(adaptive)-1], fixed[len(fixed)-1]; last > fixedLast {
			t.Errorf("changes every %s: the last push at %s, a fixed window's at %s", every, last, fixedLast)
		}
	}
	var rollout []time.Duration
	at := time.Duration(0)
	for range 40 { // 40 bursts of 5 changes 10 ms apart, 150–600 ms between bursts
		for range 5 {
			rollout = append(rollout, at)
			at += 10 * time.Millisecond
		}
		at += 150*time.Millisecond + time.Duration(len(rollout)%4)*150*time.Millisecond
	}
	fixed, adaptive := simulate(testQuiet, testQuiet, testMax, rollout), simulate(testFirst, testQuiet, testMax, rollout)
	if len(adaptive) > len(fixed)+1 {
		t.Errorf("a rollout's bursts: %d pushes, a fixed window %d: more than one more", len(adaptive), len(fixed))
	}
}

func TestNoBatchWaitsLongerThanMaxAfterItsFirstChange(t *testing.T) {
	var changes []time.Duration
	for at := time.Duration(0); at < 3*time.Second; at += 10 * time.Millisecond {
		changes = append(changes, at)
	}
	pushes := simulate(testFirst, testQuiet, time.Second, changes)
	// The first change alone (first), then the rest: changes every 10 ms
	// never leave 100 ms quiet, so max sends them, once a second.
	if len(pushes) < 3 {
		t.Fatalf("pushes at %v: want the first change's and at least one a second after", pushes)
	}
	for i := 1; i < len(pushes)-1; i++ {
		if gap := pushes[i] - pushes[i-1]; gap > time.Second+10*time.Millisecond {
			t.Fatalf("pushes at %v: %s between two", pushes, gap)
		}
	}
}
