package xdsproxy

import (
	"fmt"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// bulk answers every request with the same response.
type bulk struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	resp *discoveryv3.DiscoveryResponse
}

func (b bulk) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil //nolint:nilerr // the client went away
		}
		if err := s.Send(b.resp); err != nil {
			return err
		}
	}
}

// cdsOf is a CDS response of about size bytes: EDS clusters as discovery
// makes them.
func cdsOf(tb testing.TB, size int) *discoveryv3.DiscoveryResponse {
	tb.Helper()
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: resourcev3.ClusterType, VersionInfo: "1", Nonce: "n"}
	for i := 0; proto.Size(resp) < size; i++ {
		c := &clusterv3.Cluster{
			Name:                 fmt.Sprintf("outbound|8080||service-%05d.namespace-%03d.svc.cluster.local", i, i%100),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
				EdsConfig:   &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3},
				ServiceName: fmt.Sprintf("outbound|8080||service-%05d.namespace-%03d.svc.cluster.local", i, i%100),
			},
			LbPolicy: clusterv3.Cluster_LEAST_REQUEST,
		}
		a, err := anypb.New(c)
		if err != nil {
			tb.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

// BenchmarkRelayOf1MiBCDS: a request and its 1 MiB CDS response, to the
// stand-in discovery (mTLS on 127.0.0.1) directly and through the agent's
// proxy (Envoy's Unix socket → the agent → discovery); the difference of
// the two is what the proxy costs a response. Reports p50 and p99.
func BenchmarkRelayOf1MiBCDS(b *testing.B) {
	resp := cdsOf(b, 1<<20)
	p := newPodWith(b, bulk{resp: resp})
	p.give(b, "spiffe://cluster.local/ns/shop/sa/cart")
	direct, err := grpc.NewClient(p.upstream,
		grpc.WithTransportCredentials(credentials.NewTLS(p.state.ClientTLS("flotilla-discovery.istio-system.svc"))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)))
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	for _, c := range []struct {
		name   string
		client discoveryv3.AggregatedDiscoveryServiceClient
	}{
		{"direct", discoveryv3.NewAggregatedDiscoveryServiceClient(direct)},
		{"via-agent", p.envoy},
	} {
		b.Run(c.name, func(b *testing.B) {
			stream, err := c.client.StreamAggregatedResources(b.Context(), grpc.MaxCallRecvMsgSize(MaxMessageBytes))
			if err != nil {
				b.Fatal(err)
			}
			req := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local"}, TypeUrl: resourcev3.ClusterType}
			roundTrip := func() time.Duration {
				start := time.Now()
				if err := stream.Send(req); err != nil {
					b.Fatal(err)
				}
				got, err := stream.Recv()
				if err != nil {
					b.Fatal(err)
				}
				if len(got.GetResources()) != len(resp.GetResources()) {
					b.Fatalf("%d resources, want %d", len(got.GetResources()), len(resp.GetResources()))
				}
				return time.Since(start)
			}
			roundTrip() // the connection and stream are up
			took := make([]time.Duration, 0, b.N)
			b.SetBytes(int64(proto.Size(resp)))
			b.ResetTimer()
			for range b.N {
				took = append(took, roundTrip())
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
