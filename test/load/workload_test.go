package load

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"
)

func TestScopedSidecarsSeeTheirNamespacesServices(t *testing.T) {
	const n = 100
	for _, tt := range []struct {
		client, svc  int
		scoped, want bool
	}{
		{client: 2, svc: 99, scoped: true, want: true},   // in "load": no Sidecar
		{client: 300, svc: 0, scoped: true, want: true},  // ns-0 sees svc-0…9
		{client: 301, svc: 0, scoped: true, want: false}, // ns-1 sees svc-10…19
		{client: 301, svc: 15, scoped: true, want: true}, //
		{client: 301, svc: 0, scoped: false, want: true}, // unscoped: all
	} {
		if got := sidecarSees(tt.client, n, tt.svc, tt.scoped); got != tt.want {
			t.Errorf("client %d, svc-%d, scoped %v: sees %v, want %v", tt.client, tt.svc, tt.scoped, got, tt.want)
		}
	}
	// The Sidecars say the same: ns-1's lists svc-10 … svc-19 as hosts.
	for _, doc := range strings.Split(sidecarRouting(n, 10, true), "\n---\n") {
		if !strings.Contains(doc, "kind: Sidecar") || !strings.Contains(doc, "namespace: ns-1}") {
			continue
		}
		var sc struct {
			Spec struct {
				Egress []struct{ Hosts []string } `json:"egress"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &sc); err != nil {
			t.Fatal(err)
		}
		hosts := sc.Spec.Egress[0].Hosts
		if len(hosts) != 11 || hosts[0] != "./*" || hosts[1] != "load/svc-10.load.svc.cluster.local" || hosts[10] != "load/svc-19.load.svc.cluster.local" {
			t.Fatalf("ns-1's Sidecar hosts %q", hosts)
		}
		return
	}
	t.Fatal("no Sidecar for ns-1")
}

func TestAFanoutStepMovesEveryEndpointOfItsServicesToAddressesOfTheirOwn(t *testing.T) {
	const per, endpoints = 300, 3
	type entry struct {
		Metadata struct{ Name string } `json:"metadata"`
		Spec     struct {
			Endpoints []struct{ Address string } `json:"endpoints"`
		} `json:"spec"`
	}
	addresses := func(k, gen int) map[string]bool {
		out := map[string]bool{}
		docs := strings.Split(strings.TrimSuffix(fanoutServices(k, per, endpoints, gen), "---\n"), "---\n")
		if len(docs) != per {
			t.Fatalf("step %d: %d ServiceEntries, want %d", k, len(docs), per)
		}
		for _, doc := range docs {
			var e entry
			if err := yaml.Unmarshal([]byte(doc), &e); err != nil {
				t.Fatal(err)
			}
			if len(e.Spec.Endpoints) != endpoints {
				t.Fatalf("%s: %d endpoints, want %d", e.Metadata.Name, len(e.Spec.Endpoints), endpoints)
			}
			for _, ep := range e.Spec.Endpoints {
				if out[ep.Address] {
					t.Fatalf("%s: address %s is another endpoint's too", e.Metadata.Name, ep.Address)
				}
				out[ep.Address] = true
			}
		}
		return out
	}
	all := map[string]bool{}
	for k := range 2 {
		for gen := range 2 {
			for a := range addresses(k, gen) {
				if all[a] {
					t.Fatalf("step %d generation %d: address %s is already used", k, gen, a)
				}
				all[a] = true
			}
		}
	}
}

func TestMetricsSumAddsTheSeriesOfOneNameWithTheLabel(t *testing.T) {
	m := metrics{
		`flotilla_discovery_xds_resources_sent_total{otel_scope_name="x",type="CDS"} 12`,
		`flotilla_discovery_xds_resources_sent_total{otel_scope_name="x",type="EDS"} 5`,
		`flotilla_discovery_xds_resources_sent_total{otel_scope_name="y",type="CDS"} 3`,
		`flotilla_discovery_xds_resources_sent_totally{type="CDS"} 100`,
		`flotilla_discovery_proxies_connected 7`,
		`flotilla_discovery_proxies_connected{a="b"} 2.5e1`,
		`flotilla_discovery_proxies_connected{a="b"} not-a-number`,
	}
	for _, tt := range []struct {
		name, label string
		want        float64
	}{
		{"flotilla_discovery_xds_resources_sent_total", `type="CDS"`, 15},
		{"flotilla_discovery_xds_resources_sent_total", "", 20},
		{"flotilla_discovery_proxies_connected", "", 32},
		{"absent", "", 0},
	} {
		if got := m.sum(tt.name, tt.label); got != tt.want {
			t.Errorf("sum(%s, %s) = %v, want %v", tt.name, tt.label, got, tt.want)
		}
	}
}

// The harness's check of a spread (evenEnough), on hand-made counts: the
// load tool's own run measures the spread.
func TestEvenEnoughAdmitsSpreadsWhereEveryReplicaHasFourFifthsOfAnEvenShare(t *testing.T) {
	for _, tt := range []struct {
		counts []int
		n      int
		want   bool
	}{
		{[]int{100, 100, 100}, 300, true},
		{[]int{80, 110, 110}, 300, true},
		{[]int{79, 111, 110}, 300, false},
		{[]int{300, 0, 0}, 300, false},
	} {
		if got := evenEnough(tt.counts, tt.n); got != tt.want {
			t.Errorf("evenEnough(%v, %d) = %v, want %v", tt.counts, tt.n, got, tt.want)
		}
	}
}

// The harness's reading of how a stream ended (movedOn), on hand-made
// errors: the load tool's connection-age run is where clients move on.
func TestMovedOnReadsAStreamEndedByTheServerOrAGracefulGOAWAYAsAMoveAndOtherEndsAsErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"the server ended the stream (OK status)", errStreamEnded, true},
		{"the connection closed after a graceful GOAWAY", status.Error(codes.Unavailable, "closing transport due to: connection error: desc = \"error reading from server: EOF\", received prior goaway: code: NO_ERROR"), true},
		{"the stream aborted for a slow read", status.Error(codes.DeadlineExceeded, "the proxy took no response for 30s"), false},
		{"the connection reset", fmt.Errorf("receive: %w", status.Error(codes.Unavailable, "error reading from server: connection reset by peer")), false},
	} {
		if got := movedOn(tt.err); got != tt.want {
			t.Errorf("%s: moved on %v, want %v", tt.name, got, tt.want)
		}
	}
}
