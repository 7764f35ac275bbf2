package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	mcpv1alpha1 "istio.io/api/mcp/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/platform/grpcclient"
)

// Handler receives changes of one collection. It is called from one
// goroutine, in the order responses arrive. Returning an error rejects
// (NACKs) the response with that error as the reason; the client then
// keeps its previous versions for the collection, so the server does not
// count the rejected resources as delivered.
type Handler interface {
	Apply(typeURL string, updated []*Resource, removed []string) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(typeURL string, updated []*Resource, removed []string) error

// Apply calls f.
func (f HandlerFunc) Apply(typeURL string, updated []*Resource, removed []string) error {
	return f(typeURL, updated, removed)
}

// ClientOptions configures a Client.
type ClientOptions struct {
	// Conn is the connection to galley; the client does not close it.
	Conn grpc.ClientConnInterface
	// NodeID identifies the subscriber in galley's logs and metrics;
	// Version, sent in its metadata (VersionMetadata), in galley's list
	// of subscribers.
	NodeID, Version string
	// TypeURLs are the collections to subscribe to (all resources of each).
	TypeURLs []string
	Handler  Handler
	Log      *slog.Logger
	// Backoff bounds resubscription delays; defaults 100ms to
	// grpcclient.MaxReconnectDelay, with full jitter.
	MinBackoff, MaxBackoff time.Duration
	// Meter records flotilla_mcp_client_lag_seconds and
	// flotilla_mcp_client_subscribed (nil: not recorded).
	Meter metric.Meter
}

// Client is a delta MCP subscriber that reconnects until its context ends.
type Client struct {
	o ClientOptions

	mu       sync.Mutex
	versions map[string]map[string]string // type URL → name → version held
	server   *corev3.ControlPlane         // as the last response named it
	lag      metric.Float64Histogram
	// subscribed is 1 while a stream is open and galley has answered on
	// it, 0 otherwise.
	subscribed metric.Int64Gauge
}

// ControlPlane is the server as its last response named itself (nil
// before any, or when it does not).
func (c *Client) ControlPlane() *corev3.ControlPlane {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.server
}

// NewClient returns a client; Run starts it.
func NewClient(o ClientOptions) (*Client, error) {
	if o.MinBackoff == 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = grpcclient.MaxReconnectDelay
	}
	v := map[string]map[string]string{}
	for _, t := range o.TypeURLs {
		v[t] = map[string]string{}
	}
	o.Log = o.Log.With("component", "mcp-client")
	meter := cmp.Or[metric.Meter](o.Meter, noop.Meter{})
	lag, err := meter.Float64Histogram("flotilla.mcp.client.lag", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
		metric.WithDescription("From galley publishing a changed resource (by its clock) to this subscriber having applied it, by collection; the first response of a subscription (a resync) is not counted."))
	if err != nil {
		return nil, fmt.Errorf("mcp client metrics: %w", err)
	}
	subscribed, err := meter.Int64Gauge("flotilla.mcp.client.subscribed",
		metric.WithDescription("1 while the subscription to galley is open and galley has answered on it; 0 while it is being (re)established."))
	if err != nil {
		return nil, fmt.Errorf("mcp client metrics: %w", err)
	}
	subscribed.Record(context.Background(), 0)
	return &Client{o: o, versions: v, lag: lag, subscribed: subscribed}, nil
}

// Versions returns the versions the client holds for a collection.
func (c *Client) Versions(typeURL string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]string, len(c.versions[typeURL]))
	for k, v := range c.versions[typeURL] {
		out[k] = v
	}
	return out
}

// Run subscribes and, whenever the stream breaks, resubscribes after a
// jittered exponential backoff (reset after a stream that worked), resuming
// with the versions it holds. It returns when ctx ends.
func (c *Client) Run(ctx context.Context) error {
	backoff := c.o.MinBackoff
	for {
		started := time.Now()
		err := c.stream(ctx)
		c.subscribed.Record(context.Background(), 0)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the context ending is the normal way to stop
		}
		if time.Since(started) > 10*c.o.MaxBackoff {
			backoff = c.o.MinBackoff // the stream was healthy for a while
		}
		// Full jitter: replicas that lost galley together do not return together.
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1) //nolint:gosec // jitter, not security
		c.o.Log.Warn("subscription broken; reconnecting", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, c.o.MaxBackoff)
	}
}

