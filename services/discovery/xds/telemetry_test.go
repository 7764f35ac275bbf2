package xds_test

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Over a real stream: a proxy whose node lists Istio's stats and
// peer-metadata extensions (Istio's build of Envoy) gets Istio's stats
// filter in its listeners; one on upstream Envoy, in the same mesh, does
// not, and both get the access log the mesh configures.
func TestOnlyAProxyOnIstiosEnvoyGetsIstiosStatsFilters(t *testing.T) {
	h := newHarness(t)
	mesh, err := istio.ParseMeshConfig([]byte("accessLogFile: /dev/stdout\ndefaultProviders: {metrics: [prometheus]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.store.PutMesh(mesh)
	h.store.PutService(service("a", 80))
	h.store.PutEndpointSet(endpoints("a", "10.1.1.1"))
	h.push()
	listeners := func(n *corev3.Node) string {
		s := h.sotw(t)
		s.send(t, &discoveryv3.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ListenerType})
		var all strings.Builder
		for _, a := range s.next(t).GetResources() {
			var l listenerv3.Listener
			if err := a.UnmarshalTo(&l); err != nil {
				t.Fatal(err)
			}
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					all.WriteString(f.GetName() + " " + string(f.GetTypedConfig().GetValue()) + "\n")
				}
			}
		}
		return all.String()
	}
	istioEnvoy := node(sidecarID, nil)
	for _, u := range proxycontract.IstioTelemetryTypeURLs {
		istioEnvoy.Extensions = append(istioEnvoy.Extensions, &corev3.Extension{Name: u, TypeUrls: []string{u}})
	}
	got := listeners(istioEnvoy)
	if !strings.Contains(got, "istio.stats") || !strings.Contains(got, "istio.metadata_exchange") || !strings.Contains(got, "/dev/stdout") {
		t.Fatalf("Istio's Envoy: no stats, metadata exchange or access log in its listeners:\n%.2000s", got)
	}
	got = listeners(node(strings.Replace(sidecarID, "~10.", "~11.", 1), nil))
	if strings.Contains(got, "istio.stats") || strings.Contains(got, "istio.metadata_exchange") || !strings.Contains(got, "/dev/stdout") {
		t.Fatalf("upstream Envoy: Istio's filters present or access log missing:\n%.2000s", got)
	}
}
