package xdsproxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/services/agent/wasm"
)

// ecdsType is the type of ECDS resources.
const ecdsType = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"

// The fields the relay reads without decoding a message: a response's
// type_url and nonce (DiscoveryResponse and DeltaDiscoveryResponse alike),
// a state-of-the-world request's version_info and type_url, and a delta
// request's type_url.
const (
	responseTypeURL protowire.Number = 4
	responseNonce   protowire.Number = 5
	requestVersion  protowire.Number = 1
	requestTypeURL  protowire.Number = 4
	// A DeltaDiscoveryRequest's type_url.
	deltaRequestTypeURL protowire.Number = 2
)

// ecdsQueue bounds the ECDS responses waiting for their modules; beyond
// it the relay of discovery's stream waits.
const ecdsQueue = 32

// ecdsConverter converts one stream's ECDS responses, as Istio's agent
// (XdsProxy.rewriteAndForward, deltaRewriteAndForward): the remote Wasm
// modules are fetched and the resources rewritten to load them from the
// cache's files (a failed fetch leaves the filter's RBAC stand-in), off
// the relay's goroutine so other types are not held behind a fetch, and
// in the order discovery sent them. A response that cannot be converted
// is not forwarded: discovery gets a NACK for it, as from Envoy.
type ecdsConverter struct {
	cache *wasm.Cache
	delta bool
	log   *slog.Logger
	queue chan *frame
	// accepted is the ECDS version Envoy last acknowledged, which a
	// state-of-the-world NACK carries.
	accepted atomic.Pointer[string]
}

func newECDSConverter(c *wasm.Cache, delta bool, log *slog.Logger) *ecdsConverter {
	return &ecdsConverter{cache: c, delta: delta, log: log, queue: make(chan *frame, ecdsQueue)}
}

// take queues f when it is an ECDS response, and reports whether it did.
func (c *ecdsConverter) take(ctx context.Context, f *frame) bool {
	if typeURL, _ := peekString(f.data, responseTypeURL); typeURL != ecdsType {
		return false
	}
	select {
	case c.queue <- f:
	case <-ctx.Done():
	}
	return true
}

// sawRequest notes the ECDS version of Envoy's acknowledgements.
func (c *ecdsConverter) sawRequest(f *frame) {
	if c.delta {
		return
	}
	if typeURL, _ := peekString(f.data, requestTypeURL); typeURL != ecdsType {
		return
	}
	if v, ok := peekString(f.data, requestVersion); ok && v != "" {
		c.accepted.Store(&v)
	}
}

// run converts the queued responses until ctx ends or a send fails: a
// converted one to Envoy with down, a NACK to discovery with up.
func (c *ecdsConverter) run(ctx context.Context, down, up func(*frame) error) error {
	for {
		var f *frame
		select {
		case <-ctx.Done():
			return nil
		case f = <-c.queue:
		}
		out, err := c.convert(ctx, f.data)
		if ctx.Err() != nil {
			return nil // the stream ended during the fetch
		}
		if err != nil {
			c.log.Warn("ECDS response refused", "error", err)
			nack, nerr := c.nack(f.data, err)
			if nerr != nil {
				return nerr
			}
			if err := up(&frame{data: nack}); err != nil {
				return err
			}
			continue
		}
		if err := down(&frame{data: out}); err != nil {
			return err
		}
	}
}

// convert decodes an ECDS response, converts its resources and encodes it
// again.
func (c *ecdsConverter) convert(ctx context.Context, data []byte) ([]byte, error) {
	if !c.delta {
		resp := &discoveryv3.DiscoveryResponse{}
		if err := proto.Unmarshal(data, resp); err != nil {
			return nil, fmt.Errorf("decode ECDS response: %w", err)
		}
		if err := c.cache.Convert(ctx, resp.GetResources()); err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	}
	resp := &discoveryv3.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(data, resp); err != nil {
		return nil, fmt.Errorf("decode ECDS response: %w", err)
	}
	var held []*discoveryv3.Resource
	var resources []*anypb.Any
	for _, r := range resp.GetResources() {
		if r.GetResource() != nil {
			held, resources = append(held, r), append(resources, r.GetResource())
		}
	}
	if err := c.cache.Convert(ctx, resources); err != nil {
		return nil, err
	}
	for i, r := range held {
		r.Resource = resources[i]
	}
	return proto.Marshal(resp)
}

// nack is the request refusing the response data, as Envoy sends one.
func (c *ecdsConverter) nack(data []byte, cause error) ([]byte, error) {
	nonce, _ := peekString(data, responseNonce)
	detail := &statuspb.Status{Code: int32(codes.Internal), Message: cause.Error()}
	if c.delta {
		return proto.Marshal(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: ecdsType, ResponseNonce: nonce, ErrorDetail: detail})
	}
	var version string
	if v := c.accepted.Load(); v != nil {
		version = *v
	}
	return proto.Marshal(&discoveryv3.DiscoveryRequest{VersionInfo: version, TypeUrl: ecdsType, ResponseNonce: nonce, ErrorDetail: detail})
}

// peekString reads a top-level string field of an encoded message (the
// last occurrence, as a decoder would), skipping every other field.
func peekString(b []byte, field protowire.Number) (string, bool) {
	var (
		out   string
		found bool
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		if num == field && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", false
			}
			out, found = string(v), true
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", false
		}
		b = b[m:]
	}
	return out, found
}
