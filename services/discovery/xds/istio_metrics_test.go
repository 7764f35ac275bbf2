package xds_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// TestIstiosDashboardsReadDiscoverysPushesUnderIstiosNames serves a
// sidecar over a real stream — a push, an ACK, a NACK, a request naming a
// superseded response — and reads discovery's /metrics as Prometheus
// scrapes it: the series Istio's control-plane dashboard and alerts query
// are there, under pilot's names, labels and buckets.
func TestIstiosDashboardsReadDiscoverysPushesUnderIstiosNames(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-discovery", Version: "v9.9.9"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	h := newHarnessWith(t, xds.Options{
		IstioMeter: tel.Istio.Meter("istio"),
		Replica:    debugapi.NewReplica("discovery", "discovery-0", "v9.9.9"),
	})
	h.store.PutService(service("a", 80))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, map[string]any{"ISTIO_VERSION": "1.27.3"}), TypeUrl: resourcev3.ClusterType})
	first := s.next(t)
	s.send(t, ack(first))
	xdstest.Eventually(t, "the ACK to be recorded", func() bool { return h.srv.Status()[0].Types[0].Status == debugapi.Synced })
	// A change: pushed to the proxy, which rejects it, then names the
	// first response again (superseded: an expired nonce).
	h.store.PutService(service("b", 80))
	h.push()
	second := s.next(t)
	s.send(t, nack(second, first.GetVersionInfo(), "test says no"))
	s.send(t, ack(first))
	xdstest.Eventually(t, "the NACK and the expired nonce to be counted", func() bool {
		body := scrape(t, tel)
		return strings.Contains(body, `pilot_total_xds_rejects{type="cds"} 1`) && strings.Contains(body, `pilot_xds_expired_nonce{type="cds"} 1`)
	})

	body := scrape(t, tel)
	for _, want := range []string{
		// Connected proxies, by the version they claim.
		`pilot_xds{version="1.27.3"} 1`,
		// Two CDS responses, timed with Istio's buckets.
		"# TYPE pilot_xds_pushes counter",
		`pilot_xds_pushes{type="cds"} 2`,
		`pilot_xds_push_time_bucket{type="cds",le="30"} 2`,
		`pilot_xds_push_time_count{type="cds"} 2`,
		`pilot_xds_send_time_bucket{le="0.01"}`,
		`pilot_xds_send_time_count 2`,
		`pilot_xds_config_size_bytes_bucket{type="type.googleapis.com/envoy.config.cluster.v3.Cluster",le="1"} 0`,
		`pilot_xds_config_size_bytes_count{type="type.googleapis.com/envoy.config.cluster.v3.Cluster"} 2`,
		// The change reached the proxy: one convergence, Istio's buckets.
		`pilot_proxy_convergence_time_bucket{le="0.1"}`,
		`pilot_proxy_convergence_time_count 1`,
		`pilot_info{version="v9.9.9"} 1`,
		`istio_build{component="pilot",tag="v9.9.9"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, unwanted := range []string{"pilot_xds_pushes_total", "pilot_xds_push_time_seconds", "otel_scope", "_senderr"} {
		if strings.Contains(body, unwanted) {
			t.Errorf("/metrics has %q", unwanted)
		}
	}
}

// TestProxiesClaimingManyVersionsCannotGrowTheSeries connects proxies
// claiming 100 different ISTIO_VERSIONs: pilot_xds keeps at most 32
// version series and counts the rest as other, and counts every proxy.
func TestProxiesClaimingManyVersionsCannotGrowTheSeries(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-discovery"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	h := newHarnessWith(t, xds.Options{IstioMeter: tel.Istio.Meter("istio")})
	h.store.PutService(service("a", 80))
	h.push()
	const proxies = 100
	for i := range proxies {
		s := h.sotw(t)
		id := fmt.Sprintf("sidecar~10.1.0.%d~app-%d.default~default.svc.cluster.local", i%250, i)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: node(id, map[string]any{"ISTIO_VERSION": fmt.Sprintf("1.%d.0-hostile", i)}), TypeUrl: resourcev3.ClusterType})
		s.next(t)
	}
	body := scrape(t, tel)
	series, total := 0, 0.0
	for line := range strings.Lines(body) {
		if !strings.HasPrefix(line, "pilot_xds{") {
			continue
		}
		series++
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		total += v
	}
	if series != 33 || total != proxies || !strings.Contains(body, `pilot_xds{version="other"} 68`) {
		t.Errorf("%d pilot_xds series counting %v proxies, want 33 (32 versions and other) counting %d:\n%s", series, total, proxies, body)
	}
}

func scrape(t *testing.T, tel *telemetry.Providers) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	return rec.Body.String()
}
