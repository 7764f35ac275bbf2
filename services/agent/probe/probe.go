// Package probe answers the application's Kubernetes probes on the
// agent's port, as Istio's agent does when the injector rewrites them
// (sidecar.istio.io/rewriteAppHTTPProbers): the kubelet then calls
// :15020/app-health/<container>/{livez,readyz,startupz}, which mTLS and
// the traffic capture do not get in the way of, and the agent performs the
// original probe — HTTP GET, TCP connect or gRPC health check — against
// the pod's own address. The original probes come in Istio's
// ISTIO_KUBE_APP_PROBERS environment variable: a JSON object from those
// paths to the probe.
package probe

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
)

// The contract with the injector (package appprobe).
const (
	PathPrefix = appprobe.PathPrefix
	EnvVar     = appprobe.EnvVar
)

// Prober is one original probe.
type Prober = appprobe.Prober

// Parse reads ISTIO_KUBE_APP_PROBERS; empty means no probes. Each entry
// must be under PathPrefix, have exactly one action and a numeric port.
func Parse(s string) (map[string]Prober, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var probers map[string]Prober
	if err := json.Unmarshal([]byte(s), &probers); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	for path, p := range probers {
		if !strings.HasPrefix(path, PathPrefix) {
			return nil, fmt.Errorf("%s: %q is not under %s", EnvVar, path, PathPrefix)
		}
		n := 0
		var port int
		if p.HTTPGet != nil {
			n, port = n+1, p.HTTPGet.Port.Number()
		}
		if p.TCPSocket != nil {
			n, port = n+1, p.TCPSocket.Port.Number()
		}
		if p.GRPC != nil {
			n, port = n+1, int(p.GRPC.Port)
		}
		if n != 1 {
			return nil, fmt.Errorf("%s: %s has %d probe actions, want one", EnvVar, path, n)
		}
		if port <= 0 || port > 65535 {
			return nil, fmt.Errorf("%s: %s: the port must be a number from 1 to 65535 (a named port is resolved by the injector)", EnvVar, path)
		}
	}
	return probers, nil
}

// Handler performs the probes against host (the pod's IP, as the kubelet
// would reach the application).
type Handler struct {
	Probers map[string]Prober
	Host    string
}

// ServeHTTP answers a rewritten probe: 200 when the original succeeds,
// 503 with the reason when it fails, 404 for a path with no probe.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := h.Probers[r.URL.Path]
	if !ok {
		http.Error(w, "no probe at "+r.URL.Path, http.StatusNotFound)
		return
	}
	if err := h.Check(r.Context(), p); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// Check performs one probe within its timeout (1 s when it sets none, the
// kubelet's default): nil when it succeeds, else why not.
func (h Handler) Check(ctx context.Context, p Prober) error {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		return h.http(ctx, p.HTTPGet)
	case p.TCPSocket != nil:
		return h.tcp(ctx, p.TCPSocket)
	case p.GRPC != nil:
		return h.grpc(ctx, p.GRPC)
	}
	return errors.New("the probe has no action")
}

func (h Handler) addr(host string, port int) string {
	if host == "" {
		host = h.Host
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// http is the kubelet's HTTP probe: a status from 200 to 399 succeeds;
// HTTPS certificates are not verified; redirects are not followed.
func (h Handler) http(ctx context.Context, a *appprobe.HTTPGetAction) error {
	scheme := "http"
	if a.Scheme == appprobe.SchemeHTTPS {
		scheme = "https"
	}
	path := a.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+h.addr(a.Host, a.Port.Number())+path, nil)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	req.Header.Set("User-Agent", "kube-probe/flotilla")
	for _, hd := range a.HTTPHeaders {
		if strings.EqualFold(hd.Name, "host") {
			req.Host = hd.Value
			continue
		}
		req.Header.Add(hd.Name, hd.Value)
	}
	client := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet's HTTPS probe
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("HTTP probe: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe: %s", resp.Status)
	}
	return nil
}

func (h Handler) tcp(ctx context.Context, a *appprobe.TCPSocketAction) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", h.addr(a.Host, a.Port.Number()))
	if err != nil {
		return fmt.Errorf("TCP probe: %w", err)
	}
	return conn.Close()
}

func (h Handler) grpc(ctx context.Context, a *appprobe.GRPCAction) error {
	conn, err := grpc.NewClient(h.addr("", int(a.Port)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("gRPC probe: %w", err)
	}
	defer conn.Close()
	service := ""
	if a.Service != nil {
		service = *a.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("gRPC probe: %w", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errors.New("gRPC probe: " + resp.GetStatus().String())
	}
	return nil
}
