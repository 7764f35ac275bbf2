package app

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// recordingGalley takes reports over real gRPC and keeps them.
type recordingGalley struct {
	galleyv1.UnimplementedEnvoyFilterStatusServiceServer
	mu      sync.Mutex
	reports []*galleyv1.ReportRequest
}

func (g *recordingGalley) Report(_ context.Context, r *galleyv1.ReportRequest) (*galleyv1.ReportResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reports = append(g.reports, r)
	return &galleyv1.ReportResponse{}, nil
}

func (g *recordingGalley) count() int { g.mu.Lock(); defer g.mu.Unlock(); return len(g.reports) }

func (g *recordingGalley) last() *galleyv1.ReportRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reports[len(g.reports)-1]
}

func dialGalley(t *testing.T, register func(*grpc.Server)) galleyv1.EnvoyFilterStatusServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return galleyv1.NewEnvoyFilterStatusServiceClient(conn)
}

func TestEnvoyFilterFindingsReachGalleyWhenTheyChangeWithinBounds(t *testing.T) {
	galley := &recordingGalley{}
	client := dialGalley(t, func(g *grpc.Server) { galleyv1.RegisterEnvoyFilterStatusServiceServer(g, galley) })
	var mu sync.Mutex
	current := []xds.EnvoyFilterFinding{{Namespace: "shop", Name: "lua", Problems: []string{"patch 0 broke x"}, Proxies: 2}}
	r := envoyFilterReporter{
		client: client, replica: "discovery-a", check: 10 * time.Millisecond, interval: time.Hour, log: slog.New(slog.DiscardHandler),
		findings: func() []xds.EnvoyFilterFinding {
			mu.Lock()
			defer mu.Unlock()
			return current
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	xdstest.Eventually(t, "the first report", func() bool { return galley.count() == 1 })
	if got := galley.last(); got.GetReplica() != "discovery-a" || got.GetReportIntervalSeconds() != 3600 || len(got.GetFilters()) != 1 || got.GetFilters()[0].GetProxies() != 2 {
		t.Fatalf("report %v", got)
	}
	time.Sleep(100 * time.Millisecond) // ten checks: nothing changed, nothing sent
	if n := galley.count(); n != 1 {
		t.Fatalf("%d reports of unchanged findings", n)
	}
	var many []string
	for i := range 3 * registry.MaxEnvoyFilterProblems {
		many = append(many, strings.Repeat("é", 3*registry.MaxEnvoyFilterProblemBytes)+string(rune('a'+i)))
	}
	mu.Lock()
	current = []xds.EnvoyFilterFinding{{Namespace: "shop", Name: "lua", Problems: many, Proxies: 1}}
	mu.Unlock()
	xdstest.Eventually(t, "the changed findings reported", func() bool { return galley.count() == 2 })
	f := galley.last().GetFilters()[0]
	if len(f.GetProblems()) != registry.MaxEnvoyFilterProblems {
		t.Fatalf("%d problems sent", len(f.GetProblems()))
	}
	for _, p := range f.GetProblems() {
		if len(p) > registry.MaxEnvoyFilterProblemBytes {
			t.Fatalf("a problem of %d bytes sent", len(p))
		}
	}
}

func TestAGalleyThatTakesNoFindingsIsNotAskedAgain(t *testing.T) {
	client := dialGalley(t, func(*grpc.Server) {}) // serves no EnvoyFilterStatusService
	calls := 0
	var mu sync.Mutex
	r := envoyFilterReporter{
		client: client, replica: "discovery-a", check: 10 * time.Millisecond, interval: time.Hour, log: slog.New(slog.DiscardHandler),
		findings: func() []xds.EnvoyFilterFinding {
			mu.Lock()
			defer mu.Unlock()
			calls++
			return []xds.EnvoyFilterFinding{{Namespace: "a", Name: "b", Problems: []string{string(rune('a' + calls%26))}, Proxies: 1}}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	xdstest.Eventually(t, "one try", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 1 })
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Fatalf("findings built %d times for a galley that takes none", calls)
	}
}
