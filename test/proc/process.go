package proc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
)

// Process is a service binary the test started.
type Process struct {
	Name string
	Out  *Output
	cmd  *exec.Cmd
	done chan error
	exit error
	over bool
}

// Start runs path with args (plus text logs), stops it when the test ends
// and shows its output if the test failed.
func Start(tb testing.TB, name, path string, args ...string) *Process {
	tb.Helper()
	return StartCommand(tb, name, path, append(args, "--log-format", "text")...)
}

// StartCommand is Start for programs without Flotilla's --log-format (the
// demo).
func StartCommand(tb testing.TB, name, path string, args ...string) *Process {
	tb.Helper()
	cmd := exec.Command(path, args...)
	// Under -race a child lingers a second at exit by default.
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	return start(tb, name, cmd)
}

// StartIn runs path with args in dir with env as its whole environment
// (nothing of the test's own), as a container's process sees only what
// its pod spec gives it: for programs that are not Flotilla's (Istio's
// pilot-agent), whose paths are relative to their working directory.
func StartIn(tb testing.TB, name, dir string, env []string, path string, args ...string) *Process {
	tb.Helper()
	cmd := exec.Command(path, args...)
	cmd.Dir, cmd.Env = dir, append([]string{}, env...) // never nil: nil is the test's own
	return start(tb, name, cmd)
}

func start(tb testing.TB, name string, cmd *exec.Cmd) *Process {
	tb.Helper()
	p := &Process{Name: name, Out: &Output{}, cmd: cmd, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	// A child of the process that outlives it (holding the output pipe)
	// must not hold up the test.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		p.Kill(tb)
		if tb.Failed() {
			tb.Logf("%s (%v) output:\n%s", name, p.exit, p.Out.String())
		}
	})
	return p
}

// Kill stops the process at once (SIGKILL), as a crash would.
func (p *Process) Kill(tb testing.TB) {
	tb.Helper()
	if p.over {
		return
	}
	_ = p.cmd.Process.Kill()
	p.exit = <-p.done
	p.over = true
}

// Stop sends SIGTERM and waits up to grace for the process to exit; it
// returns the exit error (nil for status 0).
func (p *Process) Stop(tb testing.TB, grace time.Duration) error {
	tb.Helper()
	if p.over {
		return p.exit
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	select {
	case p.exit = <-p.done:
		p.over = true
		return p.exit
	case <-time.After(grace):
		tb.Fatalf("%s did not exit within %s of SIGTERM", p.Name, grace)
	}
	return nil
}

// WaitReady polls url (an admin /readyz) until it answers 200, for up to
// 30 seconds.
func WaitReady(tb testing.TB, url string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url) //nolint:noctx,gosec // a test-local URL, bounded by the deadline
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s never became ready (last error %v)", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreeAddr returns a free 127.0.0.1 port for a process to listen on,
// reserved for the test's lifetime (testenv.FreeAddr).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return testenv.FreeAddr(tb)
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// RSSMiB reads a process's resident set size from /proc (Linux).
func RSSMiB(pid int) (float64, error) { return statusMiB(pid, "VmRSS") }

// AnonMiB reads the anonymous part of a process's resident set (its heap
// and stacks; the rest is its binary's pages, which the page cache shares
// with every process running the same file).
func AnonMiB(pid int) (float64, error) { return statusMiB(pid, "RssAnon") }

// PeakRSSMiB reads the highest resident set size a process has had since
// it started or since ResetPeakRSS (VmHWM).
func PeakRSSMiB(pid int) (float64, error) { return statusMiB(pid, "VmHWM") }

// ResetPeakRSS makes the process's current resident set its peak, so a
// later PeakRSSMiB tells the peak of what came after (Linux clear_refs).
func ResetPeakRSS(pid int) error {
	return os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
}

func statusMiB(pid int, field string) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, rest, err)
			}
			return float64(kb) / 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc status", field)
}

// CPUSeconds reads the user+system CPU time a process has used (Linux).
func CPUSeconds(pid int) (float64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}
