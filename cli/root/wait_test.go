package root

import (
	"net"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// debugReplica is a discovery replica's debug stream on loopback: it
// answers every request with d, or, hung (a paused process), never.
type debugReplica struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	d    *debugapi.ObjectDistribution
	hung bool
}

func (r *debugReplica) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went
		}
		if r.hung {
			<-s.Context().Done()
			return nil
		}
		st, err := r.d.Struct()
		if err != nil {
			return err
		}
		a, err := anypb.New(st)
		if err != nil {
			return err
		}
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Resources: []*anypb.Any{a}}); err != nil {
			return err
		}
	}
}

func serveDebug(t *testing.T, r *debugReplica) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// A replica that hangs (paused, say) does not hide the others' answers:
// the wait names it, and counts the proxies of those that answered —
// not "held by 0 of 0 proxies" with nothing behind.
func TestWaitNamesAHungReplicaAndCountsTheOthersProxies(t *testing.T) {
	good := serveDebug(t, &debugReplica{d: &debugapi.ObjectDistribution{
		Object: "VirtualService/default/reviews", Push: 3,
		History: []debugapi.ObjectVersion{{Version: "2", Push: 2}},
		Proxies: []debugapi.ProxyPush{{ID: "sidecar~10.0.0.1~a.default~default.svc.cluster.local", Namespace: "default", Push: 3}},
	}})
	hung := serveDebug(t, &debugReplica{hung: true})
	code, _, errOut := run("wait", "VirtualService", "reviews.default", "--resource-version", "2",
		"--context-file", "", "--discovery-address", good+","+hung, "--plaintext", "--timeout", "8s")
	if code == 0 {
		t.Fatal("the wait succeeded with a replica that never answered")
	}
	for _, want := range []string{"is held by 1 of 1 proxies; behind:", "replica " + hung + ": it did not answer"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the wait says\n%s\nwithout %q", errOut, want)
		}
	}
}
