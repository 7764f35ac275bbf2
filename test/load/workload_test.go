package load

import (
	"strings"
	"testing"

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
