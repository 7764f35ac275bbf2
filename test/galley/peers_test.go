package galley_test

import (
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestASubscriberNackingInALoopIsLoggedOnceAndSlowedDown: an MCP
// subscriber rejecting the same response again and again, with a 4,000
// character reason, for 5 s: galley logs it once, serves it at a bounded
// rate, and another subscriber still gets an edit.
func TestASubscriberNackingInALoopIsLoggedOnceAndSlowedDown(t *testing.T) {
	dir := t.TempDir()
	routes := dir + "/routes.yaml"
	writeFile(t, routes, greeterVS(80, 20))
	mcpAddr := freeAddr(t)
	g := startGalleyWith(t, freeAddr(t), "--config-dir", dir, "--mcp-address", mcpAddr)
	healthy := subscribe(t, mcpAddr)
	healthy.waitFor(t, "the routes", func() bool { return healthy.weights("default/greeter") == "80/20" })

	st := dialDelta(t, mcpAddr)
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "nacker"}, TypeUrl: vsType()}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	nack := &discoveryv3.DeltaDiscoveryRequest{
		TypeUrl: vsType(), ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: strings.Repeat("not to my liking ", 240)},
	}
	sent := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); sent++ {
		if err := st.Send(nack); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, routes, greeterVS(50, 50))
	healthy.waitFor(t, "the edit during the NACK loop", func() bool { return healthy.weights("default/greeter") == "50/50" })
	g.out.WaitFor(t, "subscriber rejected a response")
	if n := g.out.Count("subscriber rejected a response"); n != 1 {
		t.Fatalf("%d NACK log lines for %d NACKs of one response, want 1", n, sent)
	}
	if n := len(g.out.String()); n > 64<<10 {
		t.Fatalf("galley logged %d bytes during the NACK loop", n)
	}
	t.Logf("%d NACKs sent in 5 s", sent)
}

// TestASubscriberRequestOverTheLimitIsRefused: node metadata of 5 MiB (an
// xDS proxy may send 4 at most, and so may an MCP subscriber now: one
// limit for both) ends the stream with ResourceExhausted.
func TestASubscriberRequestOverTheLimitIsRefused(t *testing.T) {
	mcpAddr := freeAddr(t)
	startGalleyWith(t, freeAddr(t), "--config-dir", t.TempDir(), "--mcp-address", mcpAddr)
	st := dialDelta(t, mcpAddr, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	md, err := structpb.NewStruct(map[string]any{"padding": strings.Repeat("x", 5<<20)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "big", Metadata: md}, TypeUrl: vsType()}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 5 MiB request: %v, want ResourceExhausted", err)
	}
}

// dialDelta opens a raw delta stream to galley (over a connection with
// opts), closed when the test ends.
func dialDelta(t *testing.T, addr string, opts ...grpc.DialOption) discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}
