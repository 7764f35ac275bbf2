package kubeenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admregv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

var env *Env

func TestMain(m *testing.M) {
	// In a network namespace of the tests' own, where the cluster's pod
	// IPs are local (the cluster test serves a webhook at them).
	os.Exit(RunInNetworkNamespace(func() int { return RunTests(m, &env, Options{}) }))
}

var vsGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}

// virtualServiceCRD is a trimmed VirtualService CRD: the real schema is
// installed by the chart; this one keeps spec free-form.
func virtualServiceCRD() *apiextv1.CustomResourceDefinition {
	preserve := true
	schemaFor := &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextv1.JSONSchemaProps{
			"spec": {Type: "object", XPreserveUnknownFields: &preserve},
		},
	}}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "virtualservices.networking.istio.io"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "networking.istio.io",
			Names: apiextv1.CustomResourceDefinitionNames{
				Plural: "virtualservices", Singular: "virtualservice", Kind: "VirtualService",
				ListKind: "VirtualServiceList", ShortNames: []string{"vs"},
			},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schemaFor},
				{Name: "v1beta1", Served: true, Storage: false, Schema: schemaFor},
			},
		},
	}
}

func virtualService(ns, name string, hosts ...string) *unstructured.Unstructured {
	hs := make([]any, len(hosts))
	for i, h := range hosts {
		hs[i] = h
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "VirtualService",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       map[string]any{"hosts": hs},
	}}
}

func setup(t *testing.T) (context.Context, string, dynamic.Interface) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := env.InstallCRDs(ctx, virtualServiceCRD()); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, strings.ToLower(t.Name()[:min(len(t.Name()), 20)]))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, ns, dyn
}

