package xdsproxy

import (
	"context"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// recordingDiscovery reports every request it gets, in order, and
// answers each but the health reports with an empty response of its type.
type recordingDiscovery struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	seen chan *discoveryv3.DiscoveryRequest
}

func (d recordingDiscovery) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		d.seen <- req
		if req.GetTypeUrl() != xdstype.HealthInfoType {
			if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "n"}); err != nil {
				return err
			}
		}
	}
}

func (d recordingDiscovery) DeltaAggregatedResources(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		d.seen <- &discoveryv3.DiscoveryRequest{TypeUrl: req.GetTypeUrl(), ErrorDetail: req.GetErrorDetail()}
		if req.GetTypeUrl() != xdstype.HealthInfoType {
			if err := s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "n"}); err != nil {
				return err
			}
		}
	}
}

func TestTheWorkloadsHealthGoesUpEachStreamAfterEnvoysFirstRequestAndOnEachChange(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			d := recordingDiscovery{seen: make(chan *discoveryv3.DiscoveryRequest, 20)}
			p := newPodWith(t, d)
			p.give(t, "spiffe://cluster.local/ns/vm/sa/legacy")
			next := func(wantType string) *discoveryv3.DiscoveryRequest {
				t.Helper()
				select {
				case req := <-d.seen:
					if req.GetTypeUrl() != wantType {
						t.Fatalf("discovery got %s, want %s", req.GetTypeUrl(), wantType)
					}
					return req
				case <-time.After(20 * time.Second):
					t.Fatalf("discovery got nothing, want %s", wantType)
					return nil
				}
			}
			// openStream is Envoy's stream, asking for clusters; it ends
			// with the returned cancel.
			openStream := func() context.CancelFunc {
				t.Helper()
				ctx, cancel := context.WithCancel(context.Background())
				var err error
				if delta {
					var s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
					if s, err = p.envoy.DeltaAggregatedResources(ctx); err == nil {
						err = s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
					}
				} else {
					var s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
					if s, err = p.envoy.StreamAggregatedResources(ctx); err == nil {
						err = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				return cancel
			}
			// Known before Envoy connects: sent after its first request.
			p.proxy.ReportHealth(false, "dial tcp 10.9.0.5:8080: connection refused")
			end := openStream()
			next(resourcev3.ClusterType)
			if req := next(xdstype.HealthInfoType); req.GetErrorDetail().GetMessage() != "dial tcp 10.9.0.5:8080: connection refused" {
				t.Fatalf("the first report: %v, want unhealthy with the probe's error", req)
			}
			p.proxy.ReportHealth(true, "")
			if req := next(xdstype.HealthInfoType); req.GetErrorDetail() != nil {
				t.Fatalf("the change: %v, want healthy (no error detail)", req)
			}
			end()
			// A new stream (Envoy reconnecting, or the connection to
			// discovery lost) carries the latest, once.
			end = openStream()
			defer end()
			next(resourcev3.ClusterType)
			if req := next(xdstype.HealthInfoType); req.GetErrorDetail() != nil {
				t.Fatalf("on the new stream: %v, want the latest report, healthy", req)
			}
			p.proxy.ReportHealth(false, "503")
			if req := next(xdstype.HealthInfoType); req.GetErrorDetail().GetMessage() != "503" {
				t.Fatalf("after the new stream: %v", req)
			}
		})
	}
}
