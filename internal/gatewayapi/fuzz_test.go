package gatewayapi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// FuzzConvertNeverPanicsAndStaysWithinItsInput converts routes, Gateways,
// ListenerSets and BackendTLSPolicies decoded from arbitrary YAML next to the golden
// cases' cluster: whatever the objects say, Convert returns, every object
// it produces is a Gateway, VirtualService or DestinationRule of a
// namespace it was given, every status it produces is for an object it
// was given, and no policy's status holds more than 16 ancestors.
func FuzzConvertNeverPanicsAndStaysWithinItsInput(f *testing.F) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	// A BackendTLSPolicy on a Service of the base, alone.
	f.Add([]byte(`{metadata: {name: p, namespace: default}, spec: {targetRefs: [{group: "", kind: Service, name: httpbin, sectionName: http}], validation: {hostname: a.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]}}}`))
	// A Gateway allowing ListenerSets, and (the same document) a set
	// naming it.
	f.Add([]byte(`{metadata: {name: web, namespace: edge}, spec: {gatewayClassName: flotilla, allowedListeners: {namespaces: {from: All}}, parentRef: {name: web}, listeners: [{name: a, port: 8080, protocol: HTTP}, {name: b, protocol: HTTPS}]}}`))
	base, err := os.ReadFile("testdata/http.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		in := decodeInput(t, base)
		var route gw.HTTPRoute
		if yaml.Unmarshal(doc, &route) == nil {
			in.HTTPRoutes = append(in.HTTPRoutes, &route)
		}
		var g gw.Gateway
		if yaml.Unmarshal(doc, &g) == nil {
			in.Gateways = append(in.Gateways, &g)
		}
		var tls gw.TLSRoute
		if yaml.Unmarshal(doc, &tls) == nil {
			in.TLSRoutes = append(in.TLSRoutes, &tls)
		}
		var policy gw.BackendTLSPolicy
		if yaml.Unmarshal(doc, &policy) == nil {
			in.BackendTLSPolicies = append(in.BackendTLSPolicies, &policy)
		}
		var set gw.ListenerSet
		if yaml.Unmarshal(doc, &set) == nil {
			in.ListenerSets = append(in.ListenerSets, &set)
		}
		namespaces := map[string]bool{}
		for _, o := range in.Gateways {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.HTTPRoutes {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.TLSRoutes {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.BackendTLSPolicies {
			namespaces[o.Namespace] = true
		}
		for _, o := range in.ListenerSets {
			namespaces[o.Namespace] = true
		}
		out := gatewayapi.Convert(in)
		for _, o := range out.Objects {
			if o.Kind.Kind != "Gateway" && o.Kind.Kind != "VirtualService" && o.Kind.Kind != "DestinationRule" {
				t.Fatalf("produced a %s", o.Kind.Kind)
			}
			if !namespaces[o.Meta.Namespace] {
				t.Fatalf("produced %s in namespace %q, which no input has", o, o.Meta.Namespace)
			}
			// A "~", which no Kubernetes object's name can hold.
			if !strings.Contains(o.Meta.Name, "~") {
				t.Fatalf("produced %s, whose name a user's object could have", o)
			}
		}
		for ref := range out.Routes {
			if !namespaces[ref.Namespace] {
				t.Fatalf("status for %s, which was not given", ref)
			}
		}
		for ref := range out.ListenerSets {
			if !namespaces[ref.Namespace] {
				t.Fatalf("status for %s, which was not given", ref)
			}
		}
		for ref, st := range out.Policies {
			if !namespaces[ref.Namespace] {
				t.Fatalf("status for %s, which was not given", ref)
			}
			if len(st.Ancestors) > 16 {
				t.Fatalf("%s has %d ancestors, more than the 16 a PolicyStatus holds", ref, len(st.Ancestors))
			}
		}
	})
}

// FuzzDeployOverlaysStayWithinTheGateway renders a Gateway's deployment
// under arbitrary parametersRef data (a user's ConfigMap): whatever it
// holds, Deploy returns, and every object it renders is of the Gateway's
// namespace, named after it and owned by it alone — an overlay cannot
// move, rename or re-own what galley applies.
func FuzzDeployOverlaysStayWithinTheGateway(f *testing.F) {
	for _, seed := range [][2]string{
		{"deployment", "spec:\n  replicas: 3\n"},
		{"service", "metadata:\n  annotations: {a: b}\n"},
		{"deployment", "metadata:\n  name: other\n"},
		{"horizontalPodAutoscaler", "spec: {maxReplicas: 4}\n"},
		{"podDisruptionBudget", "metadata: {namespace: kube-system}\n"},
		{"serviceAccount", "metadata: {ownerReferences: [{apiVersion: v1, kind: Pod, name: x, uid: y}]}\n"},
		{"deployment", "spec: [:"},
	} {
		f.Add(seed[0], seed[1])
	}
	g := &gw.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: "u1"},
		Spec:       gw.GatewaySpec{GatewayClassName: "flotilla", Listeners: []gw.Listener{{Name: "http", Port: 80, Protocol: gw.HTTPProtocolType}}},
	}
	f.Fuzz(func(t *testing.T, key, overlay string) {
		objs, err := gatewayapi.Deploy(gatewayapi.DeployInput{
			Gateway: g, Controller: gatewayapi.DefaultController, Values: inject.DefaultValues(),
			Parameters: map[string]string{key: overlay},
		})
		if err != nil {
			return
		}
		for _, o := range objs {
			if o.GetNamespace() != "apps" || !strings.HasPrefix(o.GetName(), "web-") {
				t.Fatalf("rendered %s/%s", o.GetNamespace(), o.GetName())
			}
			if refs := o.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != "u1" {
				t.Fatalf("%s owned by %v", o.GetName(), refs)
			}
		}
	})
}
