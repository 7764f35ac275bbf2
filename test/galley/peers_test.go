package galley_test

import (
	"fmt"
	"io"
	"net/http"
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

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestASubscriberNackingInALoopIsLoggedOnceAndSlowedDown: an MCP
// subscriber rejects galley's response and goes on sending NACKs for 5 s,
// with a 1,000 character reason, either of that response again and again
// or each with a nonce of its own making (each was once a fresh log
// line): galley logs one line, for the response it sent, serves the loop
// at a bounded rate, and another subscriber still gets an edit.
func TestASubscriberNackingInALoopIsLoggedOnceAndSlowedDown(t *testing.T) {
	for name, nonce := range map[string]func(sent string, i int) string{
		"the same response": func(sent string, _ int) string { return sent },
		"a made-up nonce each": func(sent string, i int) string {
			if i == 0 {
				return sent // the response galley sent, then nonces it never did
			}
			return fmt.Sprintf("made-up-%d", i)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			routes := dir + "/routes.yaml"
			writeFile(t, routes, greeterVS(80, 20))
			mcpAddr := proc.FreeAddr(t)
			g := startGalleyWith(t, proc.FreeAddr(t), "--config-dir", dir, "--mcp-address", mcpAddr)
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
			reason := strings.Repeat("not to my liking ", 60)
			sent := 0
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); sent++ {
				if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{
					TypeUrl: vsType(), ResponseNonce: nonce(resp.GetNonce(), sent), ErrorDetail: &status.Status{Code: 3, Message: reason},
				}); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, routes, greeterVS(50, 50))
			healthy.waitFor(t, "the edit during the NACK loop", func() bool { return healthy.weights("default/greeter") == "50/50" })
			g.out.WaitFor(t, "subscriber rejected a response")
			if n := g.out.Count("subscriber rejected a response"); n != 1 {
				t.Fatalf("%d NACK log lines for %d NACKs, want 1", n, sent)
			}
			if n := len(g.out.String()); n > 64<<10 {
				t.Fatalf("galley logged %d bytes during the NACK loop", n)
			}
			t.Logf("%d NACKs sent in 5 s", sent)
		})
	}
}

// TestASubscriptionIsBoundedByNamesAndBytesAndUnknownUnsubscribesBuyNothing:
// a delta subscriber that subscribes 2,000 names and unsubscribes 2,000 it
// never subscribed, request after request, is refused once it holds
// 10,000 (they once bought it credit, to twice the cap); one subscribing
// 1,100 names of 1 KB is refused for their bytes; galley keeps serving.
func TestASubscriptionIsBoundedByNamesAndBytesAndUnknownUnsubscribesBuyNothing(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir+"/routes.yaml", greeterVS(80, 20))
	mcpAddr := proc.FreeAddr(t)
	startGalleyWith(t, proc.FreeAddr(t), "--config-dir", dir, "--mcp-address", mcpAddr)
	names := func(prefix string, from, n, size int) []string {
		out := make([]string, n)
		for i := range out {
			name := fmt.Sprintf("%s-%07d", prefix, from+i)
			out[i] = name + strings.Repeat("x", max(0, size-len(name)))
		}
		return out
	}
	endsWith := func(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) error {
		for {
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
	}
	st := dialDelta(t, mcpAddr)
	for i := range 100 {
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{
			Node: &corev3.Node{Id: "credit"}, TypeUrl: vsType(),
			ResourceNamesSubscribe:   names("default/vs", i*2_000, 2_000, 0),
			ResourceNamesUnsubscribe: names("default/unknown", i*2_000, 2_000, 0),
		}); err != nil {
			break // refused
		}
	}
	if err := endsWith(st); grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than 10000 names") {
		t.Fatalf("subscribing 2,000 names and unsubscribing 2,000 unknown ones per request: %v, want ResourceExhausted", err)
	}
	st = dialDelta(t, mcpAddr)
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{
		Node: &corev3.Node{Id: "long"}, TypeUrl: vsType(), ResourceNamesSubscribe: names("default/vs", 0, 1_100, 1_000),
	}); err != nil {
		t.Fatal(err)
	}
	if err := endsWith(st); grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "bytes of names") {
		t.Fatalf("1,100 names of 1 KB: %v, want ResourceExhausted", err)
	}
	healthy := subscribe(t, mcpAddr)
	healthy.waitFor(t, "the routes", func() bool { return healthy.weights("default/greeter") == "80/20" })
}

// TestCollectionsNotPublishedShareOneMetricSeries: 300 made-up collection
// type URLs asked of galley over five streams (64 each at most) leave one
// metric series for all of them, "other", not 300.
func TestCollectionsNotPublishedShareOneMetricSeries(t *testing.T) {
	mcpAddr, adminAddr := proc.FreeAddr(t), proc.FreeAddr(t)
	startGalleyWith(t, adminAddr, "--config-dir", t.TempDir(), "--mcp-address", mcpAddr)
	for s := range 5 {
		st := dialDelta(t, mcpAddr)
		for i := range 60 {
			if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "typo"}, TypeUrl: fmt.Sprintf("made.up/Kind%d-%d", s, i)}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil { // the empty collection
				t.Fatal(err)
			}
		}
	}
	resp, err := http.Get("http://" + adminAddr + "/metrics") //nolint:noctx // a single loopback read
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var other bool
	for line := range strings.Lines(string(body)) {
		if strings.Contains(line, "made.up") {
			t.Fatalf("a made-up collection has its own series: %s", line)
		}
		other = other || strings.HasPrefix(line, "flotilla_mcp_server_responses") && strings.Contains(line, `type_url="other"`)
	}
	if !other {
		t.Fatalf("no responses series labelled other in:\n%s", body)
	}
}

// TestASubscriberRequestOverTheLimitIsRefused: node metadata of 5 MiB (an
// xDS proxy may send 4 at most, and so may an MCP subscriber now: one
// limit for both) ends the stream with ResourceExhausted.
func TestASubscriberRequestOverTheLimitIsRefused(t *testing.T) {
	mcpAddr := proc.FreeAddr(t)
	startGalleyWith(t, proc.FreeAddr(t), "--config-dir", t.TempDir(), "--mcp-address", mcpAddr)
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
