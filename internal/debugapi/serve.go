package debugapi

import (
	"context"
	"errors"
	"io"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/time/rate"
)

// Answerer is the serving side of a debug stream, discovery's and
// galley's alike: each request that is not the ACK of the last answer
// is answered once, and requests are taken at most at Idle's rate, so a
// client sending them in a loop costs itself time.
type Answerer struct {
	// Answer builds the response to a request; an error ends the stream
	// with it.
	Answer func(*discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error)
	// Nonce names each response.
	Nonce func() string
	Idle  *rate.Limiter
}

// Serve answers the stream whose first request is first until the
// client ends it (nil) or recv, send or Answer fails (that error).
func (a Answerer) Serve(ctx context.Context, first *discoveryv3.DiscoveryRequest,
	recv func() (*discoveryv3.DiscoveryRequest, error), send func(*discoveryv3.DiscoveryResponse) error,
) error {
	last := ""
	for req := first; ; {
		if req.GetResponseNonce() == "" || req.GetResponseNonce() != last {
			resp, err := a.Answer(req)
			if err != nil {
				return err
			}
			resp.Nonce = a.Nonce()
			if err := send(resp); err != nil {
				return err
			}
			last = resp.GetNonce()
		}
		_ = a.Idle.Wait(ctx) // an error: the stream is ending, as recv tells
		var err error
		if req, err = recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
