package app

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// envoyFilterReporter sends galley what this replica's proxies met of the
// EnvoyFilters (xds.Server.EnvoyFilterFindings), for their status: when
// it changes (looked at every check), and at least every interval so
// that galley keeps it.
type envoyFilterReporter struct {
	client   galleyv1.EnvoyFilterStatusServiceClient
	replica  string
	findings func() []xds.EnvoyFilterFinding
	check    time.Duration
	interval time.Duration
	log      *slog.Logger
}

// report builds the report, within registry's bounds.
func (r envoyFilterReporter) report() *galleyv1.ReportRequest {
	req := &galleyv1.ReportRequest{Replica: r.replica, ReportIntervalSeconds: uint32(r.interval / time.Second)} //nolint:gosec // 30 (a constant)
	for _, f := range r.findings() {
		if len(req.Filters) == registry.MaxReportedEnvoyFilters {
			break
		}
		problems := f.Problems[:min(len(f.Problems), registry.MaxEnvoyFilterProblems)]
		out := make([]string, len(problems))
		for i, p := range problems {
			// Cut on a rune: a proto string is UTF-8.
			out[i] = strings.ToValidUTF8(p[:min(len(p), registry.MaxEnvoyFilterProblemBytes)], "")
		}
		req.Filters = append(req.Filters, &galleyv1.EnvoyFilterFindings{Namespace: f.Namespace, Name: f.Name, Problems: out, Proxies: uint32(min(f.Proxies, 1<<31))}) //nolint:gosec // clamped
	}
	return req
}

// Run reports until ctx ends. A galley that does not serve the report
// (an older one) is not asked again.
func (r envoyFilterReporter) Run(ctx context.Context) error {
	tick := time.NewTicker(r.check)
	defer tick.Stop()
	var last *galleyv1.ReportRequest
	var sent time.Time
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		req := r.report()
		if last != nil && proto.Equal(req, last) && time.Since(sent) < r.interval {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := r.client.Report(cctx, req)
		cancel()
		switch {
		case status.Code(err) == codes.Unimplemented:
			r.log.Info("galley takes no EnvoyFilter findings (an older galley): EnvoyFilters get no status from this replica")
			<-ctx.Done()
			return nil
		case err != nil:
			if !failing {
				r.log.Warn("reporting EnvoyFilter findings to galley", "error", err)
			}
			failing = true
			continue
		}
		failing = false
		last, sent = req, time.Now()
	}
}
