package client

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
)

func TestSplit(t *testing.T) {
	for want, counts := range map[string]map[string]int{
		"split: no answers":                                  {},
		"split: v1 80% (40) · v2 20% (10)":                   {"v2": 10, "v1": 40},
		"split: v2 100% (50)":                                {"v2": 50},
		"split: v1 33% (1) · v2 33% (1) · error 33% (1)":     {"error": 1, "v1": 1, "v2": 1},
		"split: v1 25% (1) · denied 50% (2) · error 25% (1)": {"error": 1, "denied": 2, "v1": 1},
	} {
		if got := Split(counts); got != want {
			t.Errorf("Split(%v) = %q, want %q", counts, got, want)
		}
	}
}

func TestRunNeedsABootstrap(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP", "")
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "")
	if err := Run(t.Context(), Options{Target: "xds:///x", Rate: 1, Interval: 1, Timeout: 1}); err == nil {
		t.Fatal("ran without a bootstrap")
	}
}

type greeter struct {
	testgrpc.UnimplementedTestServiceServer
}

func (greeter) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: "v1"}, nil
}

// TestTheFirstSplitIsOfRoutedCalls starts the client before any server
// answers at its target, as make run starts it beside a control plane
// that is still starting: nothing is printed until a call is routed, and
// the first split printed is of answers, not "error 100%".
func TestTheFirstSplitIsOfRoutedCalls(t *testing.T) {
	t.Setenv("GRPC_XDS_BOOTSTRAP_CONFIG", `{"xds_servers":[{"server_uri":"127.0.0.1:1","channel_creds":[{"type":"insecure"}]}],"node":{"id":"sidecar~127.0.0.1~client.demo~demo.svc.cluster.local"}}`)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there yet
	var out testenv.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Target: "passthrough:///" + addr, Rate: 20, Interval: 200 * time.Millisecond, Timeout: time.Second,
			Out: &out, Log: slog.New(slog.DiscardHandler),
		})
	}()
	time.Sleep(time.Second)
	if got := out.String(); got != "" {
		t.Fatalf("printed before any call was routed: %q", got)
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, greeter{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "\n") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if !strings.HasPrefix(first, "split: v1 ") {
		t.Fatalf("first line %q, want a split of routed calls", first)
	}
}
