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

// This file is the gRPC codec of the xDS server, and the wire form of the
// resources it sends. A resource is encoded once per push context and
// shared by every proxy that gets it (generation.go), and it is encoded as
// it goes on the wire (frame): as one element of a response's resources,
// Any and all. The server sends sotwResponse and deltaResponse. The codec
// writes each as the response's own few bytes followed by the shared
// bytes of each resource, without copying them. gRPC's own codec would
// copy every resource, and frame it again, into a new buffer per
// response, which waits for each proxy until the proxy has read it: with
// thousands of proxies syncing at once, those copies were most of the
// server's memory. Now a response in flight costs the server its head and
// one buffer reference per resource. The bytes on the wire are a valid
// encoding of the same message (fields in another order than
// proto.Marshal's, which any parser accepts).

// ServerOption makes a gRPC server encode xDS responses with the codec.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{base: encoding.GetCodecV2("proto")})
}

type codec struct{ base encoding.CodecV2 }

func (codec) Name() string { return "proto" }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	return c.base.Unmarshal(data, v) //nolint:wrapcheck // gRPC's own codec's error
}

// sotwResponse is a DiscoveryResponse whose resources are encodings of
// this package: head is the response without its resources.
type sotwResponse struct {
	head      *discoveryv3.DiscoveryResponse
	resources []*named
}

// deltaResponse is a DeltaDiscoveryResponse whose resources are encodings
// of this package, each sent with its name and version: head is the
// response without its resources.
type deltaResponse struct {
	head      *discoveryv3.DeltaDiscoveryResponse
	resources []*named
}

// ProtoReflect is the response as a protobuf message, so that any codec
// encodes it (gRPC's own copies what this codec shares).
func (r *sotwResponse) ProtoReflect() protoreflect.Message {
	m := proto.CloneOf(r.head)
	for _, res := range r.resources {
		m.Resources = append(m.Resources, res.any)
	}
	return m.ProtoReflect()
}

// ProtoReflect is the response as a protobuf message, as sotwResponse's.
func (r *deltaResponse) ProtoReflect() protoreflect.Message {
	m := proto.CloneOf(r.head)
	for _, res := range r.resources {
		m.Resources = append(m.Resources, &discoveryv3.Resource{Name: res.name, Version: res.version, Resource: res.any})
	}
	return m.ProtoReflect()
}

var (
	sotwResources  = fieldNumber(&discoveryv3.DiscoveryResponse{}, "resources")
	deltaResources = fieldNumber(&discoveryv3.DeltaDiscoveryResponse{}, "resources")
	deltaName      = fieldNumber(&discoveryv3.Resource{}, "name")
	deltaVersion   = fieldNumber(&discoveryv3.Resource{}, "version")
	deltaResource  = fieldNumber(&discoveryv3.Resource{}, "resource")
	anyTypeURL     = fieldNumber(&anypb.Any{}, "type_url")
	anyValue       = fieldNumber(&anypb.Any{}, "value")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *sotwResponse:
		head, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.head)
		if err != nil {
			return nil, fmt.Errorf("encoding a response: %w", err)
		}
		out := make(mem.BufferSlice, 0, 1+len(m.resources))
		out = append(out, mem.SliceBuffer(head))
		for _, r := range m.resources {
			out = append(out, r.sotw)
		}
		return out, nil
	case *deltaResponse:
		head, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.head)
		if err != nil {
			return nil, fmt.Errorf("encoding a response: %w", err)
		}
		out := make(mem.BufferSlice, 0, 1+2*len(m.resources))
		out = append(out, mem.SliceBuffer(head))
		for _, r := range m.resources {
			out = append(out, r.deltaHead, r.anyPart)
		}
		return out, nil
	}
	return c.base.Marshal(v) //nolint:wrapcheck // gRPC's own codec's error
}

// wire is a resource as the codec sends it.
type wire struct {
	// sotw is the resource as one element of a DiscoveryResponse's
	// resources: the field's tag and length, then the Any. deltaHead is
	// what precedes the Any as one element of a DeltaDiscoveryResponse's
	// resources (tag and length, name, version, and the Any's tag and
	// length); anyPart is the Any, sotw's own bytes from the Any on.
	// Each is boxed once, so that a response refers to them without
	// allocating.
	sotw, deltaHead, anyPart mem.Buffer
}

// frame is the wire form of a resource of type t, named name at version
// version, whose encoding is value, and the resource as an Any whose
// value shares those bytes.
func frame(t, name, version string, value []byte) (wire, *anypb.Any) {
	anySize := protowire.SizeTag(anyTypeURL) + protowire.SizeBytes(len(t)) +
		protowire.SizeTag(anyValue) + protowire.SizeBytes(len(value))
	b := make([]byte, 0, protowire.SizeTag(sotwResources)+protowire.SizeBytes(anySize))
	b = protowire.AppendTag(b, sotwResources, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(anySize)) //nolint:gosec // a size, never negative
	anyAt := len(b)
	b = protowire.AppendTag(b, anyTypeURL, protowire.BytesType)
	b = protowire.AppendString(b, t)
	b = protowire.AppendTag(b, anyValue, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(value)))
	valueAt := len(b)
	b = append(b, value...)

	size := protowire.SizeTag(deltaName) + protowire.SizeBytes(len(name)) +
		protowire.SizeTag(deltaVersion) + protowire.SizeBytes(len(version)) +
		protowire.SizeTag(deltaResource) + protowire.SizeBytes(anySize)
	d := make([]byte, 0, protowire.SizeTag(deltaResources)+protowire.SizeVarint(uint64(size))+size-anySize) //nolint:gosec // as above
	d = protowire.AppendTag(d, deltaResources, protowire.BytesType)
	d = protowire.AppendVarint(d, uint64(size)) //nolint:gosec // as above
	d = protowire.AppendTag(d, deltaName, protowire.BytesType)
	d = protowire.AppendString(d, name)
	d = protowire.AppendTag(d, deltaVersion, protowire.BytesType)
	d = protowire.AppendString(d, version)
	d = protowire.AppendTag(d, deltaResource, protowire.BytesType)
	d = protowire.AppendVarint(d, uint64(anySize)) //nolint:gosec // as above

	return wire{
		sotw:      mem.SliceBuffer(b),
		deltaHead: mem.SliceBuffer(d),
		anyPart:   mem.SliceBuffer(b[anyAt:]),
	}, &anypb.Any{TypeUrl: t, Value: b[valueAt:len(b):len(b)]}
}
