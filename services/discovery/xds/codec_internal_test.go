package xds

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"unicode/utf8"
	"unsafe"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func testCodec() codec { return codec{base: encoding.GetCodecV2("proto")} }

func cluster(tb testing.TB, name string) *named {
	tb.Helper()
	r, err := encode(resourcev3.ClusterType, &clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(1e9)})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// parse encodes v with the codec and decodes what it wrote, as m, with
// protobuf's own parser.
func parse(tb testing.TB, v any, m proto.Message) mem.BufferSlice {
	tb.Helper()
	data, err := testCodec().Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	if err := proto.Unmarshal(data.Materialize(), m); err != nil {
		tb.Fatalf("protobuf cannot parse what the codec wrote: %v", err)
	}
	return data
}

// shares reports whether data refers to b itself, not a copy.
func shares(data mem.BufferSlice, b mem.Buffer) bool {
	for _, buf := range data {
		if d := buf.ReadOnlyData(); len(d) > 0 && len(d) == b.Len() && unsafe.SliceData(d) == unsafe.SliceData(b.ReadOnlyData()) {
			return true
		}
	}
	return false
}

func TestTheCodecWritesResponsesProtobufReadsBackWithoutCopyingResources(t *testing.T) {
	a, b := cluster(t, "a"), cluster(t, "b")
	empty, err := encode(resourcev3.ClusterType, &clusterv3.Cluster{}) // encodes to no bytes
	if err != nil {
		t.Fatal(err)
	}
	cp := &corev3.ControlPlane{Identifier: `{"Component":"discovery"}`}

	for _, tt := range []struct {
		name string
		res  []*named
	}{
		{"resources", []*named{a, b}},
		{"no resources", nil},
		{"a resource whose encoding is empty", []*named{empty}},
	} {
		t.Run("state of the world, "+tt.name, func(t *testing.T) {
			var got discoveryv3.DiscoveryResponse
			head := &discoveryv3.DiscoveryResponse{VersionInfo: "v1", TypeUrl: resourcev3.ClusterType, Nonce: "7", ControlPlane: cp}
			data := parse(t, &sotwResponse{head: head, resources: tt.res}, &got)
			want := proto.CloneOf(head)
			for _, r := range tt.res {
				want.Resources = append(want.Resources, r.any)
				if !shares(data, r.sotw) {
					t.Errorf("%s was copied, not shared", r.name)
				}
			}
			if !proto.Equal(&got, want) {
				t.Errorf("read back\n%v\nwant\n%v", &got, want)
			}
			if m := (&sotwResponse{head: head, resources: tt.res}); !proto.Equal(m, want) {
				t.Errorf("as a message (for another codec)\n%v\nwant\n%v", m, want)
			}
		})
		t.Run("delta, "+tt.name, func(t *testing.T) {
			var got discoveryv3.DeltaDiscoveryResponse
			head := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "3", TypeUrl: resourcev3.ClusterType, Nonce: "9", ControlPlane: cp, RemovedResources: []string{"gone"}}
			data := parse(t, &deltaResponse{head: head, resources: tt.res}, &got)
			want := proto.CloneOf(head)
			for _, r := range tt.res {
				want.Resources = append(want.Resources, &discoveryv3.Resource{Name: r.name, Version: r.version, Resource: r.any})
				if !shares(data, r.anyPart) || !shares(data, r.deltaHead) {
					t.Errorf("%s was copied, not shared", r.name)
				}
			}
			if !proto.Equal(&got, want) {
				t.Errorf("read back\n%v\nwant\n%v", &got, want)
			}
			if m := (&deltaResponse{head: head, resources: tt.res}); !proto.Equal(m, want) {
				t.Errorf("as a message (for another codec)\n%v\nwant\n%v", m, want)
			}
		})
	}
}

