package envoy

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var fake string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakeenvoy")
	if err != nil {
		panic(err)
	}
	fake = filepath.Join(dir, "envoy")
	if out, err := exec.Command("go", "build", "-o", fake, "./testdata/fakeenvoy").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// start runs the stand-in Envoy with env, returning its record file and
// Run's result channel.
func start(t *testing.T, ctx context.Context, env ...string) (admin, recordFile string, done <-chan error) {
	t.Helper()
	admin = testenv.FreeAddr(t)
	recordFile = filepath.Join(t.TempDir(), "record")
	bootstrap := filepath.Join(t.TempDir(), "envoy-rev.json")
	if err := os.WriteFile(bootstrap, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kv := range append([]string{"FAKE_ENVOY_ADMIN=" + admin, "FAKE_ENVOY_RECORD=" + recordFile}, env...) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ch := make(chan error, 1)
	go func() {
		ch <- Run(ctx, Options{
			Binary: fake, Args: []string{"-c", bootstrap, "--drain-time-s", "45"}, Admin: admin,
			TerminationDrain: 300 * time.Millisecond, KillAfter: 5 * time.Second, Log: slog.New(slog.DiscardHandler),
		})
	}()
	return admin, recordFile, ch
}

func recorded(path string) []string {
	data, _ := os.ReadFile(path)
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestStoppingDrainsThenStopsEnvoyAndForwardsSignals(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, rec, done := start(t, ctx)
	xdstest.Eventually(t, "envoy ready", func() bool { return Ready(context.Background(), admin) })
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "SIGUSR1 passed on", func() bool { return strings.Contains(strings.Join(recorded(rec), "|"), "signal user defined signal 1") })
	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
	}
	got := recorded(rec)
	if len(got) != 4 || !strings.HasPrefix(got[0], "started -c ") || got[2] != "drain graceful&inboundonly" || got[3] != "signal terminated" {
		t.Fatalf("envoy saw %q: want started, SIGUSR1, a graceful inbound drain, then SIGTERM", got)
	}
	if waited := time.Since(stopped); waited < 300*time.Millisecond {
		t.Fatalf("stopped %s after the drain: want the termination drain duration first", waited)
	}
	if Ready(context.Background(), admin) {
		t.Fatal("ready after it stopped")
	}
}

func TestEnvoysOwnExitCodeIsReturned(t *testing.T) {
	_, _, done := start(t, context.Background(), "FAKE_ENVOY_CRASH=7")
	var ee *ExitError
	if err := <-done; !errors.As(err, &ee) || ee.Code != 7 {
		t.Fatalf("Run = %v, want envoy's exit code 7", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	admin, _, done := start(t, ctx, "FAKE_ENVOY_CRASH=", "FAKE_ENVOY_EXIT=3")
	xdstest.Eventually(t, "envoy ready", func() bool { return Ready(context.Background(), admin) })
	cancel()
	if err := <-done; !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("Run after a stop = %v, want envoy's exit code 3", err)
	}
}

func TestAMissingBinaryIsAnError(t *testing.T) {
	err := Run(context.Background(), Options{Binary: filepath.Join(t.TempDir(), "no-envoy"), Log: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "start envoy") {
		t.Fatalf("Run = %v", err)
	}
}
