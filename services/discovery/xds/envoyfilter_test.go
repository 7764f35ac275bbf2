package xds_test

import (
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

func TestWhatProxiesMetApplyingAnEnvoyFilterIsKnownByEnvoyFilterUntilFixed(t *testing.T) {
	h := newHarness(t)
	h.store.PutService(service("a", 80))
	value, err := structpb.NewStruct(map[string]any{"connect_timeout": "-1s"})
	if err != nil {
		t.Fatal(err)
	}
	h.store.PutObject(breaking(value))
	h.push()
	s := h.sotw(t)
	s.send(t, &discoveryv3.DiscoveryRequest{Node: node(sidecarID, nil), TypeUrl: resourcev3.ClusterType})
	s.send(t, ack(s.next(t)))
	xdstest.Eventually(t, "the EnvoyFilter's finding", func() bool {
		f := h.srv.EnvoyFilterFindings()
		return len(f) == 1 && f[0].Namespace == "default" && f[0].Name == "breaks" && f[0].Proxies == 1 &&
			strings.Contains(strings.Join(f[0].Problems, "\n"), "EnvoyFilter default/breaks patch 0 (CLUSTER MERGE): makes cluster outbound|80||a.default.svc.cluster.local invalid")
	})
	// A response of another type, built with a generator of its own,
	// finds nothing of clusters: what the clusters' response found stays.
	s.send(t, &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType})
	s.send(t, ack(s.next(t)))
	if f := h.srv.EnvoyFilterFindings(); len(f) != 1 || f[0].Name != "breaks" {
		t.Fatalf("after the listeners' response the findings are %+v", f)
	}
	// Fixed: the proxy's next push carries the patch, and nothing is
	// found any more.
	fixed, _ := structpb.NewStruct(map[string]any{"per_connection_buffer_limit_bytes": 1024.0})
	h.store.PutObject(breaking(fixed))
	h.push()
	s.send(t, ack(s.next(t)))
	xdstest.Eventually(t, "the finding gone once the patch applies", func() bool { return len(h.srv.EnvoyFilterFindings()) == 0 })
}

func breaking(value *structpb.Struct) *istio.Object {
	k, _ := istio.ByName(istio.EnvoyFilter)
	return &istio.Object{Kind: k, Meta: istio.Meta{Name: "breaks", Namespace: "default"}, Spec: &networking.EnvoyFilter{
		ConfigPatches: []*networking.EnvoyFilter_EnvoyConfigObjectPatch{{
			ApplyTo: networking.EnvoyFilter_CLUSTER,
			Patch:   &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_MERGE, Value: value},
		}},
	}}
}
