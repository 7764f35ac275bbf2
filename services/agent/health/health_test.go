package health

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	networking "istio.io/api/networking/v1alpha3"
)

// events collects what a checker reports.
type events struct {
	mu  sync.Mutex
	got []Event
}

func (e *events) report(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
}

func (e *events) list() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.got...)
}

// start runs c with a short period until the test ends.
func start(t *testing.T, c *Checker) *events {
	t.Helper()
	c.period = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e := &events{}
	go func() {
		defer close(done)
		c.Run(ctx, e.report)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func port(t *testing.T, addr string) uint32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(n)
}

func TestAnHTTPProbeReportsOnlyChangesPastItsThresholds(t *testing.T) {
	// The application answers the probes in this order, then 200 for ever:
	// a lone failure or success between the others changes nothing.
	script := []int{200, 200, 503, 200, 200, 503, 503, 200, 503, 503, 200, 200}
	var n atomic.Int64
	var headers atomic.Value
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
			return
		}
		headers.Store(r.Header.Get("X-Probe"))
		i := int(n.Add(1)) - 1
		code := 200
		if i < len(script) {
			code = script[i]
		}
		w.WriteHeader(code)
	}))
	defer app.Close()
	c, err := New(Options{Host: "127.0.0.1", Probe: &networking.ReadinessProbe{
		SuccessThreshold: 2, FailureThreshold: 2,
		HealthCheckMethod: &networking.ReadinessProbe_HttpGet{HttpGet: &networking.HTTPHealthCheckConfig{
			Path: "/ready", Port: port(t, app.Listener.Addr().String()), Scheme: "http",
			HttpHeaders: []*networking.HTTPHeader{{Name: "X-Probe", Value: "flotilla"}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, c)
	// Five probes past the script: every change it makes has been seen.
	waitFor(t, "the script answered", func() bool { return n.Load() >= int64(len(script))+5 })
	got := e.list()
	if len(got) != 3 || !got[0].Healthy || got[1].Healthy || !strings.Contains(got[1].Message, "503") || !got[2].Healthy {
		t.Fatalf("reports %+v, want healthy, unhealthy (503), healthy", got)
	}
	if h, _ := headers.Load().(string); h != "flotilla" {
		t.Errorf("the probe's header reached the application as %q", h)
	}
}

func TestTCPGRPCAndExecProbesSayWhetherTheWorkloadServes(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := port(t, closed.Addr().String())
	closed.Close()
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("greeter", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(glis) }()
	defer gs.Stop()
	for _, c := range []struct {
		name    string
		probe   *networking.ReadinessProbe
		healthy bool
		message string
	}{
		{"a listening port", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Port: port(t, lis.Addr().String())}}}, true, ""},
		{"a closed port", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Port: closedPort}}}, false, "connection refused"},
		{"a gRPC server serving", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Grpc{Grpc: &networking.GrpcHealthCheckConfig{Port: port(t, glis.Addr().String())}}}, true, ""},
		{"a gRPC service not serving", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Grpc{Grpc: &networking.GrpcHealthCheckConfig{Port: port(t, glis.Addr().String()), Service: "greeter"}}}, false, "NOT_SERVING"},
		{"a command that succeeds", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{Command: []string{"true"}}}}, true, ""},
		{"a command that fails", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{Command: []string{"sh", "-c", "exit 3"}}}}, false, "exit status 3"},
		{"a command past its timeout", &networking.ReadinessProbe{TimeoutSeconds: 1, HealthCheckMethod: &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{Command: []string{"sleep", "30"}}}}, false, "timed out after 1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			chk, err := New(Options{Probe: c.probe, Host: "127.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
			e := start(t, chk)
			waitFor(t, "a verdict", func() bool { return len(e.list()) > 0 })
			got := e.list()[0]
			if got.Healthy != c.healthy || !strings.Contains(got.Message, c.message) {
				t.Fatalf("reported %+v, want healthy=%v with %q", got, c.healthy, c.message)
			}
		})
	}
}

func TestEnvoyMustBeReadyBeforeTheApplicationCounts(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var envoyReady atomic.Bool
	c, err := New(Options{
		Host:  "127.0.0.1",
		Probe: &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Port: port(t, lis.Addr().String())}}},
		Also: func(context.Context) error {
			if !envoyReady.Load() {
				return errors.New("envoy is not ready")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, c)
	waitFor(t, "a verdict", func() bool { return len(e.list()) > 0 })
	if got := e.list()[0]; got.Healthy || got.Message != "envoy is not ready" {
		t.Fatalf("first report %+v, want unhealthy: envoy is not ready", got)
	}
	envoyReady.Store(true)
	waitFor(t, "healthy once Envoy is", func() bool { l := e.list(); return len(l) == 2 && l[1].Healthy })
}

func TestProbesThatCannotRunAreRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		probe *networking.ReadinessProbe
		want  string
	}{
		{"no probe", nil, "no method"},
		{"no method", &networking.ReadinessProbe{PeriodSeconds: 5}, "no method"},
		{"an empty httpGet", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_HttpGet{}}, "httpGet is empty"},
		{"port 0", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{}}}, "port 0"},
		{"a port out of range", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Grpc{Grpc: &networking.GrpcHealthCheckConfig{Port: 70000}}}, "port 70000"},
		{"exec without a command", &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_Exec{Exec: &networking.ExecHealthCheckConfig{}}}, "command is required"},
	} {
		if _, err := New(Options{Probe: c.probe}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	c, err := New(Options{Probe: &networking.ReadinessProbe{HealthCheckMethod: &networking.ReadinessProbe_TcpSocket{TcpSocket: &networking.TCPHealthCheckConfig{Port: 80}}}})
	if err != nil {
		t.Fatal(err)
	}
	if c.period != 10*time.Second || c.successes != 1 || c.failures != 1 || c.initialDelay != 0 {
		t.Errorf("defaults: period %s, thresholds %d/%d, delay %s; want Istio's 10s, 1/1, 0", c.period, c.successes, c.failures, c.initialDelay)
	}
}
