package xds

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

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
	switch r := v.(type) {
	case *sotwRequest:
		// In one buffer (gRPC's own when it is one, else a pooled copy),
		// valid until this returns.
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		if r.subscribed != nil && decodeAsSubscribed(buf.ReadOnlyData(), r) {
			return nil
		}
		return unmarshalRequest(bytes.Clone(buf.ReadOnlyData()), r.DiscoveryRequest) // the names will share the copy's bytes
	case *discoveryv3.DiscoveryRequest:
		return unmarshalRequest(data.Materialize(), r)
	}
	return c.base.Unmarshal(data, v) // unwrapped: gRPC's own codec's error
}

// DiscoveryRequest's fields read before the rest is decoded.
const (
	namesField   = 3 // resource_names
	typeURLField = 4 // type_url
)

// sotwRequest is a state-of-the-world request as a stream receives it.
// subscribed, when set, tells what the stream is subscribed to of a type:
// a request naming exactly that, in that order (Envoy's every ACK does),
// is decoded without its names and marked asSubscribed, so that an ACK
// costs no copy of the hundreds of names it repeats. Another codec decodes
// the embedded message as protobuf does, names and all.
type sotwRequest struct {
	*discoveryv3.DiscoveryRequest

	subscribed   func(typeURL string) nameSet
	asSubscribed bool
}

// eachField calls f with each top-level field of the message raw: its
// number, wire type, the field's bytes (tag and value) and, for a
// length-delimited field, its value, which ends where the field does. It
// reports false, having stopped, when raw is malformed or f returns false.
func eachField(raw []byte, f func(num protowire.Number, typ protowire.Type, field, value []byte) bool) bool {
	for p := 0; p < len(raw); {
		num, typ, n := protowire.ConsumeTag(raw[p:])
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, raw[p+n:])
		if m < 0 {
			return false
		}
		var value []byte
		if typ == protowire.BytesType {
			value, _ = protowire.ConsumeBytes(raw[p+n:])
		}
		if !f(num, typ, raw[p:p+n+m], value) {
			return false
		}
		p += n + m
	}
	return true
}

// isName reports whether a field is one of resource_names.
func isName(num protowire.Number, typ protowire.Type) bool {
	return num == namesField && typ == protowire.BytesType
}

// decodeAsSubscribed decodes raw into r, without its resource names, when
// they are the names r.subscribed gives for its type, in that order; it
// reports false, r to be decoded anew, otherwise (another subscription, a
// malformed message, none subscribed). raw is not kept.
func decodeAsSubscribed(raw []byte, r *sotwRequest) bool {
	var typeURL []byte
	if !eachField(raw, func(num protowire.Number, typ protowire.Type, _, value []byte) bool {
		if num == typeURLField && typ == protowire.BytesType {
			typeURL = value // the last one, as protobuf takes it
		}
		return true
	}) {
		return false
	}
	set := r.subscribed(string(typeURL))
	if set.len() == 0 {
		return false // nothing to save
	}
	packed := set.packed.Value()
	var rest []byte
	same := eachField(raw, func(num protowire.Number, typ protowire.Type, field, value []byte) bool {
		if !isName(num, typ) {
			rest = append(rest, field...)
			return true
		}
		if packed == "" {
			return false
		}
		var have string
		have, packed = next(packed)
		return have == string(value)
	})
	if !same || packed != "" || proto.Unmarshal(rest, r.DiscoveryRequest) != nil {
		return false
	}
	r.asSubscribed = true
	return true
}

// unmarshalRequest decodes a state-of-the-world request as proto.Unmarshal
// does, its resource names as substrings of raw: a sidecar's every ACK of
// load assignments names each of them again (hundreds), and
// proto.Unmarshal would allocate a string for each. raw is the codec's
// own copy of the message (Materialize) and is never written to, so the
// names may share its bytes; they pin it, and nothing keeps them past the
// request (a stream's subscription is its own copy, makeNameSet). The
// other fields are decoded by proto.Unmarshal; so is the whole message
// when it is malformed, for proto's own error.
func unmarshalRequest(raw []byte, req *discoveryv3.DiscoveryRequest) error {
	count := 0
	if !eachField(raw, func(num protowire.Number, typ protowire.Type, _, _ []byte) bool {
		if isName(num, typ) {
			count++
		}
		return true
	}) {
		return proto.Unmarshal(raw, req) // unwrapped: proto's error, as gRPC's codec returns it
	}
	msg := unsafe.String(unsafe.SliceData(raw), len(raw)) //nolint:gosec // raw is never written to (above)
	names := make([]string, 0, count)
	var rest []byte
	at := 0 // where the next field begins in raw
	valid := eachField(raw, func(num protowire.Number, typ protowire.Type, field, value []byte) bool {
		end := at + len(field)
		at = end
		if !isName(num, typ) {
			rest = append(rest, field...)
			return true
		}
		name := msg[end-len(value) : end]
		names = append(names, name)
		return utf8.ValidString(name)
	})
	if !valid {
		return errors.New("decoding a DiscoveryRequest: resource_names: string field contains invalid UTF-8")
	}
	if err := proto.Unmarshal(rest, req); err != nil {
		return err // unwrapped: as above
	}
	if count > 0 {
		req.ResourceNames = names
	}
	return nil
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
	return c.base.Marshal(v) // unwrapped: gRPC's own codec's error
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
