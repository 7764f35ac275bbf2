// Package grpcserver builds the gRPC server every Flotilla service uses, so
// that all of them share tracing and metrics (otelgrpc), the standard health
// service, keepalive policy, message size limits, optional mTLS and the same
// graceful shutdown.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
)

// Defaults for Options fields left zero.
const (
	DefaultMaxRecvMsgBytes = 16 << 20 // large enough for a big snapshot resource, bounded
	DefaultDrainTimeout    = 10 * time.Second
	DefaultKeepaliveTime   = 30 * time.Second
	DefaultKeepaliveWait   = 10 * time.Second
	// DefaultKeepaliveMinTime is how often clients may ping: Envoy and
	// grpc-go clients ping at most every 30s unless configured otherwise;
	// 15s leaves room without letting a client flood the server.
	DefaultKeepaliveMinTime = 15 * time.Second
)

// Options configures New.
type Options struct {
	Log       *slog.Logger
	Telemetry *telemetry.Providers
	// TLS, when set, serves TLS (mTLS if it requires client certificates);
	// otherwise the server is plain text, for loopback and development.
	TLS *tls.Config
	// MaxRecvMsgBytes bounds a single received message.
	MaxRecvMsgBytes int
	// DrainTimeout bounds how long Serve waits for open streams after its
	// context ends before closing them.
	DrainTimeout time.Duration
	// Extra server options, appended after the shared ones.
	Extra []grpc.ServerOption
}

// Server is a gRPC server with a health service.
type Server struct {
	*grpc.Server
	// Health reports serving status per service name; "" is the whole server.
	Health *health.Server

	log   *slog.Logger
	drain time.Duration
}

// New builds a server. Register services on it, then call Serve.
func New(o Options) *Server {
	if o.MaxRecvMsgBytes == 0 {
		o.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	opts := []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(o.Telemetry.Tracer),
			otelgrpc.WithMeterProvider(o.Telemetry.Meter),
			otelgrpc.WithPropagators(o.Telemetry.Propagator),
		)),
		grpc.MaxRecvMsgSize(o.MaxRecvMsgBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    DefaultKeepaliveTime,
			Timeout: DefaultKeepaliveWait,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             DefaultKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	opts = append(opts, o.Extra...)
	s := &Server{
		Server: grpc.NewServer(opts...),
		Health: health.NewServer(),
		log:    o.Log,
		drain:  o.DrainTimeout,
	}
	healthpb.RegisterHealthServer(s.Server, s.Health)
	return s
}

// Serve accepts connections on lis until ctx ends, then shuts down
// gracefully: health turns NOT_SERVING, no new streams are accepted, open
// streams get DrainTimeout to finish, and whatever is left is closed.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Server.Serve(lis) }()
	s.log.Info("grpc server listening", "address", lis.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("grpc serve %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	s.Health.Shutdown()
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
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
		return fmt.Errorf("grpc serve %s: %w", lis.Addr(), err)
	}
	return nil
}
