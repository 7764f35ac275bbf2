package probe

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
)

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// app is an application with an HTTP server (/healthy 200, /sick 500,
// /slow after a minute, /moved 302), a gRPC server with health (serving "ok",
// not serving "down") and a closed TCP port.
func app(t *testing.T) (httpPort, grpcPort, closedPort int) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthy", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Probe") != "yes" || r.Host != "app.local" {
			http.Error(w, "headers not passed on", http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte("fine"))
	})
	mux.HandleFunc("/sick", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "sick", http.StatusInternalServerError) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Minute): // never, within the probe's timeout
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://elsewhere.invalid/", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("ok", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort = port(t, closed.Addr().String())
	_ = closed.Close()
	return port(t, srv.Listener.Addr().String()), port(t, lis.Addr().String()), closedPort
}

func TestRewrittenProbesPerformTheOriginalAgainstTheApplication(t *testing.T) {
	httpPort, grpcPort, closedPort := app(t)
	get := func(path string) *Prober {
		return &Prober{HTTPGet: &appprobe.HTTPGetAction{Path: path, Port: appprobe.NumberPort(int32(httpPort)), HTTPHeaders: []appprobe.HTTPHeader{{Name: "X-Probe", Value: "yes"}, {Name: "Host", Value: "app.local"}}}}
	}
	svc := func(s string) *string { return &s }
	probers := map[string]Prober{
		"/app-health/web/livez":        *get("/healthy"),
		"/app-health/web/readyz":       *get("/sick"),
		"/app-health/web/startupz":     *get("/moved"),
		"/app-health/slow/readyz":      *get("/slow"),
		"/app-health/db/livez":         {TCPSocket: &appprobe.TCPSocketAction{Port: appprobe.NumberPort(int32(httpPort))}},
		"/app-health/db/readyz":        {TCPSocket: &appprobe.TCPSocketAction{Port: appprobe.NumberPort(int32(closedPort))}},
		"/app-health/greeter/livez":    {GRPC: &appprobe.GRPCAction{Port: int32(grpcPort), Service: svc("ok")}},
		"/app-health/greeter/readyz":   {GRPC: &appprobe.GRPCAction{Port: int32(grpcPort), Service: svc("down")}},
		"/app-health/greeter/startupz": {GRPC: &appprobe.GRPCAction{Port: int32(grpcPort), Service: svc("unknown")}},
	}
	// Round-trip through the environment variable, as the injector writes it.
	raw, err := json.Marshal(probers)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	agent := httptest.NewServer(Handler{Probers: parsed, Host: "127.0.0.1"})
	defer agent.Close()
	for path, want := range map[string]int{
		"/app-health/web/livez":        200,
		"/app-health/web/readyz":       503, // the application answered 500
		"/app-health/web/startupz":     200, // a redirect succeeds, as for the kubelet
		"/app-health/slow/readyz":      503, // beyond the 1 s default timeout
		"/app-health/db/livez":         200,
		"/app-health/db/readyz":        503,
		"/app-health/greeter/livez":    200,
		"/app-health/greeter/readyz":   503,
		"/app-health/greeter/startupz": 503,
		"/app-health/nobody/livez":     404,
	} {
		resp, err := http.Get(agent.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
		// The slow application answers after a minute: a 503 for its
		// timeout (not a 200 a minute later) is the probe's own timeout,
		// whatever the machine's speed.
		if strings.Contains(path, "slow") && !strings.Contains(string(body), "deadline exceeded") {
			t.Errorf("%s: %q, want the probe's timeout as the reason", path, body)
		}
	}
}

func TestParseRefusesProbesItCannotPerform(t *testing.T) {
	if p, err := Parse(""); err != nil || p != nil {
		t.Fatalf("no probes: %v, %v", p, err)
	}
	for name, env := range map[string]string{
		"not JSON":            "{",
		"outside the path":    `{"/healthz": {"tcpSocket": {"port": 80}}}`,
		"no action":           `{"/app-health/a/livez": {"timeoutSeconds": 1}}`,
		"two actions":         `{"/app-health/a/livez": {"tcpSocket": {"port": 80}, "grpc": {"port": 81}}}`,
		"a named port":        `{"/app-health/a/livez": {"httpGet": {"path": "/", "port": "http"}}}`,
		"a port out of range": `{"/app-health/a/livez": {"tcpSocket": {"port": 70000}}}`,
	} {
		if _, err := Parse(env); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A number written as a string is a number, as IntOrString.IntValue reads it.
	if p, err := Parse(`{"/app-health/a/livez": {"tcpSocket": {"port": "80"}}}`); err != nil || p["/app-health/a/livez"].TCPSocket.Port.Number() != 80 {
		t.Errorf("a numeric string port: %+v, %v", p, err)
	}
}

// FuzzParse: whatever the environment variable holds, Parse refuses it or
// returns only probes the handler can perform — one action, a port from
// 1 to 65535, a path under PathPrefix.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		`{"/app-health/a/livez": {"httpGet": {"path": "/", "port": 8080, "httpHeaders": [{"name": "Host", "value": "x"}]}, "timeoutSeconds": 3}}`,
		`{"/app-health/a/readyz": {"tcpSocket": {"port": "80"}}}`,
		`{"/app-health/a/startupz": {"grpc": {"port": 9000, "service": null}}}`,
		`{"/app-health/a/livez": {"tcpSocket": {"port": "http"}}}`,
		`{"/app-health/a/livez": {"tcpSocket": {"port": -1}}}`,
		`{"/x": {}}`,
		`[`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		probers, err := Parse(s)
		if err != nil {
			return
		}
		for path, p := range probers {
			if !strings.HasPrefix(path, PathPrefix) {
				t.Fatalf("accepted %q outside %s", path, PathPrefix)
			}
			var ports []int
			if p.HTTPGet != nil {
				ports = append(ports, p.HTTPGet.Port.Number())
			}
			if p.TCPSocket != nil {
				ports = append(ports, p.TCPSocket.Port.Number())
			}
			if p.GRPC != nil {
				ports = append(ports, int(p.GRPC.Port))
			}
			if len(ports) != 1 || ports[0] < 1 || ports[0] > 65535 {
				t.Fatalf("accepted %s with ports %v", path, ports)
			}
		}
	})
}
