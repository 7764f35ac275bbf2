// Package health runs a workload's readiness probe, the proxy config's
// readinessProbe (a VM's mesh.yaml has its WorkloadGroup's probe there),
// and reports each change of its verdict, as Istio's agent does
// (pkg/istio-agent/health, WorkloadHealthChecker): the first verdict as
// soon as it is known, then only on a change, after successThreshold
// consecutive successes or failureThreshold consecutive failures. The
// xDS proxy sends the reports to discovery, which writes them into the
// workload's WorkloadEntry; traffic reaches the workload only while it is
// healthy.
package health

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/services/agent/probe"
)

// Event is a change of the workload's health; Message says why it is
// unhealthy.
type Event struct {
	Healthy bool
	Message string
}

// Options configures a Checker.
type Options struct {
	// Probe is the readiness probe.
	Probe *networking.ReadinessProbe
	// Host is where HTTP, TCP and gRPC probes go when the probe names no
	// host: the workload's first IP, else localhost (Istio's
	// resolveDefaultHost).
	Host string
	// Also, when set, must succeed too, first (Istio's agent probes
	// Envoy's readiness before the application's).
	Also func(ctx context.Context) error
}

// Checker probes on a period. Build it with New.
type Checker struct {
	check                func(ctx context.Context) error
	initialDelay, period time.Duration
	successes, failures  int
}

// New returns the checker of a probe, with Istio's defaults (period 10 s,
// timeout 1 s, thresholds 1, HTTP path "/"). An error for a probe with no
// method or an incomplete one.
func New(o Options) (*Checker, error) {
	p := o.Probe
	host := o.Host
	if host == "" {
		host = "localhost"
	}
	timeout := orDefault(p.GetTimeoutSeconds(), 1)
	prober := probe.Prober{TimeoutSeconds: timeout}
	var check func(ctx context.Context) error
	var port uint32
	switch m := p.GetHealthCheckMethod().(type) {
	case *networking.ReadinessProbe_HttpGet:
		h := m.HttpGet
		if h == nil {
			return nil, errors.New("readinessProbe.httpGet is empty")
		}
		scheme := "HTTP"
		if strings.EqualFold(h.GetScheme(), appprobe.SchemeHTTPS) {
			scheme = appprobe.SchemeHTTPS
		}
		path := h.GetPath()
		if path == "" {
			path = "/"
		}
		port = h.GetPort()
		a := &appprobe.HTTPGetAction{Path: path, Port: appprobe.NumberPort(int32(h.GetPort())), Host: h.GetHost(), Scheme: scheme} //nolint:gosec // a port, validated below
		for _, hd := range h.GetHttpHeaders() {
			a.HTTPHeaders = append(a.HTTPHeaders, appprobe.HTTPHeader{Name: hd.GetName(), Value: hd.GetValue()})
		}
		prober.HTTPGet = a
	case *networking.ReadinessProbe_TcpSocket:
		if m.TcpSocket == nil {
			return nil, errors.New("readinessProbe.tcpSocket is empty")
		}
		port = m.TcpSocket.GetPort()
		prober.TCPSocket = &appprobe.TCPSocketAction{Port: appprobe.NumberPort(int32(m.TcpSocket.GetPort())), Host: m.TcpSocket.GetHost()} //nolint:gosec // a port, validated below
	case *networking.ReadinessProbe_Grpc:
		if m.Grpc == nil {
			return nil, errors.New("readinessProbe.grpc is empty")
		}
		port = m.Grpc.GetPort()
		service := m.Grpc.GetService()
		prober.GRPC = &appprobe.GRPCAction{Port: int32(m.Grpc.GetPort()), Service: &service} //nolint:gosec // a port, validated below
	case *networking.ReadinessProbe_Exec:
		command := m.Exec.GetCommand()
		if len(command) == 0 {
			return nil, errors.New("readinessProbe.exec.command is required")
		}
		check = func(ctx context.Context) error { return execProbe(ctx, command, time.Duration(timeout)*time.Second) }
	default:
		return nil, errors.New("readinessProbe has no method: want httpGet, tcpSocket, grpc or exec")
	}
	if check == nil {
		if port == 0 || port > 65535 {
			return nil, fmt.Errorf("readinessProbe: port %d is not from 1 to 65535", port)
		}
		handler := probe.Handler{Host: host}
		check = func(ctx context.Context) error { return handler.Check(ctx, prober) }
	}
	if o.Also != nil {
		app := check
		check = func(ctx context.Context) error {
			if err := o.Also(ctx); err != nil {
				return err
			}
			return app(ctx)
		}
	}
	return &Checker{
		check:        check,
		initialDelay: time.Duration(max(p.GetInitialDelaySeconds(), 0)) * time.Second,
		period:       time.Duration(orDefault(p.GetPeriodSeconds(), 10)) * time.Second,
		successes:    int(orDefault(p.GetSuccessThreshold(), 1)),
		failures:     int(orDefault(p.GetFailureThreshold(), 1)),
	}, nil
}

func orDefault(v, d int32) int32 {
	if v <= 0 {
		return d
	}
	return v
}

// execProbe runs the command; it succeeds when the command exits 0 within
// the timeout.
func execProbe(ctx context.Context, command []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("exec probe: timed out after %s: %w", timeout, err)
		}
		return fmt.Errorf("exec probe: %w", err)
	}
	return nil
}

// Run probes after the initial delay and then every period until ctx
// ends, calling report on each change of verdict (Istio's
// PerformApplicationHealthCheck): healthy after successThreshold
// consecutive successes, unhealthy after failureThreshold consecutive
// failures, the first verdict reported whichever it is.
func (c *Checker) Run(ctx context.Context, report func(Event)) {
	if c.initialDelay > 0 {
		t := time.NewTimer(c.initialDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	const (
		undefined = iota
		healthy
		unhealthy
	)
	last, successes, failures := undefined, 0, 0
	probeOnce := func() {
		err := c.check(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			successes, failures = successes+1, 0
			if successes >= c.successes && last != healthy {
				successes, last = 0, healthy
				report(Event{Healthy: true})
			}
			return
		}
		failures, successes = failures+1, 0
		if failures >= c.failures && last != unhealthy {
			failures, last = 0, unhealthy
			report(Event{Message: err.Error()})
		}
	}
	probeOnce()
	tick := time.NewTicker(c.period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			probeOnce()
		}
	}
}
