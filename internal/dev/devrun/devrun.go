// Package devrun supervises the local control plane that `make run` starts:
// each service as its own process on loopback, their output interleaved line
// by line with a per-service prefix, a service that exits restarted with
// backoff while the others keep serving (as Kubernetes restarts a
// container), and all of them stopped together on Ctrl-C (SIGTERM, then
// SIGKILL after a timeout).
package devrun

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one program to run.
type Process struct {
	// Name prefixes its output lines.
	Name string
	Path string
	Args []string
	// Env is added to the supervisor's environment.
	Env []string
	// ReadyURL, when set, is polled after the start until it answers 200
	// (at most ReadyTimeout) before the next process starts, so those that
	// depend on it do not start against nothing.
	ReadyURL string
}

// ReadyTimeout bounds the wait for a process's ReadyURL.
const ReadyTimeout = 30 * time.Second

// Result says how each process ended.
type Result struct {
	// NotBuilt lists processes that exited with the not-built code.
	NotBuilt []string
	// Stopped lists processes that ran until they were told to stop.
	Stopped []string
}

// Supervisor runs processes together.
type Supervisor struct {
	// Out receives every process's output, each line prefixed "name | ".
	Out io.Writer
	Log *slog.Logger
	// StopTimeout is how long processes get to exit after SIGTERM.
	StopTimeout time.Duration
	// NotBuiltCode is the exit code meaning "this service is not built
	// yet": such an exit is reported, not treated as a failure.
	NotBuiltCode int
	// Restart restarts a process that exits while it should be running,
	// after RestartBackoff, doubled at each exit up to MaxRestartBackoff
	// (and back to RestartBackoff once it ran for a minute); the others
	// keep running. Without it such an exit stops them all.
	Restart                           bool
	RestartBackoff, MaxRestartBackoff time.Duration
	// LogDir, when set, also keeps each process's output (unprefixed) in
	// LogDir/<name>.log, at most MaxLogBytes, the older half moved to
	// <name>.log.1 (flotilla bug-report reads them).
	LogDir string

	mu   sync.Mutex // serialises writes to Out and to the logs
	logs map[string]*logFile
}

// MaxLogBytes bounds one process's log file; with its one rotated file a
// process keeps at most twice this.
const MaxLogBytes = 16 << 20

// logFile is one process's log, rotated at MaxLogBytes.
type logFile struct {
	path string
	f    *os.File
	size int64
}

func (l *logFile) write(line []byte) {
	if l.f == nil {
		// A run's log starts empty; a restarted process appends to it.
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return // the terminal still has it
		}
		_ = os.Remove(l.path + ".1")
		l.f, l.size = f, 0
	}
	if l.size+int64(len(line)) > MaxLogBytes {
		_ = l.f.Close()
		_ = os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			l.f = nil
			return
		}
		l.f, l.size = f, 0
	}
	n, _ := l.f.Write(line)
	l.size += int64(n)
}

type child struct {
	name    string
	index   int // in the processes Run was given
	started time.Time
	cmd     *exec.Cmd
	output  sync.WaitGroup
	done    chan struct{}
	err     error
}

// Run starts every process and blocks until ctx ends (then stops them all)
// or until every process has ended on its own. A process that exits while it
// should be running, other than with NotBuiltCode, is restarted (Restart),
// or stops the others and is returned as an error.
func (s *Supervisor) Run(ctx context.Context, procs []Process) (Result, error) {
	var res Result
	if s.LogDir != "" {
		if err := os.MkdirAll(s.LogDir, 0o700); err != nil {
			return res, fmt.Errorf("log dir: %w", err)
		}
		defer s.closeLogs()
	}
	width := 0
	for _, p := range procs {
		width = max(width, len(p.Name))
	}
	children := make([]*child, 0, len(procs))
	// At most one child per process is running, and each reports its
	// exit once: len(procs) never fills.
	exits := make(chan *child, len(procs))
	watch := func(c *child) {
		go func() {
			<-c.done
			exits <- c
		}()
	}
	for i, p := range procs {
		c, err := s.start(p, width)
		if err != nil {
			return res, errors.Join(err, s.stopAll(children))
		}
		c.index = i
		children = append(children, c)
		watch(c)
		if p.ReadyURL != "" {
			s.waitReady(ctx, c, p.ReadyURL)
		}
	}

	restarts := make(chan int, len(procs))
	backoff := make([]time.Duration, len(procs))
	running := len(children)
	var failure error
	for running > 0 && failure == nil {
		select {
		case i := <-restarts:
			c, err := s.start(procs[i], width)
			if err != nil {
				s.Log.Error("restarting", "process", procs[i].Name, "error", err)
				s.restartLater(ctx, restarts, i, s.nextBackoff(backoff, i, 0))
				continue
			}
			c.index = i
			children[i] = c
			watch(c)
			s.Log.Info("restarted", "process", c.name)
		case <-ctx.Done():
			s.Log.Info("stopping", "processes", running, "timeout", s.StopTimeout)
			err := s.stopAll(children)
			res = Result{}
			for _, c := range children {
				if isNotBuilt(c.err, s.NotBuiltCode) {
					res.NotBuilt = append(res.NotBuilt, c.name)
				} else {
					res.Stopped = append(res.Stopped, c.name)
				}
			}
			return res, err
		case c := <-exits:
			switch {
			case isNotBuilt(c.err, s.NotBuiltCode):
				running--
				res.NotBuilt = append(res.NotBuilt, c.name)
				s.Log.Info("not built yet", "process", c.name)
				continue
			case ctx.Err() != nil:
				// Stopping already (Ctrl-C came with this exit): the
				// stop below ends the others and reports, not a failure.
				continue
			case s.Restart:
				delay := s.nextBackoff(backoff, c.index, time.Since(c.started))
				s.Log.Warn("exited; restarting it, the others keep running", "process", c.name, "error", c.err, "in", delay)
				s.restartLater(ctx, restarts, c.index, delay)
				continue
			}
			running--
			failure = fmt.Errorf("%s exited while the others run", c.name)
			if c.err != nil {
				failure = fmt.Errorf("%s failed: %w", c.name, c.err)
			}
		}
	}
	if failure != nil {
		s.Log.Error("stopping everything", "reason", failure)
		return res, errors.Join(failure, s.stopAll(children))
	}
	return res, nil
}

