// Package proc is what cross-service tests share: the service processes
// they start and watch, what they read of those processes' output (the
// demo client's split lines), and a certificate from a running ca.
package proc

import (
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
)

// Output collects a process's stdout and stderr; safe for concurrent use.
type Output struct {
	testenv.SyncBuffer
}

// Count returns how often sub has been written.
func (o *Output) Count(sub string) int { return strings.Count(o.String(), sub) }

// WaitFor waits up to 30 seconds for want to appear.
func (o *Output) WaitFor(tb testing.TB, want string) {
	tb.Helper()
	o.WaitForCount(tb, want, 1)
}

// WaitForCount waits up to 30 seconds for sub to appear n times.
func (o *Output) WaitForCount(tb testing.TB, sub string, n int) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for o.Count(sub) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("output never held %d of %q:\n%s", n, sub, o.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