func TestAnEncodedResourcesAnyIsItsMessage(t *testing.T) {
	r := cluster(t, "a")
	var c clusterv3.Cluster
	if err := r.any.UnmarshalTo(&c); err != nil || c.GetName() != "a" || r.name != "a" {
		t.Fatalf("the Any holds %v (%v); name %q", &c, err, r.name)
	}
	if r.any.GetTypeUrl() != resourcev3.ClusterType {
		t.Fatalf("type URL %q", r.any.GetTypeUrl())
	}
}

func TestTheCodecEncodesOtherMessagesAsGRPCDoes(t *testing.T) {
	for _, m := range []proto.Message{
		&discoveryv3.DiscoveryRequest{TypeUrl: "t", ResourceNames: []string{"a"}},
		&discoveryv3.DiscoveryResponse{VersionInfo: "1", Resources: []*anypb.Any{cluster(t, "a").any}}, // debug responses
	} {
		got := m.ProtoReflect().New().Interface()
		parse(t, m, got)
		if !proto.Equal(got, m) {
			t.Fatalf("got %v, want %v", got, m)
		}
	}
}

func TestTheCodecRefusesWhatItCannotEncode(t *testing.T) {
	if _, err := testCodec().Marshal(struct{}{}); err == nil {
		t.Fatal("a value that is no message was encoded")
	}
}

// FuzzTheCodecAgreesWithProtobuf: whatever a resource's type URL, name,
// version and bytes, protobuf parses what the codec writes back to the
// same response, in both protocols.
func FuzzTheCodecAgreesWithProtobuf(f *testing.F) {
	f.Add(resourcev3.ClusterType, "a", "1", []byte{0x0a, 0x01, 'a'})
	f.Add("", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, typeURL, name, version string, value []byte) {
		if !utf8.ValidString(typeURL) || !utf8.ValidString(name) || !utf8.ValidString(version) {
			return // protobuf refuses such strings; translate never builds them
		}
		w, a := frame(typeURL, name, version, value)
		r := &named{nameVersion: &nameVersion{name: name, version: version}, any: a, wire: w}
		var sotw discoveryv3.DiscoveryResponse
		parse(t, &sotwResponse{head: &discoveryv3.DiscoveryResponse{Nonce: "n"}, resources: []*named{r, r}}, &sotw)
		if want := (&discoveryv3.DiscoveryResponse{Nonce: "n", Resources: []*anypb.Any{a, a}}); !proto.Equal(&sotw, want) {
			t.Fatalf("state of the world: read back %v, want %v", &sotw, want)
		}
		var delta discoveryv3.DeltaDiscoveryResponse
		parse(t, &deltaResponse{head: &discoveryv3.DeltaDiscoveryResponse{Nonce: "n"}, resources: []*named{r}}, &delta)
		want := &discoveryv3.DeltaDiscoveryResponse{Nonce: "n", Resources: []*discoveryv3.Resource{{Name: name, Version: version, Resource: a}}}
		if !proto.Equal(&delta, want) {
			t.Fatalf("delta: read back %v, want %v", &delta, want)
		}
	})
}

// sidecarACK is a state-of-the-world ACK of load assignments naming n
// clusters, as a sidecar sends after each EDS response.
func sidecarACK(n int) *discoveryv3.DiscoveryRequest {
	req := &discoveryv3.DiscoveryRequest{
		VersionInfo:   "v1",
		Node:          &corev3.Node{Id: "sidecar~10.0.0.1~a.default~default.svc.cluster.local"},
		TypeUrl:       resourcev3.EndpointType,
		ResponseNonce: "n1",
	}
	for i := range n {
		req.ResourceNames = append(req.ResourceNames, fmt.Sprintf("outbound|80|v%d|svc-%d.default.svc.cluster.local", i%3, i))
	}
	slices.Sort(req.ResourceNames) // as Envoy sends them (a sorted set)
	return req
}

// sidecarACKBytes is sidecarACK(n) on the wire.
func sidecarACKBytes(tb testing.TB, n int) []byte {
	tb.Helper()
	raw, err := proto.Marshal(sidecarACK(n))
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// unmarshalled decodes raw with the codec, as gRPC calls it.
func unmarshalled(raw []byte) (*discoveryv3.DiscoveryRequest, error) {
	var req discoveryv3.DiscoveryRequest
	err := testCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &req)
	return &req, err
}

