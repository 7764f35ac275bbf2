// Package greeter is the demo's backend: a gRPC service (grpc-go's
// interop TestService, so no generated code of our own) whose every
// answer names the version that served it and the caller's mesh identity,
// with the standard gRPC health service. As an xDS-enabled server it takes
// its listener and mTLS settings from discovery, through the bootstrap the
// agent writes.
package greeter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/examples/demo/meshid"
)

type server struct {
	testgrpc.UnimplementedTestServiceServer
	version string
}

// UnaryCall answers with the version in the response's hostname field and
// the caller's SPIFFE ID, when it presented a mesh certificate, in its
// username field ("the user the request came from").
func (s *server) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: s.version, Username: meshid.OfContext(ctx)}, nil
}

// Options configure Serve.
type Options struct {
	Address, Version string
	// XDS serves as an xDS-enabled gRPC server: discovery decides, per
	// the PeerAuthentication of the workload, whether the port takes mTLS
	// (with the agent's certificate files) or plaintext, and the port
	// serves only once discovery has said so.
	XDS bool
	Log *slog.Logger
}

// grpcServer is what both kinds of server offer.
type grpcServer interface {
	grpc.ServiceRegistrar
	Serve(net.Listener) error
	GracefulStop()
}

// Serve serves until ctx ends, then stops gracefully.
func Serve(ctx context.Context, o Options) error {
	lis, err := net.Listen("tcp", o.Address)
	if err != nil {
		return fmt.Errorf("greeter listen: %w", err)
	}
	var gs grpcServer
	if o.XDS {
		creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
		if err != nil {
			return fmt.Errorf("greeter credentials: %w", err)
		}
		xs, err := xds.NewGRPCServer(grpc.Creds(creds), xds.ServingModeCallback(func(addr net.Addr, args xds.ServingModeChangeArgs) {
			o.Log.Info("serving mode", "address", addr.String(), "mode", args.Mode.String(), "reason", args.Err)
		}))
		if err != nil {
			return fmt.Errorf("greeter xDS server: %w", err)
		}
		gs = xs
	} else {
		gs = grpc.NewServer()
	}
	testgrpc.RegisterTestServiceServer(gs, &server{version: o.Version})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	o.Log.Info("greeter serving", "version", o.Version, "address", lis.Addr().String(), "xds", o.XDS)
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
