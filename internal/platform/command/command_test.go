package command

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
)

type testConfig struct {
	Common   `yaml:",inline"`
	Greeting string `yaml:"greeting" usage:"what to say"`
}

func (c testConfig) Validate() error {
	if c.Greeting == "" {
		return errors.Join(c.Common.Validate(), errors.New("greeting must not be empty"))
	}
	return c.Common.Validate()
}

func defaults() testConfig {
	return testConfig{Common: CommonDefaults("127.0.0.1:0"), Greeting: "hello"}
}

// execute runs a command built from run with args and returns its exit code
// and everything it printed.
func execute(t *testing.T, ctx context.Context, run func(context.Context, testConfig, *Runtime) error, args ...string) (int, string) {
	t.Helper()
	cmd := New(Spec[testConfig]{Name: "flotilla-test", Short: "a test service", Defaults: defaults, Run: run})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	return report(cmd.Name(), &out, err), out.String()
}

func notBuilt(context.Context, testConfig, *Runtime) error {
	return &NotBuiltError{Service: "test", Issue: 42}
}

func TestVersionAndHelpWork(t *testing.T) {
	code, out := execute(t, context.Background(), notBuilt, "--version")
	if code != ExitOK || !strings.HasPrefix(out, "flotilla-test dev (commit") {
		t.Fatalf("--version: %d %q", code, out)
	}
	code, out = execute(t, context.Background(), notBuilt, "--help")
	if code != ExitOK {
		t.Fatalf("--help exit %d", code)
	}
	for _, want := range []string{"--config", "--log-level", "--admin-address", "--otlp-endpoint", "FLOTILLA_OTLP_ENDPOINT", "--greeting", "what to say"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestNotBuiltServiceExitsWithItsOwnCodeAndSaysSo(t *testing.T) {
	code, out := execute(t, context.Background(), notBuilt)
	if code != ExitNotBuilt || !strings.Contains(out, "test is not built yet (tracked in issue #42)") {
		t.Fatalf("%d %q", code, out)
	}
}

func TestUsageErrorsExitTwoWithTheReason(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfgFile, []byte("greting: hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"unknown flag":        {args: []string{"--nope"}, want: "unknown flag: --nope"},
		"stray argument":      {args: []string{"serve"}, want: "unexpected arguments"},
		"unknown file field":  {args: []string{"--config", cfgFile}, want: "field greting not found"},
		"bad env value":       {env: map[string]string{"FLOTILLA_LOG_LEVEL": "loud"}, want: `log level "loud"`},
		"validation":          {args: []string{"--greeting="}, want: "greeting must not be empty"},
		"config file via env": {env: map[string]string{"FLOTILLA_CONFIG": cfgFile}, want: "field greting not found"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, out := execute(t, context.Background(), notBuilt, tc.args...)
			if code != ExitUsage || !strings.Contains(out, tc.want) || !strings.Contains(out, "--help") {
				t.Fatalf("exit %d, output %q; want %d mentioning %q", code, out, ExitUsage, tc.want)
			}
		})
	}
}

func TestARunningServiceServesAdminAndStopsOnCancel(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan string, 1)
	run := func(ctx context.Context, cfg testConfig, rt *Runtime) error {
		c := rt.Ready.Component("greeter")
		return rt.Serve(ctx, lifecycle.Actor{Name: "greeter", Run: func(ctx context.Context) error {
			c.SetReady()
			started <- cfg.Greeting
			<-ctx.Done()
			return nil
		}})
	}
	done := make(chan int, 1)
	go func() {
		code, _ := execute(t, ctx, run, "--admin-address", addr, "--greeting", "hi")
		done <- code
	}()
	if g := <-started; g != "hi" {
		t.Fatalf("greeting %q", g)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never became 200: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("exit %d after cancel, want 0", code)
	}
}

func TestProbeExitsZeroOnlyOnA200(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ok.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	closed := httptest.NewServer(nil)
	closed.Close()
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"probe", ok.URL + "/healthz"}, ExitOK, ""},
		{[]string{"probe", down.URL + "/healthz"}, ExitError, "503"},
		{[]string{"probe", closed.URL + "/healthz"}, ExitError, "connection refused"},
		{[]string{"probe", "not a url"}, ExitUsage, "not an http(s) URL"},
		{[]string{"probe"}, ExitUsage, "accepts 1 arg"},
	} {
		code, out := execute(t, context.Background(), notBuilt, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.says) {
			t.Errorf("%v: exit %d %q, want %d saying %q", tc.args, code, out, tc.code, tc.says)
		}
	}
}

func TestNotBuiltWithoutAnIssueSaysSo(t *testing.T) {
	if msg := (&NotBuiltError{Service: "x"}).Error(); !strings.Contains(msg, "x is not built yet (no issue tracks it yet)") {
		t.Fatal(msg)
	}
}

func TestLoopbackIfNoHostKeepsLocalModePortsOnThisMachine(t *testing.T) {
	for in, want := range map[string]string{
		":15010":         "127.0.0.1:15010",
		"0.0.0.0:15010":  "0.0.0.0:15010",
		"10.0.0.1:15010": "10.0.0.1:15010",
		"[::]:15010":     "[::]:15010",
		"not an address": "not an address",
	} {
		if got := LoopbackIfNoHost(in); got != want {
			t.Errorf("LoopbackIfNoHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestArgumentsAreCheckedFirstAndSetTheConfiguration: a command with Args
// takes its positional argument into the configuration; a bad one is a
// usage error before the configuration is read.
func TestArgumentsAreCheckedFirstAndSetTheConfiguration(t *testing.T) {
	var got string
	build := func() *cobra.Command {
		return New(Spec[testConfig]{
			Name: "flotilla-test", Use: "say greeting", Defaults: defaults,
			Args: func(args []string, cfg *testConfig) error {
				if len(args) != 1 {
					return fmt.Errorf("want one greeting, got %q", args)
				}
				cfg.Greeting = args[0]
				return nil
			},
			Run: func(_ context.Context, cfg testConfig, _ *Runtime) error { got = cfg.Greeting; return nil },
		})
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"bonjour"}, ExitOK, ""},
		{nil, ExitUsage, "want one greeting"},
		{[]string{"a", "b", "--greeting="}, ExitUsage, "want one greeting"}, // the arguments are refused before the configuration is read
		{[]string{"a", "b"}, ExitUsage, "want one greeting"},
	} {
		cmd := build()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(tc.args)
		code := report(cmd.Name(), &out, cmd.ExecuteContext(context.Background()))
		if code != tc.code || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.want)
		}
	}
	if got != "bonjour" {
		t.Fatalf("the argument did not reach the configuration: %q", got)
	}
	if !strings.HasPrefix(build().Use, "say greeting") {
		t.Fatalf("Use = %q", build().Use)
	}
}

func TestAnExitCodeErrorEndsTheBinaryWithItsCode(t *testing.T) {
	code, out := execute(t, context.Background(), func(context.Context, testConfig, *Runtime) error {
		return &ExitCodeError{Code: 7, Err: errors.New("envoy exited with code 7")}
	})
	if code != 7 || !strings.Contains(out, "envoy exited with code 7") {
		t.Fatalf("%d %q", code, out)
	}
}
