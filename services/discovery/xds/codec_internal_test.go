package xds

import (
	"testing"
	"unsafe"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func testCodec() codec { return codec{base: encoding.GetCodecV2("proto")} }

func packed(tb testing.TB, name string) *anypb.Any {
	tb.Helper()
	a, err := anypb.New(&clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(1e9)})
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// roundTrip encodes m with the codec and decodes it with protobuf's
// own parser.
func roundTrip(tb testing.TB, m proto.Message) (proto.Message, mem.BufferSlice) {
	tb.Helper()
	c := testCodec()
	data, err := c.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	got := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(data.Materialize(), got); err != nil {
		tb.Fatalf("protobuf cannot parse what the codec wrote: %v", err)
	}
	return got, data
}

func sharesBytes(data mem.BufferSlice, b []byte) bool {
	for _, buf := range data {
		if d := buf.ReadOnlyData(); len(d) > 0 && len(d) == len(b) && unsafe.SliceData(d) == unsafe.SliceData(b) {
			return true
		}
	}
	return false
}

func TestTheCodecWritesResponsesProtobufReadsBackWithoutCopyingResources(t *testing.T) {
	a, b := packed(t, "a"), packed(t, "b")
	cp := &corev3.ControlPlane{Identifier: `{"Component":"discovery"}`}
	for _, tt := range []struct {
		name   string
		msg    proto.Message
		shared [][]byte
	}{
		{"state of the world", &discoveryv3.DiscoveryResponse{
			VersionInfo: "v1", TypeUrl: a.GetTypeUrl(), Nonce: "7",
			Resources: []*anypb.Any{a, b}, ControlPlane: cp,
		}, [][]byte{a.GetValue(), b.GetValue()}},
		{"state of the world, no resources", &discoveryv3.DiscoveryResponse{VersionInfo: "v2", TypeUrl: a.GetTypeUrl(), Nonce: "8"}, nil},
		{"an empty resource value", &discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{{TypeUrl: a.GetTypeUrl()}}}, nil},
		{"delta", &discoveryv3.DeltaDiscoveryResponse{
			SystemVersionInfo: "3", TypeUrl: a.GetTypeUrl(), Nonce: "9", ControlPlane: cp,
			RemovedResources: []string{"gone"}, Resources: []*discoveryv3.Resource{
				{Name: "a", Version: "x", Resource: a, Aliases: []string{"alias"}, Ttl: durationpb.New(5e9)},
				{Name: "b", Version: "y", Resource: b},
				{Name: "no body", Version: "z"},
			},
		}, [][]byte{a.GetValue(), b.GetValue()}},
	} {
		got, data := roundTrip(t, tt.msg)
		if !proto.Equal(got, tt.msg) {
			t.Errorf("%s: read back\n%v\nwant\n%v", tt.name, got, tt.msg)
		}
		for i, s := range tt.shared {
			if !sharesBytes(data, s) {
				t.Errorf("%s: resource %d was copied, not shared", tt.name, i)
			}
		}
	}
}

func TestTheCodecEncodesOtherMessagesAsGRPCDoes(t *testing.T) {
	req := &discoveryv3.DiscoveryRequest{TypeUrl: "t", ResourceNames: []string{"a"}}
	got, _ := roundTrip(t, req)
	if !proto.Equal(got, req) {
		t.Fatalf("got %v", got)
	}
}

// FuzzTheCodecAgreesWithProtobuf: any response protobuf parses, the
// codec writes so that it parses back the same.
func FuzzTheCodecAgreesWithProtobuf(f *testing.F) {
	a := packed(f, "a")
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryResponse{VersionInfo: "1", Resources: []*anypb.Any{a}},
		&discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{{Name: "a", Resource: a}}, RemovedResources: []string{"b"}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b, m.ProtoReflect().Descriptor().Name() == "DeltaDiscoveryResponse")
	}
	f.Fuzz(func(t *testing.T, b []byte, delta bool) {
		var m proto.Message = &discoveryv3.DiscoveryResponse{}
		if delta {
			m = &discoveryv3.DeltaDiscoveryResponse{}
		}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		got, _ := roundTrip(t, m)
		if !proto.Equal(got, m) {
			t.Fatalf("read back %v, want %v", got, m)
		}
	})
}
