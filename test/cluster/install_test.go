package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

const edsType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

// TestFlotillaInAWholeCluster: `helm install --wait` of the chart, its
// pods run as processes, then the steps below in order, on that one
// control plane.
func TestFlotillaInAWholeCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 16*time.Minute)
	defer cancel()
	cp := install(t, ctx, systemNamespace, chartValues...)
	defer func() {
		if cp.stopSidecars != nil {
			cp.stopSidecars()
		}
	}()
	for _, step := range []struct {
		name string
		run  func(testing.TB, context.Context, *controlPlane)
	}{
		{"the pods find each other through the cluster and the apiserver calls their webhooks", podsFindEachOther},
		{"every pod of bookinfo is injected and its sidecar gets every service's endpoints", bookinfo},
		{"a rolling update and scaling are followed by every sidecar, never empty, nothing stale", rollout},
		{"the apiserver's watches do not grow with discovery's replicas, unlike informers per replica", apiserverLoad},
		{"galley's leader lost: its leases move, and the sidecars get nothing that did not change", galleyLeaderLost},
		{"the apiserver restarted: galley withdraws nothing, and the sidecars get nothing that did not change", apiserverRestarted},
		{"a Gateway of Flotilla's class is deployed by galley's leader, Programmed on its pods, and removed with the Gateway", gatewayDeployed},
		{"the Gateway API's conformance tests of status pass on what galley's leader writes", gatewayConformance},
		{"a revision injecting Istio's proxyv2: its pilot-agent gets the pod's certificate and relays config from discovery", istioSidecarRevision},
	} {
		if !t.Run(step.name, func(t *testing.T) { step.run(t, ctx, cp) }) {
			return
		}
	}
}

// chartValues are the chart's settings in these tests: two discovery
// replicas (no autoscaler to change that) with plain-text xDS open (the
// tests' raw ADS clients use it), one ca and one injector (so no
// PodDisruptionBudget).
var chartValues = []string{
	"discovery.autoscaling.enabled=false", "discovery.replicaCount=2", "discovery.plaintextXDS.enabled=true",
	"ca.replicaCount=1", "ca.podDisruptionBudget.enabled=false",
	"injector.replicaCount=1", "injector.podDisruptionBudget.enabled=false",
}

const (
	systemNamespace = "istio-system"
	appNamespace    = "bookinfo"
)

// podsFindEachOther: ca's leader publishes its roots (istio-ca-root-cert),
// galley's and the injector's leaders put them into their webhooks'
// caBundles, and the apiserver, calling galley through its Service at a
// pod's IP, has it refuse an invalid VirtualService.
func podsFindEachOther(t testing.TB, ctx context.Context, cp *controlPlane) { //nolint:thelper // a step: the subtest of its own
	ns, c := systemNamespace, env.Client

	var roots string
	cp.eventually(t, ctx, time.Minute, "ca's roots in istio-ca-root-cert", func(ctx context.Context) error {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return err
		}
		roots = cm.Data["root-cert.pem"]
		if !strings.Contains(roots, "BEGIN CERTIFICATE") {
			return fmt.Errorf("root-cert.pem: %q", roots)
		}
		return nil
	})
	cp.eventually(t, ctx, time.Minute, "the webhooks' caBundles are ca's roots", func(ctx context.Context) error {
		v, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "flotilla-validator-"+ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		m, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "flotilla-sidecar-injector", metav1.GetOptions{})
		if err != nil {
			return err
		}
		bundles := []string{string(v.Webhooks[0].ClientConfig.CABundle)}
		for _, w := range m.Webhooks {
			bundles = append(bundles, string(w.ClientConfig.CABundle))
		}
		for _, b := range bundles {
			if b != roots {
				return fmt.Errorf("a caBundle of %d bytes, not the %d of ca's roots", len(b), len(roots))
			}
		}
		return nil
	})

	app := appNamespace
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: app, Labels: map[string]string{"istio-injection": "enabled"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	galleyRefuses(t, ctx, cp)
}

// galleyRefuses: the apiserver, calling galley's webhook through its
// Service at a pod's IP, has it refuse an invalid VirtualService.
func galleyRefuses(tb testing.TB, ctx context.Context, cp *controlPlane) {
	tb.Helper()
	app := appNamespace
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	vs := dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}).Namespace(app)
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": "bad"},
		"spec": map[string]any{"hosts": []any{"reviews"}, "http": []any{map[string]any{
			"route": []any{map[string]any{"destination": map[string]any{"host": "reviews"}, "weight": int64(-5)}},
		}}},
	}}
	cp.eventually(tb, ctx, time.Minute, "galley refuses an invalid VirtualService for the apiserver", func(ctx context.Context) error {
		_, err := vs.Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("the apiserver accepted it")
		}
		if !strings.Contains(err.Error(), `admission webhook "validation.flotilla.io" denied the request`) {
			return err
		}
		tb.Logf("refused: %v", err)
		return nil
	})
}

// endpoints opens an ADS stream to addr as node, asks for cluster's
// endpoints and returns the first answer's addresses, sorted.
func endpoints(ctx context.Context, addr, node, cluster string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: edsType, ResourceNames: []string{cluster}}); err != nil {
		return nil, err
	}
	resp, err := st.Recv()
	if err != nil {
		return nil, err
	}
	var got []string
	for _, r := range resp.GetResources() {
		var cla endpointv3.ClusterLoadAssignment
		if err := r.UnmarshalTo(&cla); err != nil {
			return nil, err
		}
		if err := cla.Validate(); err != nil {
			return nil, err
		}
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				got = append(got, net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue())))
			}
		}
	}
	if len(resp.GetResources()) == 0 {
		return nil, errors.New("no ClusterLoadAssignment")
	}
	slices.Sort(got)
	return got, nil
}

func ptr[T any](v T) *T { return &v }
