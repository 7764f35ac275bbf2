// Package envoy runs the pod's Envoy for the agent, as Istio's agent does:
// it starts the binary with the bootstrap, passes SIGHUP and SIGUSR1 on
// (Envoy reopens its logs on SIGUSR1), and when the agent is told to stop
// it drains first: POST /drain_listeners?graceful&inboundonly on Envoy's
// admin, waits the termination drain duration so in-flight requests
// finish and callers move away, then sends SIGTERM and waits for Envoy to
// exit (SIGKILL after a grace period). If Envoy exits by itself, Run
// returns its exit code, and the agent exits with it.
package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// Options configure Run.
type Options struct {
	// Binary is Envoy's path; Args its command line (bootstrap.EnvoyArgs).
	Binary string
	Args   []string
	// Admin is Envoy's admin address, host:port.
	Admin string
	// TerminationDrain is how long to let connections drain before
	// stopping Envoy (Istio's terminationDrainDuration, default 5 s).
	TerminationDrain time.Duration
	// KillAfter is how long Envoy may take to exit after SIGTERM before
	// SIGKILL (default 10 s).
	KillAfter time.Duration
	// Stdout and Stderr receive Envoy's output (default the agent's).
	Stdout, Stderr io.Writer
	Log            *slog.Logger
}

// ExitError is Envoy exiting on its own.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("envoy exited with code %d", e.Code) }

// Run runs Envoy until it exits or ctx ends (then drains and stops it).
func Run(ctx context.Context, o Options) error {
	if o.TerminationDrain == 0 {
		o.TerminationDrain = 5 * time.Second
	}
	if o.KillAfter == 0 {
		o.KillAfter = 10 * time.Second
	}
	cmd := exec.Command(o.Binary, o.Args...)
	// Envoy does not outlive the agent: if the agent dies, so does Envoy,
	// and the container restarts both.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = orStd(o.Stdout, os.Stdout), orStd(o.Stderr, os.Stderr)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start envoy %s: %w", o.Binary, err)
	}
	o.Log.Info("envoy started", "pid", cmd.Process.Pid, "binary", o.Binary)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(signals)
	for {
		select {
		case sig := <-signals:
			_ = cmd.Process.Signal(sig)
		case err := <-exited:
			return exitError(err)
		case <-ctx.Done():
			return stop(cmd, exited, o)
		}
	}
}

// stop drains Envoy's listeners, waits the drain duration and stops it.
func stop(cmd *exec.Cmd, exited <-chan error, o Options) error {
	o.Log.Info("draining envoy", "for", o.TerminationDrain)
	if err := Drain(context.Background(), o.Admin); err != nil {
		o.Log.Warn("draining envoy's listeners failed; stopping it after the drain duration anyway", "error", err)
	}
	select {
	case err := <-exited:
		return exitError(err)
	case <-time.After(o.TerminationDrain):
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err := exitError(err); err != nil {
			var ee *ExitError
			if errors.As(err, &ee) && ee.Code == -1 { // ended by our SIGTERM
				return nil
			}
			return err
		}
		return nil
	case <-time.After(o.KillAfter):
		o.Log.Warn("envoy did not exit after SIGTERM; killing it", "after", o.KillAfter)
		_ = cmd.Process.Kill()
		if err := <-exited; err != nil {
			o.Log.Info("envoy killed", "status", err)
		}
		return nil
	}
}

func exitError(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &ExitError{Code: ee.ExitCode()}
	}
	return fmt.Errorf("envoy: %w", err)
}

func orStd(w, d io.Writer) io.Writer {
	if w == nil {
		return d
	}
	return w
}

// adminTimeout bounds each call to Envoy's admin endpoint.
const adminTimeout = 2 * time.Second

// admin calls Envoy's admin endpoint and returns the response status,
// the body read (bounded) and discarded.
func admin(ctx context.Context, method, addr, path string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, nil
}

// Drain asks Envoy to drain its inbound listeners gracefully.
func Drain(ctx context.Context, addr string) error {
	code, err := admin(ctx, http.MethodPost, addr, "/drain_listeners?graceful&inboundonly")
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("drain: envoy answered %d %s", code, http.StatusText(code))
	}
	return nil
}

// Ready reports whether Envoy's admin says it is ready (GET /ready: 200,
// "LIVE").
func Ready(ctx context.Context, addr string) bool {
	code, err := admin(ctx, http.MethodGet, addr, "/ready")
	return err == nil && code == http.StatusOK
}
