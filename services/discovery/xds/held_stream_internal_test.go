package xds

import (
	"cmp"
	"context"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// What streams hold is seen from inside: the server's state, after real
// streams over gRPC were sent their resources and acknowledged them.
func TestSidecarsOfOneScopeHoldOneCopyOfWhatTheyWereSent(t *testing.T) {
	srv, err := New(Options{Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(ServerOption())
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })

	store := model.NewStore()
	for _, name := range []string{"a", "b", "c"} {
		host := name + ".default.svc.cluster.local"
		store.PutService(&registryv1.Service{
			Hostname: host, Name: name, Namespace: "default", Addresses: []string{"10.96.0.1"},
			Ports:      []*registryv1.ServicePort{{Name: "http", Number: 80, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
		})
		store.PutEndpointSet(&registryv1.EndpointSet{
			ServiceHostname: host, ServiceNamespace: "default", Shard: "0",
			Endpoints: []*registryv1.Endpoint{{Address: "10.1.0.1", Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 8080}}}},
		})
	}
	pc, cs := store.Build(model.BuildOptions{}, nil, 1)
	srv.Push(context.Background(), pc, cs, time.Now())

	// Two sidecars of one namespace, neither at an endpoint's address:
	// each is sent the same clusters and load assignments.
	for _, ip := range []string{"10.2.0.1", "10.2.0.2"} {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := &corev3.Node{Id: "sidecar~" + ip + "~app-" + ip + ".default~default.svc.cluster.local"}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
		cds, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var eds []string
		for _, r := range cds.GetResources() {
			var c clusterv3.Cluster
			if err := r.UnmarshalTo(&c); err != nil {
				t.Fatal(err)
			}
			if c.GetType() == clusterv3.Cluster_EDS {
				eds = append(eds, cmp.Or(c.GetEdsClusterConfig().GetServiceName(), c.GetName()))
			}
		}
		if len(eds) == 0 {
			t.Fatal("no EDS clusters")
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: eds}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}

	held := map[string][]heldSet{}
	deadline := time.Now().Add(10 * time.Second)
	for len(held[resourcev3.EndpointType]) < 2 && time.Now().Before(deadline) {
		clear(held)
		for _, c := range srv.Conns() {
			c.mu.Lock()
			for t, w := range c.watches {
				if w.held.len() > 0 {
					held[t] = append(held[t], w.held)
				}
			}
			c.mu.Unlock()
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.EndpointType} {
		h := held[typ]
		if len(h) != 2 {
			t.Fatalf("%s: %d streams hold some, want 2", typ, len(h))
		}
		if h[0].len() != h[1].len() || !slices.EqualFunc(h[0].chunks, h[1].chunks, func(a, b []*nameVersion) bool { return &a[0] == &b[0] }) {
			t.Errorf("%s: the two sidecars hold %d and %d resources in two copies, want one shared", typ, h[0].len(), h[1].len())
		}
	}
}
