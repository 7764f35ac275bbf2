// Package lifecycle runs the long-lived parts of a service together and stops
// them together: the first signal (SIGINT/SIGTERM) or the first part to end
// cancels the rest, which then get a bounded time to drain.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
)

// ErrShutdownTimeout is returned when actors are still running after the
// shutdown timeout.
var ErrShutdownTimeout = errors.New("shutdown timed out")

// Actor is one long-lived part of a service: a server, a watcher, a
// controller. Run must block until ctx is cancelled or the actor fails, and
// must return soon after ctx is cancelled (draining within the group's
// shutdown timeout). Returning nil before ctx is cancelled also stops the
// group: a service whose server has stopped should not keep running.
type Actor struct {
	Name string
	Run  func(ctx context.Context) error
}

// Run starts every actor and blocks until all have returned or, once
// shutdown has begun, until timeout has passed. Shutdown begins when ctx is
// cancelled or when any actor returns. The result is the first actor error
// other than context.Canceled, joined with ErrShutdownTimeout if some actors
// did not return in time.
func Run(ctx context.Context, log *slog.Logger, timeout time.Duration, actors ...Actor) error {
	if len(actors) == 0 {
		return errors.New("lifecycle: no actors to run")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(actors))
	var mu sync.Mutex
	running := map[string]bool{}
	for _, a := range actors {
		mu.Lock()
		running[a.Name] = true
		mu.Unlock()
		go func() {
			err := a.Run(runCtx)
			mu.Lock()
			delete(running, a.Name)
			mu.Unlock()
			results <- result{a.Name, err}
		}()
	}

	var first error
	record := func(r result) {
		switch {
		case r.err == nil || errors.Is(r.err, context.Canceled):
			log.Info("stopped", "actor", r.name)
		default:
			log.Error("failed", "actor", r.name, "error", r.err)
			if first == nil {
				first = fmt.Errorf("%s: %w", r.name, r.err)
			}
		}
	}

	remaining := len(actors)
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx), "timeout", timeout)
	case r := <-results:
		remaining--
		record(r)
		log.Info("shutting down", "reason", "actor "+r.name+" ended", "timeout", timeout)
	}
	cancel()

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for remaining > 0 {
		select {
		case r := <-results:
			remaining--
			record(r)
		case <-deadline.C:
			mu.Lock()
			names := make([]string, 0, len(running))
			for n := range running {
				names = append(names, n)
			}
			mu.Unlock()
			slices.Sort(names)
			err := fmt.Errorf("%w after %s: still running: %v", ErrShutdownTimeout, timeout, names)
			log.Error("shutdown timed out", "still_running", names)
			return errors.Join(first, err)
		}
	}
	return first
}

// SignalContext returns a context cancelled by the first SIGINT or SIGTERM.
// After that first signal the default handling is restored, so a second
// Ctrl-C ends the process at once if draining hangs.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sig:
			signal.Stop(sig)
			cancel(fmt.Errorf("received %s", s))
		case <-ctx.Done():
			signal.Stop(sig)
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}
