package xds_test

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// BenchmarkPushLatencyWithNeverReadingProxies: 600 services; each
// iteration adds one and pushes, and times until a healthy sidecar's
// stream receives its clusters, with 0, 5 and 50 sidecars attached that
// never read (64 KiB windows, far less than their clusters). Reports p50
// and p99; the target is no change beyond noise.
func BenchmarkPushLatencyWithNeverReadingProxies(b *testing.B) {
	for _, stuck := range []int{0, 5, 50} {
		b.Run(fmt.Sprintf("never-reading=%d", stuck), func(b *testing.B) {
			srv, err := xds.New(xds.Options{Log: quiet(), Meter: sdkmetric.NewMeterProvider().Meter("bench")})
			if err != nil {
				b.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			gs := grpc.NewServer()
			srv.Register(gs)
			go func() { _ = gs.Serve(lis) }()
			defer gs.Stop()
			store := model.NewStore()
			var last *model.PushContext
			version := uint64(0)
			push := func() {
				version++
				pc, cs := store.Build(model.BuildOptions{}, last, version)
				last = pc
				srv.Push(pc, cs, time.Now())
			}
			for i := range 600 {
				store.PutService(service(fmt.Sprintf("svc-%03d", i), 8080))
			}
			push()
			open := func(id string, window int32) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
				opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
				if window > 0 {
					opts = append(opts, grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window))
				}
				cc, err := grpc.NewClient(lis.Addr().String(), opts...)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { cc.Close() })
				st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(b.Context())
				if err != nil {
					b.Fatal(err)
				}
				if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node(id, nil), TypeUrl: resourcev3.ClusterType}); err != nil {
					b.Fatal(err)
				}
				return st
			}
			for i := range stuck {
				open(fmt.Sprintf("sidecar~10.1.%d.%d~stuck-%d.default~default.svc.cluster.local", i/250, i%250+1, i), 64<<10)
			}
			healthy := open("sidecar~10.0.0.2~ok.default~default.svc.cluster.local", 0)
			ack := func() {
				resp, err := healthy.Recv()
				if err != nil {
					b.Fatal(err)
				}
				if err := healthy.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
					b.Fatal(err)
				}
			}
			ack()
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				store.PutService(service(fmt.Sprintf("new-%06d", i), 8080))
				start := time.Now()
				push()
				ack()
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