// nextBackoff is how long process i waits before its restart: the
// backoff doubled since its last exit, or the first after a run of a
// minute.
func (s *Supervisor) nextBackoff(backoff []time.Duration, i int, ran time.Duration) time.Duration {
	first, most := cmp.Or(s.RestartBackoff, time.Second), cmp.Or(s.MaxRestartBackoff, 30*time.Second)
	switch {
	case backoff[i] == 0 || ran >= time.Minute:
		backoff[i] = first
	default:
		backoff[i] = min(2*backoff[i], most)
	}
	return backoff[i]
}

// restartLater asks for process i's restart after delay, unless ctx
// ends first.
func (s *Supervisor) restartLater(ctx context.Context, restarts chan<- int, i int, delay time.Duration) {
	go func() {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			restarts <- i // one pending restart per process at most: never blocks
		}
	}()
}

// waitReady polls url until it answers 200, the process ends, ctx ends or
// ReadyTimeout passes (then it goes on: the others retry on their own).
func (s *Supervisor) waitReady(ctx context.Context, c *child, url string) {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(ReadyTimeout)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return
		}
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.Log.Warn("not ready in time; starting the rest anyway", "process", c.name, "url", url)
}

func isNotBuilt(err error, code int) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == code
}

func (s *Supervisor) start(p Process, width int) (*child, error) {
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.SysProcAttr = sysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.Name, err)
	}
	c := &child{name: p.Name, started: time.Now(), cmd: cmd, done: make(chan struct{})}
	prefix := p.Name + strings.Repeat(" ", width-len(p.Name)) + " | "
	c.output.Add(2)
	go s.copyLines(p.Name, prefix, stdout, &c.output)
	go s.copyLines(p.Name, prefix, stderr, &c.output)
	go func() {
		c.output.Wait() // all output is written before the exit is reported
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (s *Supervisor) copyLines(name, prefix string, r io.Reader, wg *sync.WaitGroup) {
	defer wg.Done()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		s.mu.Lock()
		_, _ = fmt.Fprintf(s.Out, "%s%s\n", prefix, sc.Bytes())
		if s.LogDir != "" {
			if s.logs == nil {
				s.logs = map[string]*logFile{}
			}
			l := s.logs[name]
			if l == nil {
				l = &logFile{path: filepath.Join(s.LogDir, name+".log")}
				s.logs[name] = l
			}
			l.write(append(slices.Clone(sc.Bytes()), '\n'))
		}
		s.mu.Unlock()
	}
	// A line over 1 MiB ends the copy; drain so the child never blocks.
	_, _ = io.Copy(io.Discard, r)
}

func (s *Supervisor) closeLogs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.logs {
		if l.f != nil {
			_ = l.f.Close()
			l.f = nil
		}
	}
}

// stopAll sends SIGTERM to every running child, waits up to StopTimeout,
// then kills what is left. It reports the children that had to be killed.
func (s *Supervisor) stopAll(children []*child) error {
	for _, c := range children {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	timer := time.NewTimer(s.StopTimeout)
	defer timer.Stop()
	expired := false
	var killed []string
	for _, c := range children {
		if !expired {
			select {
			case <-c.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
			killed = append(killed, c.name)
		}
	}
	if len(killed) > 0 {
		slices.Sort(killed)
		return fmt.Errorf("killed after %s without exiting: %s", s.StopTimeout, strings.Join(killed, ", "))
	}
	return nil
}
