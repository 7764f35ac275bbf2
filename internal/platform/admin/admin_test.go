package admin

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func serve(t *testing.T, ready *Readiness) (base string, stop func() error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "flotilla_up 1\n")
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, quiet(), lis, Handler(ready, metrics, nil), 5*time.Second) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + lis.Addr().String(), stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestReadyzFollowsComponentReadiness(t *testing.T) {
	ready := NewReadiness()
	base, _ := serve(t, ready)
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("no components: /readyz = %d, want 200", code)
	}
	mcp := ready.Component("mcp")
	xds := ready.Component("xds")
	code, body := get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "mcp: starting") || !strings.Contains(body, "xds: starting") {
		t.Fatalf("/readyz = %d %q, want 503 naming both components", code, body)
	}
	mcp.SetReady()
	xds.SetNotReady("waiting for first snapshot")
	code, body = get(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || strings.Contains(body, "mcp") || !strings.Contains(body, "xds: waiting for first snapshot") {
		t.Fatalf("/readyz = %d %q", code, body)
	}
	xds.SetReady()
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("all ready: /readyz = %d", code)
	}
	// Liveness is independent of readiness.
	xds.SetNotReady("")
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
}

func TestMetricsAndProfilesAreServed(t *testing.T) {
	base, _ := serve(t, NewReadiness())
	if code, body := get(t, base+"/metrics"); code != http.StatusOK || body != "flotilla_up 1\n" {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	if code, body := get(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ = %d", code)
	}
	if code, _ := get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Fatalf("goroutine profile = %d", code)
	}
	if code, _ := get(t, base+"/nope"); code != http.StatusNotFound {
		t.Fatalf("/nope = %d", code)
	}
}

// TestProfilesAreServedToLoopbackClientsOnly: a client from the pod
// network is refused /debug/pprof (a port-forward arrives from loopback);
// /metrics and the health endpoints are everyone's.
func TestProfilesAreServedToLoopbackClientsOnly(t *testing.T) {
	h := Handler(NewReadiness(), nil, nil)
	for _, tc := range []struct {
		remote, path string
		want         int
	}{
		{"10.244.1.7:51234", "/debug/pprof/", http.StatusForbidden},
		{"10.244.1.7:51234", "/debug/pprof/cmdline", http.StatusForbidden},
		{"[fd00::7]:51234", "/debug/pprof/goroutine?debug=1", http.StatusForbidden},
		{"10.244.1.7:51234", "/healthz", http.StatusOK},
		{"127.0.0.1:51234", "/debug/pprof/cmdline", http.StatusOK},
		{"[::1]:51234", "/debug/pprof/", http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		r.RemoteAddr = tc.remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s from %s: %d, want %d", tc.path, tc.remote, w.Code, tc.want)
		}
	}
}

func TestServeStopsWhenItsContextEnds(t *testing.T) {
	base, stop := serve(t, NewReadiness())
	if err := stop(); err != nil {
		t.Fatalf("Serve = %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("admin server still answers after shutdown")
	}
}
