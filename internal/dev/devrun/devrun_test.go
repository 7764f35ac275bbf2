package devrun

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
)

const helperEnv = "DEVRUN_TEST_HELPER"

// TestMain doubles as the child processes the supervisor runs.
func TestMain(m *testing.M) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		os.Exit(m.Run())
	}
	sig := make(chan os.Signal, 1)
	switch mode {
	case "serve":
		signal.Notify(sig, syscall.SIGTERM)
		fmt.Println("listening")
		fmt.Fprintln(os.Stderr, "a warning")
		<-sig
		fmt.Println("drained")
		os.Exit(0)
	case "stubborn":
		signal.Notify(sig, syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		for range sig {
		}
	case "notbuilt":
		// A SIGTERM from the test's cancel must not beat the exit code.
		signal.Ignore(syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "not built yet")
		os.Exit(3)
	case "slowready":
		// Serves 503 on $READY_ADDR, then 200 after 300 ms.
		start := time.Now()
		ready := false
		var mu sync.Mutex
		go func() {
			_ = http.ListenAndServe(os.Getenv("READY_ADDR"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if time.Since(start) < 300*time.Millisecond {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				if !ready {
					ready = true
					fmt.Println("ready")
				}
			}))
		}()
		signal.Notify(sig, syscall.SIGTERM)
		<-sig
		os.Exit(0)
	case "crash":
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "panic: boom")
		os.Exit(2)
	}
}

func proc(name, mode string) Process {
	return Process{
		Name: name, Path: os.Args[0], Args: []string{"-test.run=^$"},
		// Under -race a process otherwise lingers a second at exit.
		Env: []string{helperEnv + "=" + mode, "GORACE=atexit_sleep_ms=0"},
	}
}

func supervisor(out io.Writer) *Supervisor {
	return &Supervisor{
		Out:          out,
		Log:          slog.New(slog.DiscardHandler),
		StopTimeout:  2 * time.Second,
		NotBuiltCode: 3,
	}
}

// waitFor polls out until it contains want.
func waitFor(t *testing.T, out *testenv.SyncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output never contained %q:\n%s", want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCancelStopsEveryProcessGracefullyWithPrefixedOutput(t *testing.T) {
	out := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = supervisor(out).Run(ctx, []Process{proc("galley", "serve"), proc("ca", "serve"), proc("injector", "notbuilt")})
		done <- err
	}()
	waitFor(t, out, "galley   | listening")
	waitFor(t, out, "ca       | listening")
	waitFor(t, out, "ca       | a warning")
	waitFor(t, out, "injector | not built yet")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	for _, want := range []string{"galley   | drained", "ca       | drained"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if fmt.Sprint(res.NotBuilt) != "[injector]" || fmt.Sprint(res.Stopped) != "[galley ca]" {
		t.Fatalf("result %+v", res)
	}
}

// TestTheNextProcessStartsOnceTheReadyURLAnswers: what depends on a
// process (discovery on galley) starts after it is ready.
func TestTheNextProcessStartsOnceTheReadyURLAnswers(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	first := proc("first", "slowready")
	first.Env = append(first.Env, "READY_ADDR="+addr)
	first.ReadyURL = "http://" + addr + "/readyz"
	out := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := supervisor(out).Run(ctx, []Process{first, proc("second", "serve")})
		done <- err
	}()
	waitFor(t, out, "second | listening")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r, l := strings.Index(out.String(), "first  | ready"), strings.Index(out.String(), "second | listening"); r < 0 || r > l {
		t.Fatalf("second started before first was ready:\n%s", out.String())
	}
}