func (c *Client) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(c.o.Conn)
	// Waiting for the connection to be ready, rather than failing on the
	// error it last saw, resubscribes as soon as galley is reachable.
	st, err := ads.DeltaAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("open delta stream: %w", err)
	}
	node := &corev3.Node{Id: c.o.NodeID}
	if c.o.Version != "" {
		node.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{VersionMetadata: structpb.NewStringValue(c.o.Version)}}
	}
	for _, t := range c.o.TypeURLs {
		req := &discoveryv3.DeltaDiscoveryRequest{
			Node:                    node,
			TypeUrl:                 t,
			ResourceNamesSubscribe:  []string{"*"},
			InitialResourceVersions: c.Versions(t),
		}
		if err := st.Send(req); err != nil {
			return fmt.Errorf("subscribe %s: %w", t, err)
		}
	}
	// Collections answered on this stream: the first response of each is
	// the resync, whose publish times say how long the subscriber was
	// away, not its lag.
	answered := map[string]bool{}
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("galley closed the stream")
			}
			return fmt.Errorf("receive: %w", err)
		}
		if cp := resp.GetControlPlane(); cp != nil {
			c.mu.Lock()
			c.server = cp
			c.mu.Unlock()
		}
		ack := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		live := answered[resp.GetTypeUrl()]
		if len(answered) == 0 {
			c.subscribed.Record(context.Background(), 1)
		}
		answered[resp.GetTypeUrl()] = true
		if err := c.apply(resp, live); err != nil {
			c.o.Log.Warn("rejecting response", "type_url", resp.GetTypeUrl(), "error", err)
			ack.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		}
		if err := st.Send(ack); err != nil {
			return fmt.Errorf("acknowledge: %w", err)
		}
	}
}

// apply decodes a response and hands it to the handler. A resource that
// does not decode is reported in the error (NACK) and not applied; the rest
// are applied. For a live response (not a subscription's first), the lag
// of each applied resource the server said it published is recorded; a
// time ahead of this clock counts as no lag.
func (c *Client) apply(resp *discoveryv3.DeltaDiscoveryResponse, live bool) error {
	t := resp.GetTypeUrl()
	var updated []*Resource
	var bad []error
	for _, r := range resp.GetResources() {
		var m mcpv1alpha1.Resource
		if err := proto.Unmarshal(r.GetResource().GetValue(), &m); err != nil {
			bad = append(bad, fmt.Errorf("%s: %w", r.GetName(), err))
			continue
		}
		res := fromProto(&m, r.GetVersion())
		if res.Name == "" {
			res.Name = r.GetName()
		}
		res.Published, res.Trace = publishedAt(r.GetMetadata())
		updated = append(updated, res)
	}
	removed := resp.GetRemovedResources()
	if err := c.o.Handler.Apply(t, updated, removed); err != nil {
		return err
	}
	if live {
		now, attrs := time.Now(), metric.WithAttributes(attribute.String("type_url", t))
		for _, r := range updated {
			if !r.Published.IsZero() {
				c.lag.Record(context.Background(), max(0, now.Sub(r.Published).Seconds()), attrs)
			}
		}
	}
	c.mu.Lock()
	held := c.versions[t]
	if held == nil {
		held = map[string]string{}
		c.versions[t] = held
	}
	for _, r := range updated {
		held[r.Name] = r.Version
	}
	for _, name := range removed {
		delete(held, name)
	}
	c.mu.Unlock()
	if len(bad) > 0 {
		return fmt.Errorf("%d resources do not decode: %w", len(bad), errors.Join(bad...))
	}
	return nil
}
