package cli_test

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var update = flag.Bool("update", false, "rewrite the golden tables")

func TestProxyConfigShowsWhatTheReplicaGivesASidecarAndAProxylessClient(t *testing.T) {
	ctxFile, _, _ := meshWithClients(t)
	// The backends listen on ports the test chose: the tables name them.
	ports := strings.NewReplacer(":"+strconv.Itoa(backendPorts[0])+" ", ":V1PORT ", ":"+strconv.Itoa(backendPorts[1])+" ", ":V2PORT ")
	for _, tc := range []struct {
		golden, proxy string
		args          []string
	}{
		{"proxyless-all", "client-1.default", []string{"all"}},
		{"sidecar-clusters", "app-1.default", []string{"cluster"}},
		{"sidecar-clusters-outbound-80", "app-1.default", []string{"cluster", "--direction", "outbound", "--port", "80", "--fqdn", "backend"}},
		{"sidecar-listeners", "app-1.default", []string{"listener"}},
		{"sidecar-listeners-port-80", "app-1.default", []string{"listener", "--port", "80"}},
		{"sidecar-routes", "app-1.default", []string{"routes"}},
		{"sidecar-endpoints-v2", "app-1.default", []string{"endpoint", "--cluster", "outbound|80|v2|backend-service.default.svc.cluster.local"}},
	} {
		code, out, errOut := flotilla(t, ctxFile, append([]string{"proxy-config"}, append(tc.args, tc.proxy)...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.golden, code, errOut)
		}
		golden.Check(t, filepath.Join("testdata", tc.golden+".golden"), []byte(ports.Replace(out)), *update)
	}

	// In full: the resources themselves, as JSON.
	code, out, _ := flotilla(t, ctxFile, "proxy-config", "route", "app-1.default", "--name", "80", "-o", "json")
	var routes []struct {
		Name         string            `json:"name"`
		VirtualHosts []json.RawMessage `json:"virtualHosts"`
	}
	if err := json.Unmarshal([]byte(out), &routes); code != 0 || err != nil || len(routes) != 1 || routes[0].Name != "80" || len(routes[0].VirtualHosts) == 0 {
		t.Fatalf("route 80 as JSON: %d %v\n%s", code, err, out)
	}
	// The bootstrap is the agent's: with none known, the error says how
	// to name it (the agents' own tests read it).
	if code, _, errOut := flotilla(t, ctxFile, "proxy-config", "bootstrap", "app-1.default"); code != 1 || !strings.Contains(errOut, "where is the agent of app-1.default? give --agent-address") {
		t.Fatalf("bootstrap: %d %s", code, errOut)
	}
	if code, _, errOut := flotilla(t, ctxFile, "proxy-config", "bootstraps", "app-1"); code != 1 || !strings.Contains(errOut, `"app-1": want the proxy as pod.namespace`) {
		t.Fatalf("bootstrap of a name without a namespace: %d %s", code, errOut)
	}
}

// TestProxyConfigNamesTheEnvoyFiltersThatChangedAResourceAndProxyStatusABreakingPatch:
// with an EnvoyFilter merging into the sidecar's v2 cluster and another
// whose merge would make the v1 cluster invalid, proxy-config shows
// which EnvoyFilter changed which cluster (and the v1 cluster as
// generated), and proxy-status names the breaking patch and why.
func TestProxyConfigNamesTheEnvoyFiltersThatChangedAResourceAndProxyStatusABreakingPatch(t *testing.T) {
	dir, _, _, r2 := mesh(t)
	ctxFile := writeContext(t, r2.xds)
	newRawClient(t, r2.xds, sidecarID, "ack")
	xdstest.WriteFile(t, dir, "envoyfilters.yaml", `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: tune, namespace: default}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: backend-service.default.svc.cluster.local, subset: v2}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 65536}}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: breaks, namespace: default}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {service: backend-service.default.svc.cluster.local, subset: v1}}
    patch: {operation: MERGE, value: {connect_timeout: -1s}}
`)
	var out string
	xdstest.Eventually(t, "the v2 cluster shown with its EnvoyFilter", func() bool {
		code, o, errOut := flotilla(t, ctxFile, "proxy-config", "cluster", "app-1.default")
		if code != 0 {
			t.Fatalf("proxy-config: %d %s", code, errOut)
		}
		out = o
		return strings.Contains(out, "ENVOYFILTERS")
	})
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.HasPrefix(f[0], "backend-service") {
			continue
		}
		want := "-"
		if f[2] == "v2" {
			want = "default/tune"
		}
		if got := f[len(f)-1]; got != want {
			t.Errorf("%q: EnvoyFilters %q, want %q\n%s", l, got, want, out)
		}
	}
	code, detail, errOut := flotilla(t, ctxFile, "proxy-status", sidecarID)
	if code != 0 {
		t.Fatalf("proxy-status: %d %s", code, errOut)
	}
	if !strings.Contains(detail, "EnvoyFilter default/breaks patch 0 (CLUSTER MERGE): makes cluster outbound|80|v1|backend-service.default.svc.cluster.local invalid") {
		t.Errorf("proxy-status does not name the breaking patch:\n%s", detail)
	}
}