func TestWhenNothingIsBuiltRunReturnsAtOnceWithTheList(t *testing.T) {
	res, err := supervisor(io.Discard).Run(context.Background(), []Process{proc("a", "notbuilt"), proc("b", "notbuilt")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NotBuilt) != 2 || len(res.Stopped) != 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestACrashStopsTheOthersAndIsReported(t *testing.T) {
	out := &testenv.SyncBuffer{}
	_, err := supervisor(out).Run(context.Background(), []Process{proc("discovery", "serve"), proc("ca", "crash")})
	if err == nil || !strings.Contains(err.Error(), "ca failed: exit status 2") {
		t.Fatalf("Run = %v, want the crash", err)
	}
	if !strings.Contains(out.String(), "discovery | drained") || !strings.Contains(out.String(), "ca        | panic: boom") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// Supervising, a process that exits is restarted with backoff and the
// others keep running until Ctrl-C, as each service fails on its own.
func TestSupervisedACrashIsRestartedAndTheOthersKeepRunning(t *testing.T) {
	out := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := supervisor(out)
	s.Restart, s.RestartBackoff, s.MaxRestartBackoff = true, 20*time.Millisecond, 40*time.Millisecond
	var res Result
	go func() {
		var err error
		res, err = s.Run(ctx, []Process{proc("discovery", "serve"), proc("ca", "crash")})
		done <- err
	}()
	waitFor(t, out, "discovery | listening")
	deadline := time.After(20 * time.Second)
	for strings.Count(out.String(), "ca        | panic: boom") < 3 {
		select {
		case err := <-done:
			t.Fatalf("Run ended with the crash: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("ca was not restarted twice:\n%s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if strings.Contains(out.String(), "discovery | drained") {
		t.Fatalf("discovery was stopped by ca's crash:\n%s", out.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "discovery | drained") || !slices.Contains(res.Stopped, "discovery") {
		t.Fatalf("discovery not stopped gracefully on cancel (%+v):\n%s", res, out.String())
	}
}

func TestAProcessIgnoringSIGTERMIsKilledAfterTheTimeout(t *testing.T) {
	out := &testenv.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := supervisor(out)
	s.StopTimeout = 200 * time.Millisecond
	go func() {
		_, err := s.Run(ctx, []Process{proc("fine", "serve"), proc("stubborn", "stubborn")})
		done <- err
	}()
	waitFor(t, out, "ignoring SIGTERM")
	waitFor(t, out, "fine     | listening")
	cancel()
	err := <-done
	if err == nil || !strings.HasSuffix(err.Error(), "killed after 200ms without exiting: stubborn") {
		t.Fatalf("Run = %v; output:\n%s", err, out.String())
	}
}

func TestAMissingBinaryIsAnError(t *testing.T) {
	_, err := supervisor(io.Discard).Run(context.Background(), []Process{{Name: "x", Path: "/nonexistent/flotilla-x"}})
	if err == nil || !strings.Contains(err.Error(), "start x") {
		t.Fatalf("Run = %v", err)
	}
}

// TestEachProcesssOutputIsKeptInItsLogFileUnprefixed: with LogDir, each
// process's lines go to <name>.log too, as the process wrote them; a new
// run starts them empty.
func TestEachProcesssOutputIsKeptInItsLogFileUnprefixed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "galley.log"), []byte("a line of the last run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := &testenv.SyncBuffer{}
	s := supervisor(out)
	s.LogDir = dir
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(ctx, []Process{proc("galley", "serve"), proc("ca", "serve")})
		done <- err
	}()
	waitFor(t, out, "galley | a warning")
	waitFor(t, out, "ca     | a warning")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	for _, name := range []string{"galley", "ca"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Split(strings.TrimSpace(string(b)), "\n")
		slices.Sort(got) // stdout and stderr interleave
		if want := []string{"a warning", "drained", "listening"}; !slices.Equal(got, want) {
			t.Errorf("%s.log: %q, want %q", name, got, want)
		}
	}
}

func TestALogFileIsRotatedAtItsBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	l := &logFile{path: path}
	line := []byte(strings.Repeat("x", 1<<20-1) + "\n")
	for range MaxLogBytes/len(line) + 3 {
		l.write(line)
	}
	_ = l.f.Close()
	cur, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.Stat(path + ".1")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Size() != 3<<20 || old.Size() != MaxLogBytes {
		t.Errorf("sizes: %d and %d, want %d and %d", cur.Size(), old.Size(), 3<<20, MaxLogBytes)
	}
}
