// Package logtest keeps what a component logs, for a test to wait on it:
// a positive event (the component read a file, found a resource already
// right) that shows a window of "nothing happened" was really observed.
package logtest

import (
	"log/slog"
	"strings"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
)

// Buffer holds the lines a logger wrote. Safe for concurrent use.
type Buffer struct {
	testenv.SyncBuffer
}

// Logger writes text lines into b, debug included.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Count is the number of lines holding every one of parts.
func (b *Buffer) Count(parts ...string) int {
	n := 0
	for _, line := range strings.Split(b.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// Has reports whether a line holds every one of parts.
func (b *Buffer) Has(parts ...string) bool { return b.Count(parts...) > 0 }