func TestTheCodecDecodesRequestsAsProtobufDoes(t *testing.T) {
	appendName := func(b []byte, name string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, 3, protowire.BytesType), name)
	}
	ack := sidecarACKBytes(t, 3)
	for _, tt := range []struct {
		name string
		raw  []byte
	}{
		{"an ACK", ack},
		{"names between and after the other fields", appendName(append(appendName(nil, "b"), ack...), "a")},
		{"an empty name and an unknown field", protowire.AppendVarint(protowire.AppendTag(appendName(nil, ""), 99, protowire.VarintType), 7)},
		{"resource_names with the wrong wire type, kept as protobuf keeps it", protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 1)},
		{"nothing", nil},
	} {
		want := &discoveryv3.DiscoveryRequest{}
		if err := proto.Unmarshal(tt.raw, want); err != nil {
			t.Fatalf("%s: protobuf: %v", tt.name, err)
		}
		got, err := unmarshalled(tt.raw)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s: decoded %v, protobuf decodes %v", tt.name, got, want)
		}
	}
}

func TestTheCodecRefusesMalformedRequestsAsProtobufDoes(t *testing.T) {
	ack := sidecarACKBytes(t, 3)
	for _, tt := range []struct {
		name string
		raw  []byte
	}{
		{"cut short", ack[:len(ack)-5]},
		{"a name that is not UTF-8", protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "a\xffb")},
		{"a length past the end", append(protowire.AppendTag(nil, 3, protowire.BytesType), 0x7f, 'a')},
		{"a bad tag", []byte{0x80}},
		{"an end-group tag alone", protowire.AppendTag(nil, 3, protowire.EndGroupType)},
	} {
		if err := proto.Unmarshal(tt.raw, &discoveryv3.DiscoveryRequest{}); err == nil {
			t.Fatalf("%s: protobuf accepts it", tt.name)
		}
		if _, err := unmarshalled(tt.raw); err == nil {
			t.Errorf("%s: decoded without an error", tt.name)
		}
	}
}

func TestAnACKNamingHundredsOfClustersCostsAFewAllocations(t *testing.T) {
	raw := sidecarACKBytes(t, 600)
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := unmarshalled(raw); err != nil {
			t.Fatal(err)
		}
	})
	// The message's copy, the names' slice, the other fields and what
	// proto.Unmarshal makes of them (node, version, nonce): not one per
	// name, as proto.Unmarshal alone makes (617 here).
	if allocs > 20 {
		t.Errorf("%.0f allocations to decode an ACK naming 600 clusters, want a few (not one per name)", allocs)
	}
}

// received decodes raw as a stream subscribed to set (of every type),
// raw in three pieces, as gRPC hands over a message read in several
// HTTP/2 frames.
func received(raw []byte, set nameSet) (*sotwRequest, error) {
	r := &sotwRequest{DiscoveryRequest: &discoveryv3.DiscoveryRequest{}, subscribed: func(string) nameSet { return set }}
	a, b := len(raw)/3, 2*len(raw)/3
	err := testCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw[:a]), mem.SliceBuffer(raw[a:b]), mem.SliceBuffer(raw[b:])}, r)
	return r, err
}

