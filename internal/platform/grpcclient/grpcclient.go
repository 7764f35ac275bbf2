// Package grpcclient holds what every Flotilla client of a control-plane
// service (galley's subscribers, ca's callers, the agent's xDS relay)
// dials with.
package grpcclient

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// MaxReconnectDelay is the longest a client waits between attempts to
// reach a service that went away: once it is back, clients are back
// within this.
const MaxReconnectDelay = time.Second

// ReconnectQuickly makes the connection retry a service that went away
// every MaxReconnectDelay at most (gRPC's default grows to 2 minutes, and
// a stream opened meanwhile fails on the cached error): a restarted
// galley or ca has its subscribers back within a second.
func ReconnectQuickly() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: MaxReconnectDelay,
		},
		MinConnectTimeout: 5 * time.Second,
	})
}
