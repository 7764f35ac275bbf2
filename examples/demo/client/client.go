// Package client is the demo's proxyless gRPC client: it calls the
// greeter through grpc-go's xDS resolver (xds:///host:port) and xDS
// credentials, so Flotilla's discovery decides where each call goes and
// whether it is mTLS, and prints once per interval how the calls split
// between the versions (and server identities) that answered.
package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	_ "google.golang.org/grpc/xds" // registers the xds:/// resolver and balancers

	"github.com/flotilla-mesh/flotilla/examples/demo/meshid"
)

// DiscoveryScheme names the replicas listed with Options.Discovery in an
// xDS bootstrap: server_uri "flotilla-demo:///discovery".
const DiscoveryScheme = "flotilla-demo"

// Options configure the client.
type Options struct {
	// Target is the xds:/// target to call.
	Target string
	// Discovery lists discovery replicas for the bootstrap's
	// "flotilla-demo:///discovery" server_uri: the xDS stream uses one and
	// moves to the next when it goes away, as behind a Kubernetes Service.
	// Empty when the bootstrap names a server another way (dns:///...).
	Discovery []string
	// Rate is calls per second; Interval how often the split is printed.
	Rate     int
	Interval time.Duration
	// Timeout bounds each call.
	Timeout time.Duration
	Out     io.Writer
	Log     *slog.Logger
}

// Run calls until ctx ends.
func Run(ctx context.Context, o Options) error {
	if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		return fmt.Errorf("no xDS bootstrap: set GRPC_XDS_BOOTSTRAP (a file) or GRPC_XDS_BOOTSTRAP_CONFIG (JSON) naming discovery")
	}
	if o.Rate <= 0 || o.Interval <= 0 || o.Timeout <= 0 {
		return fmt.Errorf("rate, interval and timeout must be positive")
	}
	if len(o.Discovery) > 0 {
		r := manual.NewBuilderWithScheme(DiscoveryScheme)
		addrs := make([]resolver.Address, 0, len(o.Discovery))
		for _, a := range o.Discovery {
			addrs = append(addrs, resolver.Address{Addr: a})
		}
		r.InitialState(resolver.State{Addresses: addrs})
		resolver.Register(r)
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		return fmt.Errorf("xDS credentials: %w", err)
	}
	cc, err := grpc.NewClient(o.Target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("client for %s: %w", o.Target, err)
	}
	defer cc.Close()
	c := testgrpc.NewTestServiceClient(cc)
	if !awaitRoute(ctx, c, o) {
		return nil
	}
	o.Log.Info("calling", "target", o.Target, "rate", o.Rate)

	type result struct {
		who string
		err error
	}
	results := make(chan result, o.Rate)
	tick := time.NewTicker(time.Second / time.Duration(o.Rate))
	defer tick.Stop()
	report := time.NewTicker(o.Interval)
	defer report.Stop()
	counts := map[string]int{}
	// The first failure of each interval is logged with its reason: one
	// line per interval at most, however many calls fail.
	var firstErr error
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			go func() {
				cctx, cancel := context.WithTimeout(ctx, o.Timeout)
				defer cancel()
				var p peer.Peer
				resp, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{}, grpc.Peer(&p))
				who := resp.GetHostname()
				if id := meshid.OfPeer(&p); id != "" && err == nil {
					who += " " + id
				}
				var failed error
				switch {
				case status.Code(err) == codes.PermissionDenied:
					// The server's AuthorizationPolicy said no.
					who = "denied"
				case err != nil:
					who, failed = "error", err
				}
				select {
				case results <- result{who, failed}:
				case <-ctx.Done():
				}
			}()
		case r := <-results:
			counts[r.who]++
			if firstErr == nil && r.err != nil && ctx.Err() == nil {
				firstErr = r.err
			}
		case <-report.C:
			_, _ = fmt.Fprintln(o.Out, Split(counts))
			if firstErr != nil {
				o.Log.Warn("calls failed", "failed", counts["error"], "first_error", firstErr)
			}
			clear(counts)
			firstErr = nil
		}
	}
}

// routeWait bounds one attempt of awaitRoute; each failed attempt is
// logged.
const routeWait = 5 * time.Second

// awaitRoute waits until a call reaches a server (or its authorization
// answers), so that the first split printed is of calls discovery routed,
// not of calls that failed while the control plane was still starting.
// It reports false when ctx ended first.
func awaitRoute(ctx context.Context, c testgrpc.TestServiceClient, o Options) bool {
	o.Log.Info("waiting for discovery to route the first call", "target", o.Target)
	start := time.Now()
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, routeWait)
		_, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
		cancel()
		if err == nil || status.Code(err) == codes.PermissionDenied {
			o.Log.Info("routed", "target", o.Target, "after", time.Since(start).Round(time.Millisecond))
			return true
		}
		if ctx.Err() == nil {
			o.Log.Info("still waiting for a route", "target", o.Target, "waited", time.Since(start).Round(time.Second), "last_error", err)
		}
	}
	return false
}

// Split formats counts as "v1 80% (40) · v2 20% (10)", versions sorted,
// then calls the server's authorization refused as "denied", failed calls
// last as "error". Over mTLS a version is followed by the server's SPIFFE
// identity: "v1 spiffe://cluster.local/ns/demo/sa/greeter-v1 80% (40)".
func Split(counts map[string]int) string {
	total := 0
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return "split: no answers"
	}
	keys := slices.Sorted(maps.Keys(counts))
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == "error" || k == "denied" })
	for _, last := range []string{"denied", "error"} {
		if counts[last] > 0 {
			keys = append(keys, last)
		}
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d%% (%d)", k, (counts[k]*100+total/2)/total, counts[k]))
	}
	return "split: " + strings.Join(parts, " · ")
}
