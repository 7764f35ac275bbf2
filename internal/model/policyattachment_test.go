package model

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// Istio's WorkloadPolicyMatcher.ShouldAttachPolicy, case by case.
func TestAPolicyAttachesBySelectorOrByTargetRefsToItsNamespacesGatewaysPods(t *testing.T) {
	gw := func(name, ns string) *typev1beta1.PolicyTargetReference {
		return &typev1beta1.PolicyTargetReference{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: name, Namespace: ns}
	}
	web := map[string]string{LabelGatewayName: "web", "app": "web"}
	for _, tc := range []struct {
		name     string
		selector map[string]string
		refs     []*typev1beta1.PolicyTargetReference
		policyNS string
		labels   map[string]string
		want     bool
	}{
		{"no selector, no targetRefs: every workload", nil, nil, "edge", map[string]string{"app": "x"}, true},
		{"a selector matching a gateway's pod: selectors apply to gateways too", map[string]string{"app": "web"}, nil, "edge", web, true},
		{"a selector not matching", map[string]string{"app": "api"}, nil, "edge", web, false},
		{"a targetRef to the Gateway", nil, []*typev1beta1.PolicyTargetReference{gw("web", "")}, "edge", web, true},
		{"a targetRef naming the policy's namespace", nil, []*typev1beta1.PolicyTargetReference{gw("web", "edge")}, "edge", web, true},
		{"a targetRef naming another namespace: never", nil, []*typev1beta1.PolicyTargetReference{gw("web", "other")}, "edge", web, false},
		{"a targetRef to another Gateway", nil, []*typev1beta1.PolicyTargetReference{gw("api", "")}, "edge", web, false},
		{"one of several targetRefs", nil, []*typev1beta1.PolicyTargetReference{gw("api", ""), gw("web", "")}, "edge", web, true},
		{"a targetRef and a matching selector: the selector is ignored", map[string]string{"app": "x"}, []*typev1beta1.PolicyTargetReference{gw("api", "")}, "edge", map[string]string{"app": "x"}, false},
		{"a targetRef from another namespace (the root's too)", nil, []*typev1beta1.PolicyTargetReference{gw("web", "")}, DefaultRootNamespace, web, false},
		{"a targetRef to a Service (waypoints only)", nil, []*typev1beta1.PolicyTargetReference{{Kind: "Service", Name: "web"}}, "edge", web, false},
		{"a targetRef of another group", nil, []*typev1beta1.PolicyTargetReference{{Group: "networking.istio.io", Kind: "Gateway", Name: "web"}}, "edge", web, false},
		{"a targetRef and a sidecar", nil, []*typev1beta1.PolicyTargetReference{gw("web", "")}, "edge", map[string]string{"app": "web"}, false},
	} {
		if got := attaches(tc.selector, tc.refs, tc.policyNS, "edge", tc.labels); got != tc.want {
			t.Errorf("%s: attaches = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Every kind of policy with targetRefs attaches to the pods of the
// Gateway API Gateway it names in its namespace, and to no other proxy.
func TestEveryPolicyKindWithATargetRefAppliesToItsGatewaysPodsOnly(t *testing.T) {
	refs := []*typev1beta1.PolicyTargetReference{{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "web"}}
	pc := newScopeStore(t).
		put(istio.AuthorizationPolicy, "edge", "ap", &security.AuthorizationPolicy{TargetRefs: refs}).
		put(istio.RequestAuthentication, "edge", "ra", &security.RequestAuthentication{TargetRefs: refs}).
		put(istio.EnvoyFilter, "edge", "ef", &networking.EnvoyFilter{TargetRefs: refs, ConfigPatches: []*networking.EnvoyFilter_EnvoyConfigObjectPatch{{
			ApplyTo: networking.EnvoyFilter_CLUSTER, Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_REMOVE},
		}}}).
		put(istio.WasmPlugin, "edge", "wp", &extensions.WasmPlugin{TargetRefs: refs, Url: "oci://registry.example.com/filter:1"}).
		put(istio.Telemetry, "edge", "tm", &telemetry.Telemetry{TargetRefs: refs, Tracing: []*telemetry.Tracing{{RandomSamplingPercentage: wrapperspb.Double(5)}}}).
		build()
	got := func(p *Proxy) string {
		return fmt.Sprintf("authz %d, authn %d, envoyfilters %v, extensions %d, tracing %d",
			len(pc.WorkloadAuthorizationPolicies(p.Namespace, p.Labels)), len(pc.WorkloadRequestAuthentications(p.Namespace, p.Labels)),
			pc.EnvoyFilters(p) != nil, len(pc.Extensions(p)), len(pc.ProxyTelemetry(p.Namespace, p.Labels).Tracing))
	}
	const all, none = "authz 1, authn 1, envoyfilters true, extensions 1, tracing 1", "authz 0, authn 0, envoyfilters false, extensions 0, tracing 0"
	for _, tc := range []struct {
		name string
		p    *Proxy
		want string
	}{
		{"the Gateway's pod", &Proxy{Type: RouterProxy, Namespace: "edge", Labels: map[string]string{LabelGatewayName: "web"}}, all},
		{"another Gateway's pod", &Proxy{Type: RouterProxy, Namespace: "edge", Labels: map[string]string{LabelGatewayName: "api"}}, none},
		{"a Gateway of that name in another namespace", &Proxy{Type: RouterProxy, Namespace: "shop", Labels: map[string]string{LabelGatewayName: "web"}}, none},
		{"a sidecar of the namespace", &Proxy{Type: SidecarProxy, Namespace: "edge", Labels: map[string]string{"app": "web"}}, none},
	} {
		if g := got(tc.p); g != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, g, tc.want)
		}
	}
}
