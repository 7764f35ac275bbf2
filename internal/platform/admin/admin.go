// Package admin serves a service's operational HTTP endpoints: /healthz
// (the process is alive), /readyz (every registered component is ready),
// /metrics (Prometheus) and /debug/pprof (to loopback clients only).
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"
)

// Readiness aggregates the readiness of a service's components. A service is
// ready when every registered component is. It is safe for concurrent use.
type Readiness struct {
	mu         sync.Mutex
	components map[string]string // name → reason it is not ready; "" when ready
}

// NewReadiness returns an empty set: with no components, the service is ready.
func NewReadiness() *Readiness {
	return &Readiness{components: map[string]string{}}
}

// Component registers a component, not ready until it says so.
func (r *Readiness) Component(name string) *Component {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.components[name] = "starting"
	return &Component{r: r, name: name}
}

// Check reports whether all components are ready and, if not, why, as
// "name: reason" sorted by name.
func (r *Readiness) Check() (ready bool, notReady []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, reason := range r.components {
		if reason != "" {
			notReady = append(notReady, name+": "+reason)
		}
	}
	slices.Sort(notReady)
	return len(notReady) == 0, notReady
}

// ServeHTTP answers 200 "ok" when every component is ready, else 503
// with the reasons: /readyz, and istiod's /ready where a service serves
// it.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	ok, why := r.Check()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintln(w, "not ready:\n"+strings.Join(why, "\n"))
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}

// Component is one part of a service with its own readiness.
type Component struct {
	r    *Readiness
	name string
}

// SetReady marks the component ready.
func (c *Component) SetReady() { c.set("") }

// SetNotReady marks the component not ready, with a reason shown on /readyz.
func (c *Component) SetNotReady(reason string) {
	if reason == "" {
		reason = "not ready"
	}
	c.set(reason)
}

func (c *Component) set(reason string) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.components[c.name] = reason
}

// Handler returns the admin endpoints. metrics may be nil (no /metrics).
// extra adds a service's own endpoints (e.g. "GET /debug/syncz"); they
// must not clash with the common ones.
func Handler(ready *Readiness, metrics http.Handler, extra map[string]http.Handler) http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range extra {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /readyz", ready)
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	mux.Handle("/debug/pprof/", LoopbackOnly("/debug/pprof", pprof.Index))
	mux.Handle("/debug/pprof/cmdline", LoopbackOnly("/debug/pprof", pprof.Cmdline))
	mux.Handle("/debug/pprof/profile", LoopbackOnly("/debug/pprof", pprof.Profile))
	mux.Handle("/debug/pprof/symbol", LoopbackOnly("/debug/pprof", pprof.Symbol))
	mux.Handle("/debug/pprof/trace", LoopbackOnly("/debug/pprof", pprof.Trace))
	return mux
}

// LoopbackOnly serves h to clients on the loopback interface only, as
// Istio's agent serves its debug endpoints: profiles, command lines and
// a pod's bootstrap and certificates are not for every peer of the pod
// network, and a port-forward arrives from loopback. what names what is
// refused to the others.
func LoopbackOnly(what string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, what+" is served on loopback only (kubectl port-forward reaches it)", http.StatusForbidden)
			return
		}
		h(w, r)
	})
}

// Serve serves h on lis until ctx ends, then shuts down, giving in-flight
// requests up to drain to finish.
func Serve(ctx context.Context, log *slog.Logger, lis net.Listener, h http.Handler, drain time.Duration) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No WriteTimeout: /debug/pprof/profile streams for its duration.
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("admin server listening", "address", lis.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("admin serve %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("admin shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin serve %s: %w", lis.Addr(), err)
	}
	return nil
}
