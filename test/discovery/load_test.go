package discovery_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/test/load"
)

// TestTheLoadToolMeasures runs the load tool small: its numbers are for
// BENCHMARKS.md (make bench-load); here it must work end to end.
func TestTheLoadToolMeasures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := load.Run(ctx, load.Options{
		BinDir: binDir, Self: filepath.Join(binDir, "xdsload"),
		Clients: 20, Services: 50, Changes: 2, Log: testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", r)
	if len(r.Changes) != 2 || r.P50 <= 0 || r.Max < r.P99 || r.P99 < r.P50 || r.DiscoveryRSSMiB <= 0 || r.Connected <= 0 {
		t.Fatalf("implausible report: %+v", r)
	}
	for _, c := range r.Changes {
		if c.SentP50 <= 0 || c.SentP50 > c.P50 {
			t.Fatalf("a change was acknowledged before it was sent: %+v", c)
		}
	}
}

// TestTheSidecarLoadToolMeasuresEachTypeOfAChange runs the sidecar mode
// small, in both protocols, with two clients rejecting every route
// configuration: every other client acknowledges the route change (RDS)
// and the endpoint change (EDS); the endpoint change sends the load
// assignments of svc-0 that changed (of its six: two ports, whole and
// two subsets), not all 60, except to the three sidecars at svc-0's
// addresses, whose own workload it concerns (a full push); the rejecting
// clients are counted apart.
func TestTheSidecarLoadToolMeasuresEachTypeOfAChange(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			r, err := load.RunSidecars(ctx, load.SidecarOptions{
				BinDir: binDir, Self: filepath.Join(binDir, "xdsload"), Sidecars: 40, Services: 10, Changes: 1,
				Delta: delta, NackClients: 2, Log: testWriter{t}, SyncTimeout: 2 * time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("report:\n%s", r)
			if len(r.Changes) != 2 || r.Connected <= 0 || r.DiscoveryRSSMiB <= 0 || r.Errors != 0 {
				t.Fatalf("implausible report: %+v", r)
			}
			byType := func(c load.SidecarChange, typ string) load.TypeLatency {
				for _, tl := range c.Types {
					if tl.Type == typ {
						return tl
					}
				}
				t.Fatalf("%s change: no client received %s", c.Kind, typ)
				return load.TypeLatency{}
			}
			route, eds := byType(r.Changes[0], "rds"), byType(r.Changes[1], "eds")
			if r.Changes[0].Kind != "route" || route.Clients != 38 || route.Nacked != 2 || route.P50 <= 0 || route.Max < route.P99 {
				t.Errorf("route change: %+v, want 38 clients acknowledging and 2 rejecting", route)
			}
			if r.Changes[1].Kind != "endpoint" || eds.Clients != 40 || eds.Resources > (37*6+3*60)/40.0 {
				t.Errorf("endpoint change: %+v, want all 40 clients, at most 6 load assignments each but for three", eds)
			}
			if r.Changes[0].Discovery <= 0 || r.Changes[0].Discovery > route.Max {
				t.Errorf("discovery's own time %s, want within (0, %s]", r.Changes[0].Discovery, route.Max)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// TestTheReferenceLoadToolMeasuresKubernetesServicesOverSeveralClientProcesses
// runs the reference mode small: Kubernetes Services in a real apiserver,
// read by galley in cluster mode, two discovery replicas, the sidecar
// clients split over two processes. Every client, whichever process runs
// it, acknowledges the route change (RDS) and the endpoint change (EDS);
// the replicas together serve them all.
func TestTheReferenceLoadToolMeasuresKubernetesServicesOverSeveralClientProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const sidecars = 30
	r, err := load.RunReference(ctx, load.ReferenceOptions{
		BinDir: binDir, Self: filepath.Join(binDir, "xdsload"), Sidecars: sidecars, Services: 20,
		Replicas: 2, ClientProcs: 2, Changes: 1, Log: testWriter{t}, SyncTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", r)
	if len(r.Changes) != 2 || r.Connected <= 0 || r.GalleyRSSMiB <= 0 || len(r.ReplicaRSSMiB) != 2 || r.Errors != 0 {
		t.Fatalf("implausible report: %+v", r)
	}
	if served := r.ReplicaProxies[0] + r.ReplicaProxies[1]; served != sidecars {
		t.Errorf("the replicas serve %v proxies, want %d in all", r.ReplicaProxies, sidecars)
	}
	for i, want := range []struct{ kind, typ string }{{"route", "rds"}, {"endpoint", "eds"}} {
		c := r.Changes[i]
		if c.Kind != want.kind {
			t.Fatalf("change %d is a %s change, want %s", i, c.Kind, want.kind)
		}
		var got *load.TypeLatency
		for k := range c.Types {
			if c.Types[k].Type == want.typ {
				got = &c.Types[k]
			}
		}
		if got == nil || got.Clients != sidecars || got.P50 <= 0 || got.Max < got.P99 {
			t.Errorf("%s change: %+v, want all %d clients of both processes acknowledging %s", c.Kind, got, sidecars, want.typ)
		}
	}
}

// TestTheChurnLoadToolRollsDeploymentsInAWholeClusterAndCountsWhatSidecarsReceive
// runs the churn mode small: Deployments in a whole cluster (controllers,
// scheduler, kwok nodes), galley reading them in cluster mode, sidecar
// clients over two processes that hold every Service's endpoints — the
// run waits for them to hold exactly the Ready pods after the sync and
// after the last wave, so stale endpoints fail it — and two waves of
// rolling restarts. Every restarted pod is counted turning Ready and its
// predecessor going; every sidecar received EDS during the churn, after
// the pods changed.
func TestTheChurnLoadToolRollsDeploymentsInAWholeClusterAndCountsWhatSidecarsReceive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const sidecars, deployments, podsEach = 4, 6, 2
	r, err := load.RunChurn(ctx, load.ChurnOptions{
		BinDir: binDir, Self: filepath.Join(binDir, "xdsload"), Deployments: deployments, PodsEach: podsEach,
		Sidecars: sidecars, ClientProcs: 2, Waves: 2, Interval: 15 * time.Second, Fraction: 0.5,
		Log: testWriter{t}, SyncTimeout: 3 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", r)
	if len(r.Waves) != 2 || r.Unsettled != "" || r.Errors != 0 || r.GalleyRSSMiB <= 0 || r.DiscoveryRSSMiB <= 0 {
		t.Fatalf("implausible report: %+v", r)
	}
	last := r.Waves[1]
	if last.Deployments != deployments/2 || last.Pods != podsEach*deployments/2 || last.Settled <= 0 {
		t.Errorf("last wave %+v: want %d Deployments of %d pods restarted and settled", last, deployments/2, podsEach)
	}
	// Each wave: every new pod turns Ready, every old one stops serving
	// and goes.
	if want := 2 * 3 * podsEach * deployments / 2; r.PodChanges < want {
		t.Errorf("%d pod changes counted during the churn, want at least %d", r.PodChanges, want)
	}
	if len(r.EDSPerSidecar) != sidecars || r.EDSPerSidecar[0] < 1 {
		t.Errorf("EDS responses per sidecar during the churn: %v, want %d sidecars with at least one each", r.EDSPerSidecar, sidecars)
	}
	if r.Lag <= 0 {
		t.Errorf("the last sidecar's EDS came %s after the last pod change, want after it", r.Lag)
	}
	if r.WatchesGalley <= r.WatchesBefore {
		t.Errorf("the apiserver's watches: %d before galley, %d with it; want galley's counted", r.WatchesBefore, r.WatchesGalley)
	}
}
