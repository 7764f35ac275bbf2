// Package greeter is the demo's backend: a gRPC service (grpc-go's
// interop TestService, so no generated code of our own) whose every
// answer names the version that served it, with the standard gRPC health
// service.
package greeter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

type server struct {
	testgrpc.UnimplementedTestServiceServer
	version string
}

// UnaryCall answers with the version in the response's hostname field.
func (s *server) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: s.version}, nil
}

// Serve serves version on address until ctx ends, then stops gracefully.
func Serve(ctx context.Context, log *slog.Logger, address, version string) error {
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return fmt.Errorf("greeter listen: %w", err)
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, &server{version: version})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	log.Info("greeter serving", "version", version, "address", lis.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("greeter serve: %w", err)
	case <-ctx.Done():
	}
	hs.Shutdown()
	gs.GracefulStop()
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("greeter serve: %w", err)
	}
	return nil
}
