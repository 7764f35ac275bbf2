// Package grpcserver builds the gRPC server every Flotilla service uses, so
// that all of them share tracing and metrics (otelgrpc), the standard health
// service, keepalive policy, message size limits, optional mTLS and the same
// graceful shutdown.
package grpcserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
)

// MaxSubscriberRequestBytes bounds one request of an xDS or MCP
// subscriber (its node metadata included): discovery's and galley's
// subscription servers both use it.
const MaxSubscriberRequestBytes = 4 << 20

// Defaults for Options fields left zero.
const (
	DefaultMaxRecvMsgBytes = 16 << 20 // large enough for a big snapshot resource, bounded
	DefaultDrainTimeout    = 10 * time.Second
	DefaultKeepaliveTime   = 30 * time.Second
	DefaultKeepaliveWait   = 10 * time.Second
	// DefaultHandshakeTimeout bounds a new connection's TLS and HTTP/2
	// handshakes: a connection that never completes them is closed.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnectionIdle closes a connection that has had no RPC
	// for that long (a GOAWAY: a client that wants it reconnects).
	DefaultMaxConnectionIdle = 2 * time.Minute
	// DefaultMaxConcurrentStreams bounds the streams one connection may
	// have open; more wait for one to end (an xDS proxy or MCP
	// subscriber needs one or a few).
	DefaultMaxConcurrentStreams = 1000
	// DefaultMaxConnsPerPeer bounds the connections one peer address may
	// hold open at once (a proxy holds one or two).
	DefaultMaxConnsPerPeer = 1000
	// DefaultKeepaliveMinTime is how often clients may ping: Envoy and
	// grpc-go clients ping at most every 30s unless configured otherwise;
	// 15s leaves room without letting a client flood the server.
	DefaultKeepaliveMinTime = 15 * time.Second
)

// Options configures New.
type Options struct {
	Log       *slog.Logger
	Telemetry *telemetry.Providers
	// TLS, when any file is set, serves TLS from those files, reloading them
	// when they change; a CA file turns on mutual TLS. With no files the
	// server is plain text, for loopback and development.
	TLS tlsreload.Files
	// TLSConfig serves TLS from a configuration the service builds itself
	// (ca, which issues its own certificate); TLS files win when both are
	// set.
	TLSConfig *tls.Config
	// MaxRecvMsgBytes bounds a single received message.
	MaxRecvMsgBytes int
	// MaxConnectionAge, when set, ends each connection after about that
	// long (grpc-go adds ±10 % jitter): a GOAWAY, then MaxConnectionAgeGrace
	// for its streams to finish before they are closed. Clients reconnect,
	// through their load balancer, so connections spread over replicas
	// added since (Istio's pilot: 30 minutes, 10 seconds).
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// HandshakeTimeout, MaxConnectionIdle and MaxConcurrentStreams bound
	// what one connection may hold (defaults: DefaultHandshakeTimeout,
	// DefaultMaxConnectionIdle, DefaultMaxConcurrentStreams).
	HandshakeTimeout, MaxConnectionIdle time.Duration
	MaxConcurrentStreams                uint32
	// MaxConnsPerPeer bounds the connections one peer address (IP) may
	// hold open at once; more are closed as they are accepted (default
	// DefaultMaxConnsPerPeer; negative: no bound).
	MaxConnsPerPeer int
	// DrainTimeout bounds how long Serve waits for open streams after its
	// context ends before closing them.
	DrainTimeout time.Duration
	// ManyStreams tunes for thousands of long-lived, mostly idle streams
	// (xDS): small per-connection read and write buffers (grpc-go's
	// defaults are 32 KiB each; write buffers already go back to a shared
	// pool after each flush).
	ManyStreams bool
	// Extra are further server options a service needs (the agent's xDS
	// relay forces its pass-through codec).
	Extra []grpc.ServerOption
}

// DrainWithin is the drain timeout that leaves a service whose whole
// shutdown is bounded by shutdown the rest of it (two thirds), so a slow
// drain ends in a clean exit rather than the process being cut off.
func DrainWithin(shutdown time.Duration) time.Duration { return shutdown * 2 / 3 }

// Server is a gRPC server with a health service.
type Server struct {
	*grpc.Server
	// Health reports serving status per service name; "" is the whole server.
	Health *health.Server

	log    *slog.Logger
	drain  time.Duration
	reload *tlsreload.Reloader // nil unless serving TLS from files
	tls    bool
	// perPeer bounds the connections of one peer address (<= 0: none).
	perPeer int

	streams streamSet
}

// streamSet holds the cancel functions of the open streaming RPCs, so a
// drain can end subscriptions (xDS, MCP) that would otherwise never end.
type streamSet struct {
	mu       sync.Mutex
	next     uint64
	cancels  map[uint64]context.CancelFunc
	draining bool
	empty    chan struct{} // closed when draining and no stream is left
}

func (ss *streamSet) add(cancel context.CancelFunc) (uint64, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.draining {
		return 0, false
	}
	if ss.cancels == nil {
		ss.cancels = map[uint64]context.CancelFunc{}
	}
	ss.next++
	ss.cancels[ss.next] = cancel
	return ss.next, true
}

func (ss *streamSet) remove(id uint64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.cancels, id)
	if ss.draining && len(ss.cancels) == 0 {
		select {
		case <-ss.empty:
		default:
			close(ss.empty)
		}
	}
}

// endAll cancels every open stream (and refuses any opened later); the
// channel returned is closed once every stream handler has returned.
func (ss *streamSet) endAll() (int, <-chan struct{}) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.draining = true
	ss.empty = make(chan struct{})
	for _, cancel := range ss.cancels {
		cancel()
	}
	if len(ss.cancels) == 0 {
		close(ss.empty)
	}
	return len(ss.cancels), ss.empty
}

