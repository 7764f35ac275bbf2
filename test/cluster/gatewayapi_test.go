package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"
)

// gatewayDeployed: a Gateway of Flotilla's class, applied as a user
// applies it, gets from galley's leader — running as its pod's service
// account, with the chart's RBAC — the ServiceAccount, Deployment and
// Service Istio's gateway deployment controller makes: named
// <gateway>-<class>, owned by the Gateway, with spec.infrastructure's
// labels and its parametersRef ConfigMap's overlay. The ReplicaSet
// controller makes the pods, kwok runs them, and the Gateway is
// Programmed on its Service's ready endpoints; a change of the
// parametersRef ConfigMap is applied; and when the Gateway is deleted the
// garbage collector takes everything made for it.
func gatewayDeployed(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	const ns, name, deployed = "edge", "web", "web-flotilla"
	c := env.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web-options"},
		Data:       map[string]string{"deployment": "spec:\n  replicas: 2\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gwc, err := gwclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gwc.GatewayV1().Gateways(ns).Create(ctx, &gw.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			// No load balancer here: the Gateway's address is its cluster IP.
			"networking.istio.io/service-type": "ClusterIP",
		}},
		Spec: gw.GatewaySpec{
			GatewayClassName: "flotilla",
			Infrastructure: &gw.GatewayInfrastructure{
				Labels:        map[gw.LabelKey]gw.LabelValue{"team": "edge"},
				ParametersRef: &gw.LocalParametersReference{Group: "", Kind: "ConfigMap", Name: "web-options"},
			},
			Listeners: []gw.Listener{{Name: "http", Port: 80, Protocol: gw.HTTPProtocolType}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	injection, err := c.CoreV1().ConfigMaps(systemNamespace).Get(ctx, "flotilla-sidecar-injector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		ProxyImage       string `json:"proxyImage"`
		DiscoveryAddress string `json:"discoveryAddress"`
	}
	if err := yaml.Unmarshal([]byte(injection.Data["values"]), &values); err != nil || values.ProxyImage == "" {
		t.Fatalf("the chart's injection values %q: %v", injection.Data["values"], err)
	}
	owned := func(m metav1.ObjectMeta) error {
		if m.Labels["gateway.istio.io/managed"] != "flotilla.io-gateway-controller" || m.Labels["team"] != "edge" ||
			m.Labels["gateway.networking.k8s.io/gateway-name"] != name {
			return fmt.Errorf("%s has labels %v", m.Name, m.Labels)
		}
		if len(m.OwnerReferences) != 1 || m.OwnerReferences[0].UID != g.UID || m.OwnerReferences[0].Kind != "Gateway" {
			return fmt.Errorf("%s is owned by %v, want the Gateway %s", m.Name, m.OwnerReferences, g.UID)
		}
		return nil
	}
	replicas := func(n int32) func(context.Context) error {
		return func(ctx context.Context) error {
			d, err := c.AppsV1().Deployments(ns).Get(ctx, deployed, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := owned(d.ObjectMeta); err != nil {
				return err
			}
			if d.Spec.Replicas == nil || *d.Spec.Replicas != n {
				return fmt.Errorf("replicas %v, want %d", d.Spec.Replicas, n)
			}
			pod := d.Spec.Template.Spec
			if pod.ServiceAccountName != deployed || pod.Containers[0].Name != "istio-proxy" {
				return fmt.Errorf("pod spec: service account %q, containers %v", pod.ServiceAccountName, pod.Containers)
			}
			// The proxy the chart's injection configuration names, told
			// where discovery is by it.
			if pod.Containers[0].Image != values.ProxyImage || !slices.Contains(pod.Containers[0].Env, corev1.EnvVar{Name: "DISCOVERY_ADDRESS", Value: values.DiscoveryAddress}) {
				return fmt.Errorf("proxy image %q, env %v; want %q and DISCOVERY_ADDRESS %q", pod.Containers[0].Image, pod.Containers[0].Env, values.ProxyImage, values.DiscoveryAddress)
			}
			return nil
		}
	}
	cp.eventually(t, ctx, time.Minute, "the gateway's Deployment, with the parametersRef's 2 replicas", replicas(2))
	cp.eventually(t, ctx, 30*time.Second, "the gateway's Service and ServiceAccount", func(ctx context.Context) error {
		svc, err := c.CoreV1().Services(ns).Get(ctx, deployed, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := owned(svc.ObjectMeta); err != nil {
			return err
		}
		var ports []int32
		for _, p := range svc.Spec.Ports {
			ports = append(ports, p.Port)
		}
		if svc.Spec.Type != corev1.ServiceTypeClusterIP || !slices.Equal(ports, []int32{15021, 80}) ||
			svc.Spec.Selector["gateway.networking.k8s.io/gateway-name"] != name {
			return fmt.Errorf("service %s ports %v selector %v", svc.Spec.Type, ports, svc.Spec.Selector)
		}
		sa, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, deployed, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return owned(sa.ObjectMeta)
	})
	// A ClusterIP Service's address is its name, as Istio reports it
	// (networking.istio.io/address-type: IPAddress would give the IP).
	host := deployed + "." + ns + ".svc.cluster.local"
	cp.eventually(t, ctx, time.Minute, "the Gateway Programmed on its pods' ready endpoints, its Service its address", func(ctx context.Context) error {
		cur, err := gwc.GatewayV1().Gateways(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range cur.Status.Conditions {
			if cond.Type == string(gw.GatewayConditionProgrammed) && cond.Status == metav1.ConditionTrue {
				if len(cur.Status.Addresses) != 1 || cur.Status.Addresses[0].Value != host ||
					cur.Status.Addresses[0].Type == nil || *cur.Status.Addresses[0].Type != gw.HostnameAddressType {
					return fmt.Errorf("addresses %v, want the hostname %s", cur.Status.Addresses, host)
				}
				return nil
			}
		}
		return fmt.Errorf("conditions %v", cur.Status.Conditions)
	})

	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "web-options", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["deployment"] = "spec:\n  replicas: 3\n"
	if _, err := c.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.eventually(t, ctx, time.Minute, "the changed parametersRef applied: 3 replicas", replicas(3))

	if err := gwc.GatewayV1().Gateways(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cp.eventually(t, ctx, time.Minute, "the garbage collector removing what was deployed for the Gateway", func(ctx context.Context) error {
		_, errD := c.AppsV1().Deployments(ns).Get(ctx, deployed, metav1.GetOptions{})
		_, errS := c.CoreV1().Services(ns).Get(ctx, deployed, metav1.GetOptions{})
		_, errA := c.CoreV1().ServiceAccounts(ns).Get(ctx, deployed, metav1.GetOptions{})
		for _, err := range []error{errD, errS, errA} {
			if !apierrors.IsNotFound(err) {
				return errors.Join(errors.New("still there"), err)
			}
		}
		return nil
	})
}
