package webhook

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// warnings collects the warnings the apiserver relays to a client.
type warnings struct {
	mu  sync.Mutex
	all []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all = append(w.all, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.all
	w.all = nil
	return out
}

// istioGroups are the API groups of the kinds galley serves, as the
// chart's webhook names them.
func istioGroups() []string {
	var out []string
	for _, k := range istio.Kinds() {
		if !slices.Contains(out, k.Group) {
			out = append(out, k.Group)
		}
	}
	return out
}

// served is galley's webhook on 127.0.0.1, registered with the apiserver
// for every Istio kind in one namespace.
func serveRegistered(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	h, err := Handler(Options{Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t")})
	if err != nil {
		t.Fatal(err)
	}
	client := kubeenv.ServeWebhook(t, h, Path)
	err = env.RegisterValidating(ctx, "flotilla-galley-"+ns, kubeenv.Webhook{
		Name: "validation.flotilla.io", Client: client,
		Rules: []admregv1.RuleWithOperations{{
			Operations: []admregv1.OperationType{admregv1.Create, admregv1.Update},
			Rule: admregv1.Rule{
				APIGroups: istioGroups(), APIVersions: []string{"*"}, Resources: []string{"*"},
			},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// objects reads a test data file as unstructured objects placed in ns.
func objects(t *testing.T, file, ns string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, chunk := range strings.Split(string(data), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal([]byte(chunk), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetNamespace(ns)
		out = append(out, u)
	}
	return out
}

func gvr(u *unstructured.Unstructured) schema.GroupVersionResource {
	gv := u.GroupVersionKind()
	k, err := istio.ByAPIVersion(gv.GroupVersion().String(), gv.Kind)
	if err != nil {
		panic(err)
	}
	return schema.GroupVersionResource{Group: gv.Group, Version: gv.Version, Resource: k.Plural}
}

func TestTheAPIServerDeniesInvalidObjectsWithGalleysMessageAndAdmitsValidOnes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "webhook")
	if err != nil {
		t.Fatal(err)
	}
	serveRegistered(t, ctx, ns)
	warn := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testdata := filepath.Join("..", "..", "..", "internal", "validation", "testdata")
	invalid := objects(t, filepath.Join(testdata, "invalid.yaml"), ns)
	if len(invalid) < 30 {
		t.Fatalf("only %d invalid cases", len(invalid))
	}

	// The configuration reaches admission through an informer: wait until
	// the first invalid object is denied by the webhook.
	probe := invalid[0]
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gvr(probe)).Namespace(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "validation.flotilla.io"), nil
	})
	if err != nil {
		t.Fatalf("the webhook never took effect: %v", err)
	}

	for _, u := range invalid {
		want := u.GetAnnotations()["validation.flotilla.io/want"]
		t.Run("deny/"+u.GetKind()+"/"+u.GetName(), func(t *testing.T) {
			_, err := dyn.Resource(gvr(u)).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("admitted; want denial containing %q", want)
			}
			msg := err.Error()
			if !strings.Contains(msg, `admission webhook "validation.flotilla.io" denied the request`) || !strings.Contains(msg, want) {
				t.Fatalf("error %q, want galley's denial containing %q", msg, want)
			}
		})
	}
	for _, u := range objects(t, filepath.Join(testdata, "valid.yaml"), ns) {
		t.Run("admit/"+u.GetKind()+"/"+u.GetName(), func(t *testing.T) {
			if _, err := dyn.Resource(gvr(u)).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
				t.Fatalf("denied: %v", err)
			}
		})
	}
	warn.take()

	// An update is validated too, and warnings reach the client.
	dr := objects(t, filepath.Join(testdata, "valid.yaml"), ns)[5] // reviews-destination
	if dr.GetKind() != "DestinationRule" {
		t.Fatalf("test data moved: %s", dr.GetKind())
	}
	got, err := dyn.Resource(gvr(dr)).Namespace(ns).Get(ctx, dr.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(got.Object, int64(5), "spec", "trafficPolicy", "outlierDetection", "consecutiveErrors"); err != nil {
		t.Fatal(err)
	}
	got, err = dyn.Resource(gvr(dr)).Namespace(ns).Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w := warn.take(); len(w) != 1 || !strings.HasPrefix(w[0], "FLT0103 ") || !strings.Contains(w[0], "consecutiveErrors is deprecated") {
		t.Fatalf("warnings %v", w)
	}
	if err := unstructured.SetNestedField(got.Object, int64(500), "spec", "trafficPolicy", "outlierDetection", "maxEjectionPercent"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gvr(dr)).Namespace(ns).Update(ctx, got, metav1.UpdateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "maxEjectionPercent: 500 must be between 0 and 100") {
		t.Fatalf("invalid update: %v", err)
	}
}
