package galley_test

import (
	"context"
	"path/filepath"
	"testing"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

func TestKubernetesModeStreamsClusterConfigAndServicesToASubscriber(t *testing.T) {
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "galley")
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

	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vs := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: "greeter", Namespace: ns}}
	vs.Spec.Hosts = []string{"greeter"}
	vs.Spec.Http = []*networkingapi.HTTPRoute{{Route: []*networkingapi.HTTPRouteDestination{{Destination: &networkingapi.Destination{Host: "greeter"}}}}}
	if _, err := ic.NetworkingV1().VirtualServices(ns).Create(ctx, vs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "greeter"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sub.waitFor(t, "the VirtualService and the Service", func() bool {
		return sub.has(vsType(), ns+"/greeter") &&
			sub.has(registry.ServiceTypeURL, ns+"/greeter."+ns+".svc.cluster.local")
	})
	// Each object carries its generation (flotilla wait tracks it), which
	// a spec change moves (a status write, to the status subresource of
	// Istio's CRDs, would not).
	if g := sub.generation(vsType(), ns+"/greeter"); g != 1 {
		t.Fatalf("a new VirtualService came with generation %d, want 1", g)
	}
	got, err := ic.NetworkingV1().VirtualServices(ns).Get(ctx, "greeter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Hosts = append(got.Spec.Hosts, "greeter.example.com")
	if _, err := ic.NetworkingV1().VirtualServices(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sub.waitFor(t, "generation 2", func() bool { return sub.generation(vsType(), ns+"/greeter") == 2 })
	if err := ic.NetworkingV1().VirtualServices(ns).Delete(ctx, "greeter", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sub.waitFor(t, "the deletion", func() bool { return !sub.has(vsType(), ns+"/greeter") })
	// The status writer won its election (alone) and logged through slog.
	g.out.WaitFor(t, "leading: writing validation status")
}
