package xds

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// This file is the gRPC codec of the xDS server. A response's resources
// are encoded once per push and shared by every proxy that gets them
// (generation.go); gRPC's own codec would copy all of them into one new
// buffer per response, which waits, for each proxy, until the proxy has
// read it. With thousands of proxies syncing at once that copy is most of
// the server's memory. This codec writes a response as its small framing
// followed by the shared resource bytes themselves, without copying them.
// The bytes on the wire are a valid encoding of the same message (fields
// in another order than proto.Marshal's, which any parser accepts).

// ServerOption makes a gRPC server encode xDS responses with the codec.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{base: encoding.GetCodecV2("proto")})
}

type codec struct{ base encoding.CodecV2 }

func (codec) Name() string { return "proto" }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.base.Unmarshal(data, v) //nolint:wrapcheck // gRPC's own codec's error
}

var (
	sotwResources  = fieldNumber(&discoveryv3.DiscoveryResponse{}, "resources")
	deltaResources = fieldNumber(&discoveryv3.DeltaDiscoveryResponse{}, "resources")
	deltaResource  = fieldNumber(&discoveryv3.Resource{}, "resource")
	anyTypeURL     = fieldNumber(&anypb.Any{}, "type_url")
	anyValue       = fieldNumber(&anypb.Any{}, "value")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *discoveryv3.DiscoveryResponse:
		w, err := newFramer(without(m, "resources"))
		if err != nil {
			return nil, err
		}
		for _, a := range m.GetResources() {
			w.tag(sotwResources, anySize(a))
			w.any(a)
		}
		return w.done(), nil
	case *discoveryv3.DeltaDiscoveryResponse:
		w, err := newFramer(without(m, "resources"))
		if err != nil {
			return nil, err
		}
		for _, r := range m.GetResources() {
			hb, err := proto.MarshalOptions{Deterministic: true}.Marshal(without(r, "resource"))
			if err != nil {
				return nil, fmt.Errorf("encoding a resource's header: %w", err)
			}
			size := len(hb)
			if a := r.GetResource(); a != nil {
				size += protowire.SizeTag(deltaResource) + protowire.SizeBytes(anySize(a))
			}
			w.tag(deltaResources, size)
			w.head = append(w.head, hb...)
			if a := r.GetResource(); a != nil {
				w.tag(deltaResource, anySize(a))
				w.any(a)
			}
		}
		return w.done(), nil
	}
	return c.base.Marshal(v) //nolint:wrapcheck // gRPC's own codec's error
}

// without is a shallow copy of m (its fields' values shared) without one
// field.
func without(m proto.Message, field protoreflect.Name) proto.Message {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != field {
			dst.Set(fd, v)
		}
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	return dst.Interface()
}

// anySize is the encoded size of an Any.
func anySize(a *anypb.Any) int {
	if opaque(a) {
		return proto.Size(a)
	}
	return protowire.SizeTag(anyTypeURL) + protowire.SizeBytes(len(a.GetTypeUrl())) +
		protowire.SizeTag(anyValue) + protowire.SizeBytes(len(a.GetValue()))
}

// framer builds a buffer slice: framing bytes of its own, and the shared
// resource bytes as they are.
type framer struct {
	out  mem.BufferSlice
	head []byte // framing not yet in out
}

func newFramer(rest proto.Message) (*framer, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(rest)
	if err != nil {
		return nil, fmt.Errorf("encoding a response: %w", err)
	}
	return &framer{head: b}, nil
}

// tag writes a length-delimited field's tag and length.
func (w *framer) tag(n protowire.Number, size int) {
	w.head = protowire.AppendTag(w.head, n, protowire.BytesType)
	w.head = protowire.AppendVarint(w.head, uint64(size)) //nolint:gosec // a size, never negative
}

// opaque reports whether an Any carries more than its two fields (never
// one translate built): it is then encoded by protobuf, copied.
func opaque(a *anypb.Any) bool { return len(a.ProtoReflect().GetUnknown()) > 0 }

// any writes an Any's fields, its value shared.
func (w *framer) any(a *anypb.Any) {
	if opaque(a) {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a) // an Any of bytes always encodes
		w.head = append(w.head, b...)
		return
	}
	w.head = protowire.AppendTag(w.head, anyTypeURL, protowire.BytesType)
	w.head = protowire.AppendString(w.head, a.GetTypeUrl())
	w.head = protowire.AppendTag(w.head, anyValue, protowire.BytesType)
	w.head = protowire.AppendVarint(w.head, uint64(len(a.GetValue())))
	if len(a.GetValue()) == 0 {
		return
	}
	w.flush()
	w.out = append(w.out, mem.SliceBuffer(a.GetValue()))
}

func (w *framer) flush() {
	if len(w.head) > 0 {
		w.out = append(w.out, mem.SliceBuffer(w.head))
		w.head = w.head[len(w.head):] // what follows is appended past what out holds
	}
}

func (w *framer) done() mem.BufferSlice {
	w.flush()
	return w.out
}