func TestARequestNamingWhatTheStreamIsSubscribedToIsDecodedWithoutItsNames(t *testing.T) {
	ack := sidecarACK(600)
	set := makeNameSet(ack.GetResourceNames())
	raw, err := proto.Marshal(ack)
	if err != nil {
		t.Fatal(err)
	}
	r, err := received(raw, set)
	if err != nil || !r.asSubscribed || len(r.GetResourceNames()) != 0 {
		t.Fatalf("decoded as subscribed: %v, %d names (%v); want true, none", r.asSubscribed, len(r.GetResourceNames()), err)
	}
	want := proto.CloneOf(ack)
	want.ResourceNames = nil
	if !proto.Equal(r.DiscoveryRequest, want) {
		t.Errorf("the other fields decoded as %v, want %v", r.DiscoveryRequest, want)
	}
	// What decoding allocates: the other fields, not a copy of the
	// message or of its names (those would be more than the message's
	// size). The bound leaves room for the pooled buffer the message is
	// read into being made anew now and then: the race detector has
	// sync.Pool drop a quarter of what it is given.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 100
	for range runs {
		_, _ = received(raw, set)
	}
	runtime.ReadMemStats(&after)
	if perRun := (after.TotalAlloc - before.TotalAlloc) / runs; perRun > uint64(len(raw)/2) {
		t.Errorf("decoding an ACK of %d bytes naming the 600 subscribed clusters allocates %d bytes, want half of it at most", len(raw), perRun)
	}
}

func TestARequestNamingAnythingElseIsDecodedWithItsNames(t *testing.T) {
	names := []string{"a", "b", "c"}
	set := makeNameSet(names)
	for _, tt := range []struct {
		name   string
		req    *discoveryv3.DiscoveryRequest
		stream nameSet
	}{
		{"fewer names", &discoveryv3.DiscoveryRequest{ResourceNames: names[:2]}, set},
		{"more names", &discoveryv3.DiscoveryRequest{ResourceNames: append(slices.Clone(names), "d")}, set},
		{"another order", &discoveryv3.DiscoveryRequest{ResourceNames: []string{"b", "a", "c"}}, set},
		{"the wildcard too", &discoveryv3.DiscoveryRequest{ResourceNames: append([]string{"*"}, names...)}, set},
		{"a stream subscribed to nothing", &discoveryv3.DiscoveryRequest{ResourceNames: names}, nameSet{}},
		{"no names", &discoveryv3.DiscoveryRequest{VersionInfo: "1"}, set},
	} {
		raw, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		r, err := received(raw, tt.stream)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if r.asSubscribed || !proto.Equal(r.DiscoveryRequest, tt.req) {
			t.Errorf("%s: decoded as subscribed: %v, as %v; want false, %v", tt.name, r.asSubscribed, r.DiscoveryRequest, tt.req)
		}
	}
}

func FuzzTheRequestDecoderAgreesWithProtobuf(f *testing.F) {
	ack := sidecarACKBytes(f, 2)
	f.Add(ack, true)
	f.Add([]byte{0x1a, 0x01, 0xff}, false)
	f.Fuzz(func(t *testing.T, raw []byte, subscribedToThem bool) {
		want := &discoveryv3.DiscoveryRequest{}
		wantErr := proto.Unmarshal(raw, want)
		got, err := unmarshalled(raw)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("decoder error %v, protobuf's %v", err, wantErr)
		}
		if err == nil && !proto.Equal(got, want) {
			t.Fatalf("decoded %v, protobuf decodes %v", got, want)
		}
		// As a stream subscribed to what protobuf reads there (or to
		// something else): the names are left out only when they are
		// exactly the subscription.
		set := makeNameSet([]string{"x"})
		if subscribedToThem && wantErr == nil {
			set = makeNameSet(want.GetResourceNames())
		}
		r, err := received(raw, set)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("as subscribed: decoder error %v, protobuf's %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if !r.asSubscribed {
			if !proto.Equal(r.DiscoveryRequest, want) {
				t.Fatalf("decoded %v, protobuf decodes %v", r.DiscoveryRequest, want)
			}
			return
		}
		if !slices.Equal(want.GetResourceNames(), set.list()) {
			t.Fatalf("decoded as subscribed to %v, protobuf reads names %v", set.list(), want.GetResourceNames())
		}
		want.ResourceNames = nil
		if !proto.Equal(r.DiscoveryRequest, want) {
			t.Fatalf("decoded %v, protobuf decodes %v (names left out)", r.DiscoveryRequest, want)
		}
	})
}
