package kubesource

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/publish"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// counter is a subscriber that counts endpoint sets received.
type counter struct {
	sets atomic.Int64
}

func (c *counter) Apply(typeURL string, updated []*mcp.Resource, _ []string) error {
	if typeURL == registry.EndpointSetTypeURL {
		c.sets.Add(int64(len(updated)))
	}
	return nil
}

func slice(svc, ns string, gen, endpoints int) *discoveryv1.EndpointSlice {
	ready := true
	port, name := int32(8080), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}
	for i := range endpoints {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", gen, i, len(svc))},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("%s-%d", svc, i), Namespace: ns},
		})
	}
	return s
}

// BenchmarkFanOut10kEndpointsTo4Subscribers measures galley's own path for
// a burst of endpoint churn: 1,000 services with 10 endpoints each all
// change (10,000 endpoint changes), delivered as informer events to the
// Kubernetes source, normalised, published, and streamed over delta
// MCP-over-gRPC on 127.0.0.1 to 4 subscribers, until every subscriber has
// received (and ACKed) every changed EndpointSet. The apiserver is left out:
// its write and watch latency is not galley's.
func BenchmarkFanOut10kEndpointsTo4Subscribers(b *testing.B) {
	const services, perService, subscribers = 1000, 10, 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := mcp.NewServer(ctx, slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("b"), publish.Collections())
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	src := New(Options{Log: slog.New(slog.DiscardHandler), DomainSuffix: "cluster.local"}, publish.New(srv), srv)
	go src.flushLoop(ctx) // Run would start it with the informers
	handler := src.sliceHandler()
	gen := 0
	churn := func() {
		gen++
		for i := range services {
			handler.OnUpdate(nil, slice(fmt.Sprintf("svc-%04d", i), "bench", gen, perService))
		}
	}
	churn() // the initial state

	var subs []*counter
	var wg sync.WaitGroup
	for i := range subscribers {
		c := &counter{}
		subs = append(subs, c)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		client, err := mcp.NewClient(mcp.ClientOptions{
			Conn: conn, NodeID: fmt.Sprintf("discovery-%d", i), Handler: c, Log: slog.New(slog.DiscardHandler),
			TypeURLs: []string{registry.ServiceTypeURL, registry.EndpointSetTypeURL},
		})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = client.Run(ctx)
		}()
	}
	waitAll := func(want int64) {
		deadline := time.Now().Add(60 * time.Second)
		for _, s := range subs {
			for s.sets.Load() < want {
				if time.Now().After(deadline) {
					b.Fatalf("subscriber has %d of %d endpoint sets", s.sets.Load(), want)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	waitAll(services)

	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		churn()
		waitAll(int64(services * (i + 2)))
	}
	b.StopTimer()
	cancel()
	wg.Wait()
}
