package xds_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
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
			gs := grpc.NewServer(xds.ServerOption())
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
				srv.Push(context.Background(), pc, cs, time.Now())
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

// BenchmarkSynczOfTwoReplicasWith2000Proxies is what flotilla
// proxy-status costs (issue 17's benchmark): two replicas with 1,000
// proxies each (sidecars watching clusters and listeners, acknowledged),
// both asked for syncz at once over loopback, as the CLI asks. Reports
// the time per proxy-status and the bytes of the answers per proxy.
func BenchmarkSynczOfTwoReplicasWith2000Proxies(b *testing.B) {
	const perReplica = 1000
	var conns []*grpc.ClientConn
	var wire wireBytes
	for r := range 2 {
		h := newHarnessWith(b, xds.Options{PlaintextDebug: true, Replica: debugapiReplica(r)})
		debugConn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(&wire),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = debugConn.Close() })
		for i := range 20 {
			h.store.PutService(service(fmt.Sprintf("svc-%02d", i), 8080))
		}
		h.push()
		ctx := b.Context()
		for i := range perReplica {
			st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(h.conn).StreamAggregatedResources(ctx)
			if err != nil {
				b.Fatal(err)
			}
			id := fmt.Sprintf("sidecar~10.%d.%d.%d~app-%d.default~default.svc.cluster.local", r, i/250, i%250, i)
			for _, t := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
				req := &discoveryv3.DiscoveryRequest{TypeUrl: t}
				if t == resourcev3.ClusterType {
					req.Node = node(id, map[string]any{"ISTIO_VERSION": "1.27.3"})
				}
				if err := st.Send(req); err != nil {
					b.Fatal(err)
				}
				resp, err := st.Recv()
				if err != nil {
					b.Fatal(err)
				}
				if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: t, ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}); err != nil {
					b.Fatal(err)
				}
			}
		}
		conns = append(conns, debugConn)
	}
	ctx := b.Context()
	bytes := 0
	b.ResetTimer()
	wire.n.Store(0)
	for range b.N {
		bytes = 0
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, cc := range conns {
			wg.Go(func() {
				resp, err := debugapi.Fetch(ctx, cc, debugapi.Syncz)
				if err != nil {
					b.Error(err)
					return
				}
				if len(resp.GetResources()) != perReplica {
					b.Errorf("%d proxies", len(resp.GetResources()))
				}
				mu.Lock()
				bytes += proto.Size(resp)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(bytes)/(2*perReplica), "bytes/proxy")
	b.ReportMetric(float64(wire.n.Load())/float64(b.N)/(2*perReplica), "wire-bytes/proxy")
}

// wireBytes counts what a client received on the wire (compressed).
type wireBytes struct{ n atomic.Int64 }

func (w *wireBytes) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (w *wireBytes) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (w *wireBytes) HandleConn(context.Context, stats.ConnStats)                       {}
func (w *wireBytes) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InPayload); ok {
		w.n.Add(int64(in.WireLength))
	}
}

func debugapiReplica(i int) debugapi.Replica {
	return debugapi.NewReplica("flotilla-discovery", fmt.Sprintf("discovery-%d", i), "bench")
}
