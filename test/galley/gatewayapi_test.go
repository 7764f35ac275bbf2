package galley_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// gatewayAPICRDs are the Gateway API CRDs the chart installs.
func gatewayAPICRDs(t *testing.T) []*apiextv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile("../../deploy/helm/flotilla/crds/gateway-api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []*apiextv1.CustomResourceDefinition
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(doc), &crd); err != nil {
			t.Fatal(err)
		}
		if crd.Kind == "CustomResourceDefinition" {
			out = append(out, &crd)
		}
	}
	return out
}

// serviceWithEndpoint makes a Service with one port and an EndpointSlice
// giving it one ready endpoint, ip at targetPort: a gateway's pod, to
// the Gateway that names the Service.
func serviceWithEndpoint(t *testing.T, ns, svc, portName string, port, targetPort int32, ip string) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: portName, Port: port}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := true
	if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "test",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &targetPort}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// condition is the condition of type t, or the zero one.
func condition(conds []metav1.Condition, t string) metav1.Condition {
	i := slices.IndexFunc(conds, func(c metav1.Condition) bool { return c.Type == t })
	if i < 0 {
		return metav1.Condition{}
	}
	return conds[i]
}

// waitForStatus polls ok until it holds, for at most 30 s.
func waitForStatus(t *testing.T, what string, ok func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done, err := ok()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gatewayAPIGalley installs Istio's and the Gateway API's CRDs, makes
// a namespace (prefix-…) and starts galley in cluster mode with it as the
// system namespace, and a subscriber to galley; it returns once galley
// watches the Gateway API.
func gatewayAPIGalley(t *testing.T, prefix string) (string, *process, *subscriber) {
	t.Helper()
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, append(crdgen.All(), gatewayAPICRDs(t)...)...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	mcpAddr, adminAddr := proc.FreeAddr(t), proc.FreeAddr(t)
	g := startGalleyWith(t, adminAddr, "--kubeconfig", kubeconfig, "--mcp-address", mcpAddr, "--system-namespace", ns)
	sub := subscribe(t, mcpAddr)
	g.out.WaitFor(t, "watching the Gateway API")
	return ns, g, sub
}

// A Gateway and an HTTPRoute applied to the cluster reach galley's
// subscribers as the Istio Gateway and VirtualService Istio generates from
// them, and their status — written by galley's leader — says the route is
// bound, the listener has it, the Gateway is programmed on its Service; a
// route to a Service that is not there says so.
func TestTheGatewayAPIIsServedAsIstioConfigurationWithItsStatus(t *testing.T) {
	ctx := context.Background()
	ns, g, sub := gatewayAPIGalley(t, "gwapi")

	kube := env.Client
	// The Service the Gateway runs behind (<gateway>-<class>), with a
	// ready endpoint, and the route's backend.
	serviceWithEndpoint(t, ns, "web-flotilla", "http", 80, 8080, "10.1.0.1")
	if _, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "httpbin"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	gwc, err := gwclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	api := gwc.GatewayV1()
	all := gw.NamespacesFromSame
	if _, err := api.Gateways(ns).Create(ctx, &gw.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: gw.GatewaySpec{GatewayClassName: "flotilla", Listeners: []gw.Listener{{
			Name: "http", Port: 80, Protocol: gw.HTTPProtocolType,
			AllowedRoutes: &gw.AllowedRoutes{Namespaces: &gw.RouteNamespaces{From: &all}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	backend := func(svc string) []gw.HTTPRouteRule {
		p := gw.PortNumber(80)
		return []gw.HTTPRouteRule{{BackendRefs: []gw.HTTPBackendRef{{BackendRef: gw.BackendRef{
			BackendObjectReference: gw.BackendObjectReference{Name: gw.ObjectName(svc), Port: &p},
		}}}}}
	}
	if _, err := api.HTTPRoutes(ns).Create(ctx, &gw.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "bin"},
		Spec: gw.HTTPRouteSpec{
			CommonRouteSpec: gw.CommonRouteSpec{ParentRefs: []gw.ParentReference{{Name: "web"}}},
			Hostnames:       []gw.Hostname{"bin.example.com"},
			Rules:           backend("httpbin"),
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	sub.waitFor(t, "the generated Gateway and VirtualService", func() bool {
		return sub.has(kindURL("Gateway"), ns+"/web~istio-autogenerated-k8s-gateway~http") &&
			sub.has(vsType(), ns+"/"+ns+"~web~istio-autogenerated-k8s-gateway~http~bin.example.com")
	})

	waitStatus := func(what string, ok func() (bool, error)) { t.Helper(); waitForStatus(t, what, ok) }
	waitStatus("the route bound and its references resolved", func() (bool, error) {
		r, err := api.HTTPRoutes(ns).Get(ctx, "bin", metav1.GetOptions{})
		if err != nil || len(r.Status.Parents) != 1 {
			return false, err
		}
		p := r.Status.Parents[0]
		return p.ControllerName == "flotilla.io/gateway-controller" &&
			condition(p.Conditions, "Accepted").Status == metav1.ConditionTrue &&
			condition(p.Conditions, "ResolvedRefs").Status == metav1.ConditionTrue, nil
	})
	waitStatus("the Gateway accepted and programmed, its listener with one route", func() (bool, error) {
		g, err := api.Gateways(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) != 1 {
			return false, err
		}
		return condition(g.Status.Conditions, "Accepted").Status == metav1.ConditionTrue &&
			condition(g.Status.Conditions, "Programmed").Status == metav1.ConditionTrue &&
			g.Status.Listeners[0].AttachedRoutes == 1, nil
	})
	// The leader made the GatewayClasses it serves (flotilla, and istio
	// for Istio's manifests), and accepted them.
	for _, class := range []string{"flotilla", "istio"} {
		waitStatus("the GatewayClass "+class+" made and accepted", func() (bool, error) {
			c, err := api.GatewayClasses().Get(ctx, class, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil && condition(c.Status.Conditions, "Accepted").Status == metav1.ConditionTrue, err
		})
	}

	// The leader deploys the Gateway (no injection ConfigMap here: the
	// built-in values), but leaves the Service web-flotilla alone: it was
	// made by hand, without gateway.istio.io/managed, as Istio's
	// deployment controller leaves it.
	waitStatus("the gateway's Deployment and ServiceAccount", func() (bool, error) {
		d, err := kube.AppsV1().Deployments(ns).Get(ctx, "web-flotilla", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "web-flotilla", metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return false, nil
		}
		return d.Labels["gateway.istio.io/managed"] == "flotilla.io-gateway-controller" &&
			d.Spec.Template.Spec.Containers[0].Image == "flotilla-proxy:latest", nil
	})
	g.out.WaitFor(t, "not deploying over an object the gateway controller did not make")
	svc, err := kube.CoreV1().Services(ns).Get(ctx, "web-flotilla", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, managed := svc.Labels["gateway.istio.io/managed"]; managed || len(svc.OwnerReferences) != 0 || len(svc.Spec.Ports) != 1 {
		t.Fatalf("the hand-made Service was written: labels %v, owners %v, ports %v", svc.Labels, svc.OwnerReferences, svc.Spec.Ports)
	}

	// A backend that is not there.
	r, err := api.HTTPRoutes(ns).Get(ctx, "bin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.Spec.Rules = backend("missing")
	if _, err := api.HTTPRoutes(ns).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStatus("BackendNotFound", func() (bool, error) {
		r, err := api.HTTPRoutes(ns).Get(ctx, "bin", metav1.GetOptions{})
		if err != nil || len(r.Status.Parents) != 1 {
			return false, err
		}
		c := condition(r.Status.Parents[0].Conditions, "ResolvedRefs")
		return c.Status == metav1.ConditionFalse && c.Reason == string(gw.RouteReasonBackendNotFound) && c.ObservedGeneration == r.Generation, nil
	})

	// The route is deleted: its VirtualService goes.
	if err := api.HTTPRoutes(ns).Delete(ctx, "bin", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sub.waitFor(t, "the VirtualService withdrawn", func() bool {
		return !sub.has(vsType(), ns+"/"+ns+"~web~istio-autogenerated-k8s-gateway~http~bin.example.com")
	})
	g.out.WaitFor(t, "leading: writing the Gateway API's status")
}
