package lifecycle

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// waiter blocks until its context is cancelled, then takes drain to return.
func waiter(name string, drain time.Duration, stopped chan<- string) Actor {
	return Actor{Name: name, Run: func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(drain)
		stopped <- name
		return ctx.Err()
	}}
}

func TestCancellingTheContextStopsEveryActor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan string, 2)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, quiet(), 5*time.Second, waiter("a", 0, stopped), waiter("b", 0, stopped)) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after a clean shutdown", err)
	}
	if len(stopped) != 2 {
		t.Fatalf("%d actors stopped, want 2", len(stopped))
	}
}

func TestAFailingActorStopsTheOthersAndIsReported(t *testing.T) {
	stopped := make(chan string, 1)
	boom := errors.New("listen: address in use")
	failing := Actor{Name: "grpc", Run: func(context.Context) error { return boom }}
	err := Run(context.Background(), quiet(), 5*time.Second, failing, waiter("admin", 0, stopped))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "grpc") {
		t.Fatalf("Run = %v, want the grpc actor's error", err)
	}
	if got := <-stopped; got != "admin" {
		t.Fatalf("stopped %q", got)
	}
}

func TestAnActorThatEndsCleanlyAlsoStopsTheGroup(t *testing.T) {
	stopped := make(chan string, 1)
	oneShot := Actor{Name: "once", Run: func(context.Context) error { return nil }}
	if err := Run(context.Background(), quiet(), 5*time.Second, oneShot, waiter("w", 0, stopped)); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if len(stopped) != 1 {
		t.Fatal("the waiting actor was not stopped")
	}
}

func TestShutdownIsBoundedByTheTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	release := make(chan struct{})
	defer close(release)
	stuck := Actor{Name: "stuck", Run: func(context.Context) error { <-release; return nil }}
	stopped := make(chan string, 1)
	err := Run(ctx, quiet(), 50*time.Millisecond, stuck, waiter("fine", 0, stopped))
	if !errors.Is(err, ErrShutdownTimeout) || !strings.Contains(err.Error(), "[stuck]") {
		t.Fatalf("Run = %v, want a timeout naming the stuck actor", err)
	}
}

func TestRunWithoutActorsIsAnError(t *testing.T) {
	if err := Run(context.Background(), quiet(), time.Second); err == nil {
		t.Fatal("want error")
	}
}

// The tests below run a real child process (this test binary) and signal it.

const helperEnv = "LIFECYCLE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "drain":
		os.Exit(helperDrain(100 * time.Millisecond))
	case "slow":
		os.Exit(helperDrain(time.Minute))
	}
}

// helperDrain runs a group whose actor needs drain to finish after the signal.
func helperDrain(drain time.Duration) int {
	ctx, stop := SignalContext(context.Background())
	defer stop()
	a := Actor{Name: "server", Run: func(ctx context.Context) error {
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("stopping")
		time.Sleep(drain)
		fmt.Println("drained")
		return nil
	}}
	if err := Run(ctx, quiet(), 2*time.Minute, a); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	return 0
}

func startHelper(t *testing.T, mode string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("helper did not start: %q", sc.Text())
	}
	return cmd, sc
}

func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd, sc := startHelper(t, "drain")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if !sc.Scan() || sc.Text() != "stopping" {
				t.Fatalf("want stopping, got %q", sc.Text())
			}
			if !sc.Scan() || sc.Text() != "drained" {
				t.Fatalf("want drained, got %q", sc.Text())
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit: %v", err)
			}
		})
	}
}

func TestASecondSignalEndsTheProcessWithoutWaitingForTheDrain(t *testing.T) {
	cmd, sc := startHelper(t, "slow")
	_ = cmd.Process.Signal(syscall.SIGINT)
	if !sc.Scan() || sc.Text() != "stopping" {
		t.Fatalf("want stopping, got %q", sc.Text())
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // the drain takes a minute; this must not wait for it
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("exit = %v, want killed by the second signal", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("exit status %v, want terminated by SIGINT", exit)
	}
}
