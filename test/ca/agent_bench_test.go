package ca_test

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// BenchmarkAgentMemory measures the agents' resident memory, with ca,
// galley and discovery as processes: the sidecar agent (a stand-in Envoy)
// holding its certificate, then with Envoy's SDS stream (both secrets) and an ADS
// stream relayed to discovery, opened anew (clusters and listeners) every
// 100 ms for 5 s;
// and a proxyless agent once ready and with its application's xDS stream
// (grpc-go's client) open. Run it with -benchtime=1x.
func BenchmarkAgentMemory(b *testing.B) {
	for range b.N {
		s := proc.NewSigner(b)
		c := startCA(b, b.TempDir(), s)
		secureXDS, greeterAddr, _ := greeterMesh(b, c, s)

		p := startAgent(b, c, s, secureXDS, "cart")
		// Idle: the certificate held, Envoy (the stand-in) started, no
		// stream open yet.
		p.agent.Out.WaitFor(b, "certificate from ca")
		time.Sleep(2 * time.Second)
		idle, idleAnon := rss(b, p.agent), anon(b, p.agent)

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		sds := p.secrets(b, ctx, "default", "ROOTCA")
		workloadSecret(b, sds)
		xds := discoveryv3.NewAggregatedDiscoveryServiceClient(unixConn(b, p.xds))
		md, _ := structpb.NewStruct(map[string]any{"SERVICE_ACCOUNT": "cart"})
		node := &corev3.Node{Id: "sidecar~127.0.0.1~cart-1.shop~shop.svc.cluster.local", Metadata: md}
		var peak, peakAnon float64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			// Envoy reconnecting: a new stream replaces the last and gets
			// clusters and listeners anew.
			sctx, scancel := context.WithCancel(ctx)
			ads, err := xds.StreamAggregatedResources(sctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, t := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
				if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: t}); err != nil {
					b.Fatal(err)
				}
				if _, err := ads.Recv(); err != nil {
					b.Fatal(err)
				}
			}
			peak, peakAnon = max(peak, rss(b, p.agent)), max(peakAnon, anon(b, p.agent))
			scancel()
			time.Sleep(100 * time.Millisecond)
		}
		cancel()

		server := startProxylessAgent(b, c, s, secureXDS, "greeter-v1-1", "greeter-v1", `{"app": "greeter", "version": "v1"}`)
		time.Sleep(2 * time.Second)
		proxylessIdle, proxylessIdleAnon := rss(b, server.agent), anon(b, server.agent)
		client := startProxylessAgent(b, c, s, secureXDS, "client-1", "demo-client", `{"app": "client"}`)
		startGreeter(b, server, greeterAddr)
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		c1 := client.xdsClient(b, "xds:///greeter.demo.svc.cluster.local:50051")
		for range 100 {
			if _, _, _, err := call(cctx, c1); err != nil {
				b.Fatal(err)
			}
		}
		ccancel()
		proxylessActive := max(rss(b, server.agent), rss(b, client.agent))
		proxylessActiveAnon := max(anon(b, server.agent), anon(b, client.agent))

		b.ReportMetric(idle, "sidecar-idle-RSS-MiB")
		b.ReportMetric(peak, "sidecar-active-RSS-MiB")
		b.ReportMetric(proxylessIdle, "proxyless-idle-RSS-MiB")
		b.ReportMetric(proxylessActive, "proxyless-active-RSS-MiB")
		b.ReportMetric(idleAnon, "sidecar-idle-anon-MiB")
		b.ReportMetric(peakAnon, "sidecar-active-anon-MiB")
		b.ReportMetric(proxylessIdleAnon, "proxyless-idle-anon-MiB")
		b.ReportMetric(proxylessActiveAnon, "proxyless-active-anon-MiB")
	}
}

func rss(tb testing.TB, p *proc.Process) float64 {
	tb.Helper()
	v, err := proc.RSSMiB(p.Pid())
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func anon(tb testing.TB, p *proc.Process) float64 {
	tb.Helper()
	v, err := proc.AnonMiB(p.Pid())
	if err != nil {
		tb.Fatal(err)
	}
	return v
}
