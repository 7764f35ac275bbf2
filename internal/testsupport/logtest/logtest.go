// Package logtest keeps what a component logs, for a test to wait on it:
// a positive event (the component read a file, found a resource already
// right) that shows a window of "nothing happened" was really observed.
package logtest

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer holds the lines a logger wrote. Safe for concurrent use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Logger writes text lines into b, debug included.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Count is the number of lines holding every one of parts.
func (b *Buffer) Count(parts ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(b.buf.String(), "\n") {
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
