// Package envoyfilterstatus keeps what discovery replicas report of the
// EnvoyFilters they could not apply in full, for galley's status writer:
// each EnvoyFilter with problems gets them in its status, as the proxies
// met them (proxy-status shows them per proxy).
package envoyfilterstatus

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Bounds of what is kept (with registry's bounds of a report): a
// misbehaving replica costs itself its report, never galley's memory.
const (
	// MaxReplicas is how many replicas' reports are kept at once.
	MaxReplicas = 64
	// maxInterval bounds the report interval a replica asks galley to
	// wait for (three of them before its report is forgotten).
	maxInterval = 5 * time.Minute
)

// Server is galley's EnvoyFilterStatusService. Safe for concurrent use.
type Server struct {
	galleyv1.UnimplementedEnvoyFilterStatusServiceServer
	// caller says whether a caller's identity may report (discovery's).
	caller func(identity string) bool
	now    func() time.Time
	log    *slog.Logger

	mu       sync.Mutex
	replicas map[string]report
}

type report struct {
	expires time.Time
	filters map[istio.ID]finding
}

type finding struct {
	problems []string
	proxies  uint32
}

// New returns a server answering callers caller accepts.
func New(caller func(identity string) bool, log *slog.Logger, now func() time.Time) *Server {
	return &Server{caller: caller, now: now, log: log, replicas: map[string]report{}}
}

// Register serves it on g.
func (s *Server) Register(g *grpc.Server) { galleyv1.RegisterEnvoyFilterStatusServiceServer(g, s) }

// Report replaces the replica's findings.
func (s *Server) Report(ctx context.Context, req *galleyv1.ReportRequest) (*galleyv1.ReportResponse, error) {
	identity := mcp.PeerIdentity(ctx)
	if !s.caller(identity) {
		return nil, status.Errorf(codes.PermissionDenied, "EnvoyFilter findings are taken from discovery only, not from %s", identity)
	}
	replica := req.GetReplica()
	if replica == "" || len(replica) > 253 {
		return nil, status.Error(codes.InvalidArgument, "replica: want a name of 1 to 253 bytes")
	}
	if n := len(req.GetFilters()); n > registry.MaxReportedEnvoyFilters {
		return nil, status.Errorf(codes.InvalidArgument, "%d EnvoyFilters reported, at most %d", n, registry.MaxReportedEnvoyFilters)
	}
	interval := time.Duration(req.GetReportIntervalSeconds()) * time.Second
	if interval <= 0 || interval > maxInterval {
		return nil, status.Errorf(codes.InvalidArgument, "report interval %ds: want 1 to %d", req.GetReportIntervalSeconds(), int(maxInterval/time.Second))
	}
	filters := make(map[istio.ID]finding, len(req.GetFilters()))
	for _, f := range req.GetFilters() {
		if f.GetNamespace() == "" || f.GetName() == "" || len(f.GetNamespace())+len(f.GetName()) > 316 {
			return nil, status.Error(codes.InvalidArgument, "an EnvoyFilter is named by a namespace and a name")
		}
		var problems []string
		for _, p := range f.GetProblems() {
			if len(p) > registry.MaxEnvoyFilterProblemBytes {
				p = strings.ToValidUTF8(p[:registry.MaxEnvoyFilterProblemBytes], "") + "…"
			}
			if !slices.Contains(problems, p) {
				problems = append(problems, p)
			}
			if len(problems) == registry.MaxEnvoyFilterProblems {
				break
			}
		}
		if len(problems) == 0 {
			continue
		}
		filters[istio.ID{Kind: istio.EnvoyFilter, Name: f.GetNamespace() + "/" + f.GetName()}] = finding{problems: problems, proxies: f.GetProxies()}
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now)
	if _, ok := s.replicas[replica]; !ok && len(s.replicas) >= MaxReplicas {
		return nil, status.Errorf(codes.ResourceExhausted, "findings of %d replicas are kept already", MaxReplicas)
	}
	s.replicas[replica] = report{expires: now.Add(3 * interval), filters: filters}
	return &galleyv1.ReportResponse{}, nil
}

// expire forgets the replicas that stopped reporting. Call with mu held.
func (s *Server) expire(now time.Time) {
	for r, rep := range s.replicas {
		if !now.Before(rep.expires) {
			delete(s.replicas, r)
		}
	}
}

// Findings are what galley says in the status of each EnvoyFilter some
// replica found problems with: how many proxies met them, and the
// problems (at most registry.MaxEnvoyFilterProblems, sorted).
func (s *Server) Findings() map[istio.ID]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.now())
	merged := map[istio.ID]*finding{}
	for _, r := range slices.Sorted(maps.Keys(s.replicas)) {
		for id, f := range s.replicas[r].filters {
			m := merged[id]
			if m == nil {
				m = &finding{}
				merged[id] = m
			}
			m.proxies += f.proxies
			for _, p := range f.problems {
				if !slices.Contains(m.problems, p) {
					m.problems = append(m.problems, p)
				}
			}
		}
	}
	out := make(map[istio.ID]string, len(merged))
	for id, f := range merged {
		slices.Sort(f.problems)
		f.problems = f.problems[:min(len(f.problems), registry.MaxEnvoyFilterProblems)]
		noun := "proxies"
		if f.proxies == 1 {
			noun = "proxy"
		}
		out[id] = fmt.Sprintf("not applied in full to %d %s: %s", f.proxies, noun, strings.Join(f.problems, "; "))
	}
	return out
}
