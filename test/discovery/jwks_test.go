package discovery_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// jwksIssuer serves a key set on loopback that the test rotates or takes
// down.
type jwksIssuer struct {
	*httptest.Server
	mu   sync.Mutex
	kid  string
	down atomic.Bool
	hits atomic.Int64
}

func newJWKSIssuer(t *testing.T) *jwksIssuer {
	t.Helper()
	is := &jwksIssuer{kid: "one"}
	is.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		is.hits.Add(1)
		if is.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		is.mu.Lock()
		defer is.mu.Unlock()
		_, _ = w.Write([]byte(`{"keys":[{"kty":"RSA","e":"AQAB","kid":"` + is.kid + `","n":"` + strings.Repeat("x8E9n9bfsCVWNnBCjFGrj6oT5NH", 13) + `"}]}`))
	}))
	t.Cleanup(is.Close)
	return is
}

func (is *jwksIssuer) rotate(kid string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.kid = kid
}

// inboundKeys follows the api workload's listeners over one ADS stream,
// ACKing each response, and returns the local JWKS of each issuer in the
// latest one.
type inboundKeys struct {
	st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func watchInboundKeys(t *testing.T, addr string) *inboundKeys {
	t.Helper()
	return &inboundKeys{st: adsStream(t, addr, "sidecar~10.0.0.7~api-1.default~default.svc.cluster.local", map[string]any{"app": "api"}, resourcev3.ListenerType)}
}

// next waits for the next listener response (at most 30 s) and returns
// issuer → keys.
func (k *inboundKeys) next(t *testing.T) map[string]string {
	t.Helper()
	resp := adsRecv(t, k.st)
	out := map[string]string{}
	for _, a := range resp.GetResources() {
		l := &listenerv3.Listener{}
		if err := a.UnmarshalTo(l); err != nil || l.GetName() != "virtualInbound" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					jwt := &jwtv3.JwtAuthentication{}
					if hf.GetName() != "envoy.filters.http.jwt_authn" || hf.GetTypedConfig().UnmarshalTo(jwt) != nil {
						continue
					}
					for _, p := range jwt.GetProviders() {
						out[p.GetIssuer()] = p.GetLocalJwks().GetInlineString()
					}
				}
			}
		}
	}
	return out
}

// until reads responses until cond holds for one (bounded: 30 s).
func (k *inboundKeys) until(t *testing.T, what string, cond func(map[string]string) bool) map[string]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got := k.next(t)
		if cond(got) {
			return got
		}
		t.Logf("a listener without %s: %.200v", what, got)
	}
	t.Fatalf("no listener with %s within 30 s", what)
	return nil
}

// TestDiscoveryFetchesIssuersKeysAndPushesTheirRotation runs discovery on
// a directory with two RequestAuthentications: one whose jwksUri is an
// issuer on loopback, one whose issuer cannot be reached. The api
// workload's listener carries the first issuer's keys inline (fetched by
// discovery, not the proxy) and a key no token verifies against for the
// second (fail closed, reported in discovery's log); a rotation at the
// issuer is pushed; an issuer that goes down keeps its last keys.
func TestDiscoveryFetchesIssuersKeysAndPushesTheirRotation(t *testing.T) {
	is := newJWKSIssuer(t)
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "api.yaml", `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api}
spec:
  hosts: [api.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.0.0.7, labels: {app: api}}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: api}
spec:
  selector: {matchLabels: {app: api}}
  jwtRules:
  - issuer: https://issuer.test
    jwksUri: `+is.URL+`/keys
  - issuer: https://unreachable.test
    jwksUri: http://127.0.0.1:1/keys
`)
	xdsAddr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	d := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"),
		"--config-dir", dir, "--xds-address", xdsAddr, "--admin-address", admin, "--debounce-quiet", "20ms", "--jwks-refresh", "300ms")
	proc.WaitReady(t, "http://"+admin+"/readyz")
	keys := watchInboundKeys(t, xdsAddr)

	got := keys.until(t, "the issuer's keys", func(m map[string]string) bool { return strings.Contains(m["https://issuer.test"], `"kid":"one"`) })
	if !strings.Contains(got["https://unreachable.test"], "flotilla-fail-closed") {
		t.Fatalf("the unreachable issuer's keys: %q", got["https://unreachable.test"])
	}
	d.Out.WaitFor(t, "JWKS fetch failed")

	is.rotate("two")
	keys.until(t, "the rotated key", func(m map[string]string) bool { return strings.Contains(m["https://issuer.test"], `"kid":"two"`) })

	is.down.Store(true)
	hits := is.hits.Load()
	xdstest.Eventually(t, "refreshes while the issuer is down", func() bool { return is.hits.Load() >= hits+3 })
	fresh := watchInboundKeys(t, xdsAddr).next(t)
	if !strings.Contains(fresh["https://issuer.test"], `"kid":"two"`) {
		t.Fatalf("with the issuer down, a new proxy gets %q, want the last keys", fresh["https://issuer.test"])
	}
}
