package xdsproxy

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/proto"
)

// The relay passes xDS messages on as the bytes it received, without
// decoding them: a 1 MiB CDS response costs a copy, not an unmarshal and
// a marshal. frame is one message's bytes; passThrough is the codec that
// reads and writes frames as they are, and every other message (the
// health service's) as protobuf.
type frame struct{ data []byte }

type passThrough struct{}

var _ encoding.Codec = passThrough{}

func (passThrough) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case *frame:
		return m.data, nil
	case proto.Message:
		return proto.Marshal(m)
	default:
		return nil, fmt.Errorf("xds relay codec: cannot marshal %T", v)
	}
}

func (passThrough) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *frame:
		m.data = append(m.data[:0], data...) // grpc reuses data once this returns
		return nil
	case proto.Message:
		return proto.Unmarshal(data, m)
	default:
		return fmt.Errorf("xds relay codec: cannot unmarshal into %T", v)
	}
}

// Name is protobuf's: on the wire the messages are protobuf.
func (passThrough) Name() string { return "proto" }

// ServerOptions are what the pod's gRPC server serving Register needs:
// the pass-through codec.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodec(passThrough{}), grpc.InitialWindowSize(windowBytes), grpc.InitialConnWindowSize(windowBytes)}
}

const adsService = "envoy.service.discovery.v3.AggregatedDiscoveryService"

// serviceDesc is the ADS service over frames: both methods bidirectional
// streams, as in the generated description.
func (p *Proxy) serviceDesc() *grpc.ServiceDesc {
	method := func(name string) grpc.StreamDesc {
		return grpc.StreamDesc{
			StreamName: name, ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, down grpc.ServerStream) error { return p.relayFrames(down, name) },
		}
	}
	return &grpc.ServiceDesc{
		ServiceName: adsService,
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{method("StreamAggregatedResources"), method("DeltaAggregatedResources")},
		Metadata:    "envoy/service/discovery/v3/ads.proto",
	}
}

// relayFrames relays one downstream stream to the same method upstream.
func (p *Proxy) relayFrames(down grpc.ServerStream, name string) error {
	return p.relay(down.Context(), name == "DeltaAggregatedResources",
		func() (*frame, error) {
			f := &frame{}
			return f, down.RecvMsg(f) // relay reads the status
		},
		func(f *frame) error { return down.SendMsg(f) }, // relay reads the status
		func(ctx context.Context) (upstream, error) {
			cs, err := p.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/"+adsService+"/"+name, grpc.ForceCodec(passThrough{}))
			if err != nil {
				return nil, err
			}
			return frameStream{cs}, nil
		})
}

// frameStream is an upstream client stream of frames.
type frameStream struct{ cs grpc.ClientStream }

func (s frameStream) Send(f *frame) error { return s.cs.SendMsg(f) } // relay reads the status
func (s frameStream) Recv() (*frame, error) {
	f := &frame{}
	return f, s.cs.RecvMsg(f) // relay reads the status
}
func (s frameStream) CloseSend() error { return s.cs.CloseSend() } // relay reads the status