func TestCRDObjectRoundTripsAndAnInformerSeesAddUpdateDelete(t *testing.T) {
	ctx, ns, dyn := setup(t)

	events := make(chan string, 16)
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	inf := factory.ForResource(vsGVR).Informer()
	name := func(obj any) string {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		u := obj.(*unstructured.Unstructured)
		hosts, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "hosts")
		return u.GetName() + " " + strings.Join(hosts, ",")
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { events <- "add " + name(obj) },
		UpdateFunc: func(_, obj any) { events <- "update " + name(obj) },
		DeleteFunc: func(obj any) { events <- "delete " + name(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}

	api := dyn.Resource(vsGVR).Namespace(ns)
	created, err := api.Create(ctx, virtualService(ns, "reviews", "reviews"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := api.Get(ctx, "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hosts, _, _ := unstructured.NestedStringSlice(got.Object, "spec", "hosts"); len(hosts) != 1 || hosts[0] != "reviews" {
		t.Fatalf("round trip hosts = %v", hosts)
	}
	expect(t, events, "add reviews reviews")

	if err := unstructured.SetNestedStringSlice(created.Object, []string{"reviews", "reviews.prod"}, "spec", "hosts"); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, events, "update reviews reviews,reviews.prod")

	if err := api.Delete(ctx, "reviews", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, events, "delete reviews reviews,reviews.prod")

	// The v1beta1 version is served too, as Istio's CRDs do.
	beta := virtualService(ns, "old", "old")
	beta.SetAPIVersion("networking.istio.io/v1beta1")
	betaGVR := vsGVR
	betaGVR.Version = "v1beta1"
	if _, err := dyn.Resource(betaGVR).Namespace(ns).Create(ctx, beta, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(t, events, "add old old")
}

func expect(t *testing.T, events <-chan string, want string) {
	t.Helper()
	select {
	case got := <-events:
		if got != want {
			t.Fatalf("informer event %q, want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no informer event, want %q", want)
	}
}

// webhook is an HTTPS admission webhook on 127.0.0.1.
type webhook struct {
	url      string
	caBundle []byte
	calls    atomic.Int64
}

func startWebhook(t *testing.T) *webhook {
	t.Helper()
	w := &webhook{}
	mux := http.NewServeMux()
	mux.HandleFunc("/validate", w.handle(validate))
	mux.HandleFunc("/mutate", w.handle(mutate))
	cc := ServeWebhook(t, mux, "")
	w.url, w.caBundle = *cc.URL, cc.CABundle
	return w
}

func (w *webhook) handle(decide func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		w.calls.Add(1)
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(rw, "malformed AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := decide(review.Request)
		resp.UID = review.Request.UID
		review.Response = resp
		review.Request = nil
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(&review)
	}
}

// validate denies VirtualServices for the host denied.example.com.
func validate(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	var vs struct {
		Spec struct {
			Hosts []string `json:"hosts"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(req.Object.Raw, &vs); err != nil {
		return &admissionv1.AdmissionResponse{Result: &metav1.Status{Message: err.Error()}}
	}
	for _, h := range vs.Spec.Hosts {
		if h == "denied.example.com" {
			return &admissionv1.AdmissionResponse{Result: &metav1.Status{
				Message: "spec.hosts[0]: host denied.example.com is not allowed",
			}}
		}
	}
	return &admissionv1.AdmissionResponse{Allowed: true}
}

// mutate adds a container named "injected" to pods.
func mutate(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	patch := []byte(`[{"op":"add","path":"/spec/containers/-","value":{"name":"injected","image":"flotilla/agent:test"}}]`)
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}
}

func TestTheAPIServerCallsHTTPSAdmissionWebhooksOnLoopback(t *testing.T) {
	ctx, ns, dyn := setup(t)
	w := startWebhook(t)
	fail := admregv1.Fail
	none := admregv1.SideEffectClassNone
	timeout := int32(5)
	onlyNS := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
	hook := func(path string) admregv1.WebhookClientConfig {
		u := w.url + path
		return admregv1.WebhookClientConfig{URL: &u, CABundle: w.caBundle}
	}
	rule := func(group, version, resource string) []admregv1.RuleWithOperations {
		return []admregv1.RuleWithOperations{{
			Operations: []admregv1.OperationType{admregv1.Create, admregv1.Update},
			Rule:       admregv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource}},
		}}
	}
	adm := env.Client.AdmissionregistrationV1()
	_, err := adm.ValidatingWebhookConfigurations().Create(ctx, &admregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "validate-" + ns},
		Webhooks: []admregv1.ValidatingWebhook{{
			Name: "validation.flotilla.test", ClientConfig: hook("/validate"),
			Rules:         rule("networking.istio.io", "*", "virtualservices"),
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout,
			NamespaceSelector: onlyNS, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = adm.MutatingWebhookConfigurations().Create(ctx, &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mutate-" + ns},
		Webhooks: []admregv1.MutatingWebhook{{
			Name: "inject.flotilla.test", ClientConfig: hook("/mutate"),
			Rules:         rule("", "v1", "pods"),
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout,
			NamespaceSelector: onlyNS, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	vs := dyn.Resource(vsGVR).Namespace(ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
	// Webhook configurations reach admission through an informer: poll with
	// dry-run requests until both take effect.
	dry := []string{metav1.DryRunAll}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, verr := vs.Create(ctx, virtualService(ns, "probe", "denied.example.com"), metav1.CreateOptions{DryRun: dry})
		p, perr := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: dry})
		return verr != nil && perr == nil && len(p.Spec.Containers) == 2, nil
	})
	if err != nil {
		t.Fatalf("webhooks never took effect: %v", err)
	}

	_, err = vs.Create(ctx, virtualService(ns, "bad", "denied.example.com"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "host denied.example.com is not allowed") {
		t.Fatalf("denied VirtualService: err = %v, want the webhook's message", err)
	}
	if _, err := vs.Create(ctx, virtualService(ns, "good", "reviews"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("allowed VirtualService: %v", err)
	}
	created, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range created.Spec.Containers {
		names = append(names, c.Name)
	}
	if fmt.Sprint(names) != "[app injected]" {
		t.Fatalf("pod containers %v, want [app injected]", names)
	}
	if w.calls.Load() < 4 {
		t.Fatalf("webhook saw %d calls", w.calls.Load())
	}
}

func TestTokenReviewAuthenticatesATokenOnlyForItsAudience(t *testing.T) {
	ctx, ns, _ := setup(t)
	if err := env.CreateServiceAccount(ctx, ns, "reviews"); err != nil {
		t.Fatal(err)
	}
	caToken, err := env.CreateToken(ctx, ns, "reviews", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherToken, err := env.CreateToken(ctx, ns, "reviews", []string{"some-other-service"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	review := func(token, audience string) *authnv1.TokenReviewStatus {
		t.Helper()
		r, err := env.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
			Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &r.Status
	}

	ok := review(caToken, "istio-ca")
	if !ok.Authenticated || ok.User.Username != "system:serviceaccount:"+ns+":reviews" {
		t.Fatalf("istio-ca token for istio-ca: %+v", ok)
	}
	if len(ok.Audiences) != 1 || ok.Audiences[0] != "istio-ca" {
		t.Fatalf("audiences %v", ok.Audiences)
	}
	if st := review(otherToken, "istio-ca"); st.Authenticated {
		t.Fatalf("a token for another audience was accepted for istio-ca: %+v", st)
	}
	if st := review(caToken, "some-other-service"); st.Authenticated {
		t.Fatalf("an istio-ca token was accepted for another audience: %+v", st)
	}
	if st := review("not-a-jwt", "istio-ca"); st.Authenticated {
		t.Fatal("garbage token authenticated")
	}
}

func TestStartFailsClearlyWithoutTheBinaries(t *testing.T) {
	_, err := Start(context.Background(), Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make kube-assets") {
		t.Fatalf("err = %v, want a pointer to make kube-assets", err)
	}
	// A cluster needs more: the first one missing is named.
	dir := t.TempDir()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(dir, b), nil, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	_, err = Start(context.Background(), Options{BinDir: dir, Cluster: &ClusterOptions{}})
	if err == nil || !strings.Contains(err.Error(), "kube-controller-manager not found") || !strings.Contains(err.Error(), "make kube-assets") {
		t.Fatalf("err = %v, want kube-controller-manager named and a pointer to make kube-assets", err)
	}
}
