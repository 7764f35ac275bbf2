package envoyfilterstatus

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// serve runs s on a loopback gRPC server and returns a client.
func serve(t *testing.T, s *Server) galleyv1.EnvoyFilterStatusServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return galleyv1.NewEnvoyFilterStatusServiceClient(conn)
}

func findingOf(ns, name string, proxies uint32, problems ...string) *galleyv1.EnvoyFilterFindings {
	return &galleyv1.EnvoyFilterFindings{Namespace: ns, Name: name, Proxies: proxies, Problems: problems}
}

func TestReplicasFindingsAreMergedAndForgottenWhenTheyStopReporting(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	s := New(func(string) bool { return true }, slog.New(slog.DiscardHandler), c.now)
	client := serve(t, s)
	ctx := context.Background()
	if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: "discovery-a", ReportIntervalSeconds: 30, Filters: []*galleyv1.EnvoyFilterFindings{
		findingOf("shop", "lua", 2, "patch 0 broke x", "patch 1 broke y"),
		findingOf("shop", "quiet", 1), // no problem: nothing to say
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: "discovery-b", ReportIntervalSeconds: 60, Filters: []*galleyv1.EnvoyFilterFindings{
		findingOf("shop", "lua", 3, "patch 0 broke x", "patch 2 broke z"),
	}}); err != nil {
		t.Fatal(err)
	}
	lua := istio.ID{Kind: istio.EnvoyFilter, Name: "shop/lua"}
	got := s.Findings()
	if len(got) != 1 || got[lua] != "not applied in full to 5 proxies: patch 0 broke x; patch 1 broke y; patch 2 broke z" {
		t.Fatalf("findings %q", got)
	}
	// A replica's new report replaces its last.
	if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: "discovery-b", ReportIntervalSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if got := s.Findings()[lua]; got != "not applied in full to 2 proxies: patch 0 broke x; patch 1 broke y" {
		t.Fatalf("after b's empty report: %q", got)
	}
	// a reports every 30 s: three missed reports and it is forgotten.
	c.add(89 * time.Second)
	if len(s.Findings()) != 1 {
		t.Fatal("a's report forgotten before three intervals")
	}
	c.add(time.Second)
	if got := s.Findings(); len(got) != 0 {
		t.Fatalf("a stopped reporting, its findings stay: %q", got)
	}
}

func TestABadOrForeignReportIsRefusedAndCostsGalleyNothing(t *testing.T) {
	c := &clock{t: time.Unix(1e9, 0)}
	s := New(func(string) bool { return true }, slog.New(slog.DiscardHandler), c.now)
	client := serve(t, s)
	ctx := context.Background()
	tooMany := make([]*galleyv1.EnvoyFilterFindings, registry.MaxReportedEnvoyFilters+1)
	for i := range tooMany {
		tooMany[i] = findingOf("ns", fmt.Sprint("ef-", i), 1, "x")
	}
	for name, req := range map[string]*galleyv1.ReportRequest{
		"no replica":        {ReportIntervalSeconds: 30},
		"a long replica":    {Replica: strings.Repeat("r", 254), ReportIntervalSeconds: 30},
		"no interval":       {Replica: "a"},
		"a long interval":   {Replica: "a", ReportIntervalSeconds: 3600},
		"too many":          {Replica: "a", ReportIntervalSeconds: 30, Filters: tooMany},
		"an unnamed filter": {Replica: "a", ReportIntervalSeconds: 30, Filters: []*galleyv1.EnvoyFilterFindings{findingOf("", "x", 1, "p")}},
	} {
		if _, err := client.Report(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if len(s.Findings()) != 0 || len(s.replicas) != 0 {
		t.Fatalf("refused reports were kept: %v", s.replicas)
	}
	// Problems beyond the bounds are cut, not kept.
	var problems []string
	for i := range 50 {
		problems = append(problems, fmt.Sprintf("problem %02d %s", i, strings.Repeat("é", 2*registry.MaxEnvoyFilterProblemBytes)))
	}
	if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: "a", ReportIntervalSeconds: 30, Filters: []*galleyv1.EnvoyFilterFindings{findingOf("ns", "big", 1, problems...)}}); err != nil {
		t.Fatal(err)
	}
	f := s.replicas["a"].filters[istio.ID{Kind: istio.EnvoyFilter, Name: "ns/big"}]
	if len(f.problems) != registry.MaxEnvoyFilterProblems {
		t.Fatalf("%d problems kept", len(f.problems))
	}
	for _, p := range f.problems {
		if len(p) > registry.MaxEnvoyFilterProblemBytes+len("…") || !strings.HasSuffix(p, "…") {
			t.Fatalf("a problem of %d bytes kept", len(p))
		}
	}
	// At most MaxReplicas replicas.
	for i := range MaxReplicas - 1 {
		if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: fmt.Sprint("r", i), ReportIntervalSeconds: 30}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Report(ctx, &galleyv1.ReportRequest{Replica: "one-more", ReportIntervalSeconds: 30}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("replica %d: %v, want ResourceExhausted", MaxReplicas+1, err)
	}
	// A caller that is not discovery is refused.
	other := New(func(string) bool { return false }, slog.New(slog.DiscardHandler), c.now)
	if _, err := serve(t, other).Report(ctx, &galleyv1.ReportRequest{Replica: "a", ReportIntervalSeconds: 30}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a foreign caller: %v", err)
	}
}

func FuzzReport(f *testing.F) {
	f.Add("a", uint32(30), "ns", "name", "problem", uint32(2))
	f.Fuzz(func(t *testing.T, replica string, interval uint32, ns, name, problem string, proxies uint32) {
		s := New(func(string) bool { return true }, slog.New(slog.DiscardHandler), time.Now)
		_, _ = s.Report(context.Background(), &galleyv1.ReportRequest{Replica: replica, ReportIntervalSeconds: interval, Filters: []*galleyv1.EnvoyFilterFindings{findingOf(ns, name, proxies, problem, problem)}})
		for id, msg := range s.Findings() {
			if id.Name != ns+"/"+name || len(msg) > 64+registry.MaxEnvoyFilterProblemBytes+len("…") {
				t.Fatalf("%v: %q", id, msg)
			}
		}
	})
}
