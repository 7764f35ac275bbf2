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
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
)

const edsType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

// TestTheChartInstalledWithHelmRunsAsInACluster: `helm install --wait`
// of the chart; its pods, run as processes, find each other through the
// cluster (ca's roots ConfigMap, galley's and the injector's caBundles
// from ca, discovery subscribed to galley by its Service's name); the
// apiserver has galley refuse an invalid VirtualService and the injector
// add the sidecar to every pod the ReplicaSet controller creates in a
// labelled namespace; and a sidecar's ADS stream, through discovery's
// Service and on each replica's pod IP, gets the EndpointSlice
// controller's endpoints of the application's Service.
func TestTheChartInstalledWithHelmRunsAsInACluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const ns = "istio-system"
	cp := install(t, ctx, ns,
		"discovery.autoscaling.enabled=false", "discovery.replicaCount=2",
		"ca.replicaCount=1", "ca.podDisruptionBudget.enabled=false",
		"injector.replicaCount=1", "injector.podDisruptionBudget.enabled=false",
	)
	c := env.Client

	// ca's leader publishes the roots into every namespace; galley's and
	// the injector's leaders put them into their webhooks' caBundles.
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

	// The apiserver calls galley through its Service.
	app := "bookinfo"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: app, Labels: map[string]string{"istio-injection": "enabled"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vs := dyn.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}).Namespace(app)
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": "bad"},
		"spec": map[string]any{"hosts": []any{"reviews"}, "http": []any{map[string]any{
			"route": []any{map[string]any{"destination": map[string]any{"host": "reviews"}, "weight": int64(-5)}},
		}}},
	}}
	cp.eventually(t, ctx, time.Minute, "galley refuses an invalid VirtualService for the apiserver", func(ctx context.Context) error {
		_, err := vs.Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("the apiserver accepted it")
		}
		if !strings.Contains(err.Error(), `admission webhook "validation.flotilla.io" denied the request`) {
			return err
		}
		t.Logf("refused: %v", err)
		return nil
	})

	// A Deployment's pods, created by the ReplicaSet controller, pass
	// through the injector.
	const replicas = 3
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-v1", Labels: map[string]string{"app": "reviews", "version": "v1"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "reviews", "version": "v1"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "reviews", "version": "v1"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "reviews", Image: "docker.io/istio/examples-bookinfo-reviews-v1:1.20.2",
					Ports: []corev1.ContainerPort{{ContainerPort: 9080}},
				}}},
			},
		},
	}
	if _, err := c.AppsV1().Deployments(app).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services(app).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Labels: map[string]string{"app": "reviews"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "reviews"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	cp.eventually(t, ctx, 2*time.Minute, "the Deployment's pods injected and Ready", func(ctx context.Context) error {
		pods, err = podsOf(ctx, app, "app=reviews")
		if err != nil {
			return err
		}
		if len(pods) != replicas {
			rs, _ := c.AppsV1().ReplicaSets(app).List(ctx, metav1.ListOptions{})
			var conds []string
			for _, r := range rs.Items {
				for _, c := range r.Status.Conditions {
					conds = append(conds, c.Message)
				}
			}
			return fmt.Errorf("%d Ready pods, want %d (ReplicaSets: %v)", len(pods), replicas, conds)
		}
		return nil
	})
	var ips []string
	for _, p := range pods {
		if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" }) {
			t.Errorf("pod %s was not injected: containers %v", p.Name, p.Spec.Containers)
		}
		if p.Annotations["sidecar.istio.io/status"] == "" {
			t.Errorf("pod %s has no sidecar.istio.io/status annotation", p.Name)
		}
		ips = append(ips, net.JoinHostPort(p.Status.PodIP, "9080"))
	}
	slices.Sort(ips)

	// A sidecar of one of the pods asks discovery for the Service's
	// endpoints: through the Service (DNS, then kube-proxy) and at each
	// replica's own pod IP.
	discoveries, err := podsOf(ctx, ns, "app.kubernetes.io/name=flotilla-discovery")
	if err != nil || len(discoveries) != 2 {
		t.Fatalf("discovery pods: %d, %v", len(discoveries), err)
	}
	addrs := []string{"flotilla-discovery." + ns + ".svc:15010"}
	for _, d := range discoveries {
		addrs = append(addrs, net.JoinHostPort(d.Status.PodIP, "15010"))
	}
	node := fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", pods[0].Status.PodIP, pods[0].Name, app, app)
	cluster := "outbound|9080||reviews." + app + ".svc.cluster.local"
	for _, addr := range addrs {
		cp.eventually(t, ctx, time.Minute, "the endpoints from "+addr, func(ctx context.Context) error {
			got, err := endpoints(ctx, addr, node, cluster)
			if err != nil {
				return err
			}
			if !slices.Equal(got, ips) {
				return fmt.Errorf("endpoints %v, want the pods' %v", got, ips)
			}
			return nil
		})
	}
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
