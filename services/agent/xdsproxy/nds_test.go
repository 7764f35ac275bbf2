package xdsproxy

import (
	"context"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// ndsDiscovery answers every request with an empty response of its type,
// and the agent's first name table request with a table, then with a
// table that does not decode; it reports the name table requests it
// gets (type, version, nonce, error) on seen.
type ndsDiscovery struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	seen chan *discoveryv3.DiscoveryRequest
}

var testTable = &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
	"pg.example.com": {Ips: []string{"240.240.0.1"}, Registry: "External"},
}}

func (d ndsDiscovery) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		if req.GetTypeUrl() != xdstype.NameTableType {
			if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "envoy"}); err != nil {
				return err
			}
			continue
		}
		d.seen <- req
		var resp *discoveryv3.DiscoveryResponse
		switch req.GetResponseNonce() {
		case "":
			a, _ := anypb.New(testTable)
			resp = &discoveryv3.DiscoveryResponse{TypeUrl: xdstype.NameTableType, VersionInfo: "1", Nonce: "n1", Resources: []*anypb.Any{a}}
		case "n1":
			resp = &discoveryv3.DiscoveryResponse{TypeUrl: xdstype.NameTableType, VersionInfo: "2", Nonce: "n2", Resources: []*anypb.Any{{TypeUrl: xdstype.NameTableType, Value: []byte{0xff, 0xff}}}}
		default:
			continue
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

func (d ndsDiscovery) DeltaAggregatedResources(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		if req.GetTypeUrl() != xdstype.NameTableType {
			if err := s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "envoy"}); err != nil {
				return err
			}
			continue
		}
		d.seen <- &discoveryv3.DiscoveryRequest{TypeUrl: req.GetTypeUrl(), ResponseNonce: req.GetResponseNonce(), ErrorDetail: req.GetErrorDetail()}
		var resp *discoveryv3.DeltaDiscoveryResponse
		switch req.GetResponseNonce() {
		case "":
			a, _ := anypb.New(testTable)
			resp = &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.NameTableType, Nonce: "n1", Resources: []*discoveryv3.Resource{{Resource: a}}}
		case "n1":
			resp = &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.NameTableType, Nonce: "n2", Resources: []*discoveryv3.Resource{{Resource: &anypb.Any{TypeUrl: xdstype.NameTableType, Value: []byte{0xff, 0xff}}}}}
		default:
			continue
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

func TestTheAgentAsksForTheNameTableAfterEnvoysListenersAndAcknowledgesItItself(t *testing.T) {
	for _, delta := range []bool{false, true} {
		name := map[bool]string{false: "sotw", true: "delta"}[delta]
		t.Run(name, func(t *testing.T) {
			d := ndsDiscovery{seen: make(chan *discoveryv3.DiscoveryRequest, 10)}
			tables := make(chan *ndsv1.NameTable, 10)
			p := newPodWith(t, d, func(o *Options) { o.NameTable = func(nt *ndsv1.NameTable) { tables <- nt } })
			p.give(t, "spiffe://cluster.local/ns/shop/sa/cart")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			// Envoy's stream: clusters, then listeners.
			var send func(typeURL string) error
			var recv func() (string, error)
			if delta {
				s, err := p.envoy.DeltaAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				send = func(u string) error { return s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: u}) }
				recv = func() (string, error) { r, err := s.Recv(); return r.GetTypeUrl(), err }
			} else {
				s, err := p.envoy.StreamAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				send = func(u string) error { return s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: u}) }
				recv = func() (string, error) { r, err := s.Recv(); return r.GetTypeUrl(), err }
			}
			for _, u := range []string{resourcev3.ClusterType, resourcev3.ListenerType, resourcev3.ListenerType, resourcev3.RouteType} {
				if err := send(u); err != nil {
					t.Fatal(err)
				}
				// Envoy gets its own types only: the name table responses
				// between them are the agent's.
				if got, err := recv(); err != nil || got != u {
					t.Fatalf("Envoy got %q, %v; want %q", got, err, u)
				}
			}
			var got []*discoveryv3.DiscoveryRequest
			for len(got) < 3 {
				select {
				case r := <-d.seen:
					got = append(got, r)
				case <-ctx.Done():
					t.Fatalf("discovery saw name table requests %v, want 3", got)
				}
			}
			// The request (once, for the stream), the ACK, the NACK.
			if got[0].GetResponseNonce() != "" || got[0].GetErrorDetail() != nil {
				t.Errorf("first: %v, want a request without nonce", got[0])
			}
			if got[1].GetResponseNonce() != "n1" || got[1].GetErrorDetail() != nil || (!delta && got[1].GetVersionInfo() != "1") {
				t.Errorf("second: %v, want the ACK of n1", got[1])
			}
			if got[2].GetResponseNonce() != "n2" || got[2].GetErrorDetail() == nil || (!delta && got[2].GetVersionInfo() != "2") {
				t.Errorf("third: %v, want the NACK of n2", got[2])
			}
			select {
			case nt := <-tables:
				if !proto.Equal(nt, testTable) {
					t.Errorf("the DNS proxy got %v, want %v", nt, testTable)
				}
			case <-ctx.Done():
				t.Fatal("the DNS proxy got no table")
			}
			select {
			case nt := <-tables:
				t.Errorf("the table that does not decode reached the DNS proxy: %v", nt)
			case r := <-d.seen:
				t.Errorf("a fourth name table request: %v", r)
			default:
			}
		})
	}
}

func TestWithoutADNSProxyTheNameTableIsNeitherAskedNorTaken(t *testing.T) {
	d := ndsDiscovery{seen: make(chan *discoveryv3.DiscoveryRequest, 10)}
	p := newPodWith(t, d)
	p.give(t, "spiffe://cluster.local/ns/shop/sa/cart")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := p.envoy.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Envoy's own listener request, then a name table request of its own
	// (an application's xDS client may ask): it reaches discovery, and the
	// answer reaches the client.
	for _, u := range []string{resourcev3.ListenerType, xdstype.NameTableType} {
		if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: u}); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil || r.GetTypeUrl() != u {
			t.Fatalf("got %v, %v; want %s", r, err, u)
		}
	}
	if r := <-d.seen; r.GetResponseNonce() != "" {
		t.Errorf("discovery saw %v, the client's own request", r)
	}
	select {
	case r := <-d.seen:
		t.Errorf("discovery saw a second name table request %v", r)
	default:
	}
}
