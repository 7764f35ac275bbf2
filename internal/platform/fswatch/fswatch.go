// Package fswatch watches directories and reacts to bursts of changes:
// editors, Secret volume swaps and atomic renames produce several events
// per logical change, so events are coalesced over a debounce interval.
package fswatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Options configures Run.
type Options struct {
	Dirs     []string
	Debounce time.Duration
	// Relevant filters events by path; nil accepts all.
	Relevant func(path string) bool
	// OnStart runs once the watches are in place, so that nothing changed
	// between a first read and the watch goes unnoticed.
	OnStart func() error
	// OnChange runs after each burst of relevant events, and after watcher
	// errors (events may have been lost). Its error ends Run.
	OnChange func() error
	Log      *slog.Logger
}

// Run watches until ctx ends (returning nil) or a callback fails.
func Run(ctx context.Context, o Options) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.Close()
	for _, d := range o.Dirs {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	if o.OnStart != nil {
		if err := o.OnStart(); err != nil {
			return err
		}
	}
	timer := time.NewTimer(o.Debounce)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("file watcher closed")
			}
			if o.Relevant == nil || o.Relevant(ev.Name) {
				o.Log.Debug("file event", "path", ev.Name, "op", ev.Op.String())
				timer.Reset(o.Debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("file watcher closed")
			}
			o.Log.Warn("file watcher error; rescanning", "error", err)
			timer.Reset(o.Debounce)
		case <-timer.C:
			if err := o.OnChange(); err != nil {
				return err
			}
		}
	}
}