// StreamGrace is how long stream handlers get to return once their
// contexts are cancelled; those still running then (blocked receiving,
// not watching their context) have their connections closed.
const StreamGrace = time.Second

// interceptor gives each streaming RPC a context the drain can cancel.
func (ss *streamSet) interceptor(srv any, stream grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	id, ok := ss.add(cancel)
	if !ok {
		return status.Error(codes.Unavailable, "server is shutting down")
	}
	defer ss.remove(id)
	return handler(srv, &drainableStream{ServerStream: stream, ctx: ctx})
}

type drainableStream struct {
	grpc.ServerStream
	ctx context.Context //nolint:containedctx // the stream's context, as grpc.ServerStream exposes it
}

func (d *drainableStream) Context() context.Context { return d.ctx }

// New builds a server. Register services on it, then call Serve. It fails
// only when TLS files are configured and cannot be loaded.
func New(o Options) (*Server, error) {
	if o.MaxRecvMsgBytes == 0 {
		o.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	o.HandshakeTimeout = cmp.Or(o.HandshakeTimeout, DefaultHandshakeTimeout)
	o.MaxConnectionIdle = cmp.Or(o.MaxConnectionIdle, DefaultMaxConnectionIdle)
	o.MaxConcurrentStreams = cmp.Or(o.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	o.MaxConnsPerPeer = cmp.Or(o.MaxConnsPerPeer, DefaultMaxConnsPerPeer)
	opts := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(o.Telemetry.Tracer),
			otelgrpc.WithMeterProvider(o.Telemetry.Meter),
			otelgrpc.WithPropagators(o.Telemetry.Propagator),
		)),
		grpc.MaxRecvMsgSize(o.MaxRecvMsgBytes),
		grpc.ConnectionTimeout(o.HandshakeTimeout),
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     o.MaxConnectionIdle,
			Time:                  DefaultKeepaliveTime,
			Timeout:               DefaultKeepaliveWait,
			MaxConnectionAge:      o.MaxConnectionAge, // zero: never (grpc-go's default)
			MaxConnectionAgeGrace: o.MaxConnectionAgeGrace,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             DefaultKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}
	if o.ManyStreams {
		opts = append(opts, grpc.ReadBufferSize(8<<10), grpc.WriteBufferSize(8<<10))
	}
	var reload *tlsreload.Reloader
	var creds credentials.TransportCredentials
	if o.TLS.Enabled() {
		var err error
		if reload, err = tlsreload.New(o.TLS, o.Log); err != nil {
			return nil, fmt.Errorf("grpc server tls: %w", err)
		}
		creds = credentials.NewTLS(reload.ServerConfig())
	} else if o.TLSConfig != nil {
		creds = credentials.NewTLS(o.TLSConfig)
	}
	if creds != nil {
		counted, err := countHandshakes(creds, o.Telemetry.Meter.Meter("flotilla/grpcserver"), o.Log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(counted))
	}
	s := &Server{
		Health:  health.NewServer(),
		log:     o.Log,
		tls:     o.TLS.Enabled() || o.TLSConfig != nil,
		drain:   o.DrainTimeout,
		reload:  reload,
		perPeer: o.MaxConnsPerPeer,
	}
	opts = append(opts, grpc.ChainStreamInterceptor(s.streams.interceptor))
	opts = append(opts, o.Extra...)
	s.Server = grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s.Server, s.Health)
	return s, nil
}

// Serve accepts connections on lis until ctx ends, then shuts down
// gracefully: health turns NOT_SERVING, no new RPCs are accepted (clients
// get GOAWAY), open streaming RPCs — subscriptions that would never end on
// their own — have their contexts cancelled so their handlers return and
// clients reconnect elsewhere, unary RPCs get DrainTimeout to finish, and
// whatever is left then is closed.
//
// With TLS files, Serve also watches them and serves rotated certificates to
// new connections. If the watch fails, Serve shuts down and returns the
// error: a server that can no longer rotate would serve an expired
// certificate later, so it is better restarted now.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	lis = limitPerPeer(lis, s.perPeer, s.log)
	errc := make(chan error, 1)
	go func() { errc <- s.Server.Serve(lis) }()
	s.log.Info("grpc server listening", "address", lis.Addr().String(), "tls", s.tls)

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchErr := make(chan error, 1)
	if s.reload != nil {
		go func() { watchErr <- s.reload.Run(watchCtx) }()
	}

	var cause error
	select {
	case err := <-errc:
		return fmt.Errorf("grpc serve %s: %w", lis.Addr(), err)
	case err := <-watchErr:
		if err != nil {
			cause = fmt.Errorf("grpc server tls: %w", err)
		}
	case <-ctx.Done():
	}
	s.Health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
	if n, ended := s.streams.endAll(); n > 0 {
		s.log.Info("ending open streams for the drain", "streams", n)
		select {
		case <-ended:
		case <-stopped:
		case <-time.After(StreamGrace):
			s.log.Info("closing the connections of streams still open")
			s.Stop()
		}
	}
	timer := time.NewTimer(s.drain)
	defer timer.Stop()
	select {
	case <-stopped:
		s.log.Info("grpc server drained")
	case <-timer.C:
		s.log.Warn("grpc drain timed out; closing open streams", "timeout", s.drain)
		s.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return errors.Join(cause, fmt.Errorf("grpc serve %s: %w", lis.Addr(), err))
	}
	return cause
}
