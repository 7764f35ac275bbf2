package xdsproxy

import (
	"fmt"
	"sync/atomic"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// nameTables is one stream's name table subscription, the agent's own on
// Envoy's stream, as Istio's agent's (XdsProxy handlers[NameTableType]):
// it asks for the table after Envoy's first listener request, takes the
// responses of the type before they reach Envoy (which does not know the
// type), gives their table to the DNS proxy and acknowledges them
// itself — or NACKs a table that does not decode.
type nameTables struct {
	update func(*ndsv1.NameTable)
	delta  bool
	asked  atomic.Bool
}

// request is the agent's first request for the table, when req is
// Envoy's first listener request on the stream; nil otherwise.
func (n *nameTables) request(req *frame) *frame {
	if n.asked.Load() {
		return nil
	}
	field := requestTypeURL
	if n.delta {
		field = deltaRequestTypeURL
	}
	if typeURL, _ := peekString(req.data, field); typeURL != resourcev3.ListenerType {
		return nil
	}
	if n.asked.Swap(true) {
		return nil
	}
	var msg proto.Message = &discoveryv3.DiscoveryRequest{TypeUrl: xdstype.NameTableType}
	if n.delta {
		msg = &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.NameTableType}
	}
	b, err := proto.Marshal(msg)
	if err != nil { // a fixed message: cannot fail
		return nil
	}
	return &frame{data: b}
}

// take handles resp when it is a name table response, and returns the
// acknowledgement to send upstream; ok is false for every other type.
func (n *nameTables) take(resp *frame) (ack *frame, ok bool) {
	if typeURL, _ := peekString(resp.data, responseTypeURL); typeURL != xdstype.NameTableType {
		return nil, false
	}
	var version, nonce string
	var table []byte
	var err error
	if n.delta {
		var r discoveryv3.DeltaDiscoveryResponse
		if err = proto.Unmarshal(resp.data, &r); err == nil {
			nonce = r.GetNonce()
			if rs := r.GetResources(); len(rs) > 0 {
				table = rs[0].GetResource().GetValue()
			}
		}
	} else {
		var r discoveryv3.DiscoveryResponse
		if err = proto.Unmarshal(resp.data, &r); err == nil {
			version, nonce = r.GetVersionInfo(), r.GetNonce()
			if rs := r.GetResources(); len(rs) > 0 {
				table = rs[0].GetValue()
			}
		}
	}
	// An empty response changes nothing (Istio's: the type is a
	// singleton); one that does not decode is refused.
	if err == nil && table != nil {
		var nt ndsv1.NameTable
		if err = proto.Unmarshal(table, &nt); err == nil {
			n.update(&nt)
		}
	}
	var detail *statuspb.Status
	if err != nil {
		detail = &statuspb.Status{Code: int32(codes.Internal), Message: fmt.Sprintf("name table: %v", err)}
	}
	var msg proto.Message = &discoveryv3.DiscoveryRequest{VersionInfo: version, TypeUrl: xdstype.NameTableType, ResponseNonce: nonce, ErrorDetail: detail}
	if n.delta {
		msg = &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.NameTableType, ResponseNonce: nonce, ErrorDetail: detail}
	}
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, true
	}
	return &frame{data: b}, true
}
