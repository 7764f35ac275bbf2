package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/kiali"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// get answers a GET of url: its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's bounded request
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Kiali reads each istiod pod through a port-forward: /ready on 8080,
// /version, /debug/syncz and (up to Kiali 2.22) /debug/registryz on 15014. A replica answers them as istiod
// does, and Kiali, decoding the sync state with its own types, sees each
// proxy as pod.namespace, every type Synced.
func TestKialiReadsAReplicaAsItReadsIstiod(t *testing.T) {
	_, galley, r1, _ := mesh(t)
	istiod := proc.FreeAddr(t)
	r := startReplica(t, galley, "r3", proc.FreeAddr(t), "--revision", "default", "--istiod-http-address", istiod)
	c := xdstest.Client(t, proxylessID, xdstest.Target, r.xds)
	if got := xdstest.Count(t, c, 10); got["v1"]+got["v2"] != 10 {
		t.Fatalf("proxyless calls: %v", got)
	}
	if code, body := get(t, "http://"+istiod+"/ready"); code != http.StatusOK {
		t.Fatalf("/ready: %d %s", code, body)
	}
	if code, body := get(t, "http://"+r.admin+"/version"); code != http.StatusOK || strings.TrimSpace(body) == "" {
		t.Fatalf("/version: %d %q", code, body)
	}
	for _, addr := range []string{r.admin, istiod} {
		var proxies []*kiali.ProxyStatus
		xdstest.Eventually(t, "the client Synced in Kiali's eyes at "+addr, func() bool {
			code, body := get(t, "http://"+addr+"/debug/syncz")
			if code != http.StatusOK {
				t.Fatalf("/debug/syncz at %s: %d %s", addr, code, body)
			}
			if err := json.Unmarshal([]byte(body), &proxies); err != nil {
				t.Fatalf("Kiali's decoding of %s: %v", body, err)
			}
			return len(proxies) == 1 && proxies[0].ProxyID == "client-1.default" && kiali.Synced(proxies[0])
		})
	}
	// Kiali up to 2.22 reads the registry too.
	for _, addr := range []string{r.admin, istiod} {
		code, body := get(t, "http://"+addr+"/debug/registryz")
		var services []*kiali.RegistryService
		if err := json.Unmarshal([]byte(body), &services); code != http.StatusOK || err != nil {
			t.Fatalf("/debug/registryz at %s: %d %v %s", addr, code, err, body)
		}
		found := false
		for _, s := range services {
			found = found || (s.Hostname == "backend-service.default.svc.cluster.local" && len(s.Ports) > 0 && s.Attributes.Namespace == "default")
		}
		if !found {
			t.Fatalf("/debug/registryz at %s without the backend: %s", addr, body)
		}
	}
	// Another replica lists its own proxies only: Kiali merges the pods'.
	if _, body := get(t, "http://"+r1.admin+"/debug/syncz"); strings.TrimSpace(body) != "[]" {
		t.Fatalf("a replica without proxies: %s", body)
	}
}
