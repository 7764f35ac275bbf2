package galley_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestAPatchDiscoveryCannotApplyIsInTheEnvoyFiltersStatusUntilFixed runs
// galley on a real apiserver and discovery subscribed to it over mTLS. An
// EnvoyFilter whose patch would leave a gateway's connection manager
// without its router at the end is not sent; discovery reports it, and
// galley writes it in the EnvoyFilter's status; fixed, the status is
// cleared.
func TestAPatchDiscoveryCannotApplyIsInTheEnvoyFiltersStatusUntilFixed(t *testing.T) {
	ctx := context.Background()
	m := newGatewayMesh(t, map[string]string{"edge": "edge-v1"})
	edge := m.namespaces["edge"]
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1alpha3", Resource: "envoyfilters"}
	ef := func(op string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal([]byte(`apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: after-router}
spec:
  workloadSelector: {labels: {istio: ingressgateway}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: GATEWAY
      listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}
    patch:
      operation: `+op+`
      value:
        name: late.lua
        typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, default_source_code: {inline_string: "-- late"}}
`), &u.Object); err != nil {
			t.Fatal(err)
		}
		return u
	}
	if _, err := dyn.Resource(gvr).Namespace(edge).Create(ctx, ef("INSERT_AFTER"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.startDiscovery(t, "--envoy-filter-report-check", "200ms")

	gatewayID := m.ca.IssueFiles(t, "gateway", "spiffe://cluster.local/ns/"+edge+"/sa/ingress")
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": edge, "LABELS": map[string]any{"istio": "ingressgateway"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialMTLS(t, m.ca, m.secure, gatewayID)).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "router~10.0.0.5~ingress-1." + edge + "~" + edge + ".svc.cluster.local", Metadata: md}, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	// ACK every response, so the gateway keeps taking pushes.
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		}
	}()

	messages := func() []any {
		u, err := dyn.Resource(gvr).Namespace(edge).Get(ctx, "after-router", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		msgs, _, _ := unstructured.NestedSlice(u.Object, "status", "validationMessages")
		return msgs
	}
	var last []any
	deadline := time.Now().Add(60 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if last = messages(); len(last) == 1 {
			break
		}
	}
	if len(last) != 1 {
		t.Fatalf("the EnvoyFilter's status within 60 s: %v", last)
	}
	msg := last[0].(map[string]any)
	typ, _ := msg["type"].(map[string]any)
	text, _ := msg["message"].(string)
	if msg["level"] != "WARNING" || typ["name"] != "EnvoyFilterPatchNotApplied" || !strings.Contains(text, "not applied in full to 1 proxy") ||
		!strings.Contains(text, "EnvoyFilter "+edge+"/after-router patch 0 (HTTP_FILTER INSERT_AFTER)") || !strings.Contains(text, "terminal") {
		t.Fatalf("status message %v", msg)
	}

	// Fixed (before the router): applied, and the status is cleared.
	u, err := dyn.Resource(gvr).Namespace(edge).Get(ctx, "after-router", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed := ef("INSERT_BEFORE")
	fixed.SetResourceVersion(u.GetResourceVersion())
	if _, err := dyn.Resource(gvr).Namespace(edge).Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if last = messages(); len(last) == 0 {
			return
		}
	}
	t.Fatalf("the status after the fix: %v", last)
}
