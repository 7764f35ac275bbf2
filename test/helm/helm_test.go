// Package helm_test checks the chart (deploy/helm/flotilla) with the helm
// CLI pinned in tools/helm — lint, and rendering with several value sets —
// and installs what it renders into the real kube-apiserver from
// internal/kubeenv: every object must be accepted, and the RBAC it grants
// is what each service needs and no more (discovery: nothing at all).
package helm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/build"
)

var env *kubeenv.Env

func TestMain(m *testing.M) { os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{})) }

const namespace = "flotilla-system"

func chart(t *testing.T) (helm, dir string) {
	t.Helper()
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm = filepath.Join(root, "bin", "tools", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("%v: run `make tools` (helm is pinned in tools/helm)", err)
	}
	return helm, filepath.Join(root, "deploy", "helm", "flotilla")
}

func helmRun(t *testing.T, helm string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String() + errOut.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

func TestTheChartLintsAndRendersAndRefusesBadValues(t *testing.T) {
	helm, dir := chart(t)
	for name, set := range map[string][]string{
		"defaults": nil,
		"a revision, a registry, autoscaling everywhere, no HPA for discovery": {
			"--set", "injector.revision=canary", "--set", "global.imageRegistry=registry.example", "--set", "global.imageTag=v1.2.3",
			"--set", "galley.autoscaling.enabled=true", "--set", "ca.autoscaling.enabled=true", "--set", "discovery.autoscaling.enabled=false",
		},
		"no validation webhook": {"--set", "galley.validationWebhook.enabled=false"},
		"ingress and egress gateways": {
			"--set", "gateways.ingress.enabled=true", "--set", "gateways.egress.enabled=true",
			"--set", "gateways.ingress.autoscaling.enabled=false", "--set", "gateways.ingress.service.type=NodePort",
		},
		"validation failing open": {"--set", "galley.validationWebhook.failurePolicy=Ignore"},
		"scheduling": {
			"--set", "discovery.nodeSelector.pool=mesh", "--set-json", `discovery.tolerations=[{"key":"mesh","operator":"Exists"}]`,
			"--set-json", `discovery.affinity={"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":100,"podAffinityTerm":{"topologyKey":"kubernetes.io/hostname","labelSelector":{"matchLabels":{"app.kubernetes.io/name":"flotilla-discovery"}}}}]}}`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			if out, err := helmRun(t, helm, append([]string{"lint", "--strict", dir}, set...)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			out, err := helmRun(t, helm, append([]string{"template", "flotilla", dir, "-n", namespace}, set...)...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decode(out); err != nil {
				t.Fatal(err)
			}
		})
	}
	for name, set := range map[string][]string{
		"unknown top-level key":                {"--set", "galey.replicaCount=2"},
		"bad key type":                         {"--set", "ca.keyType=DSA"},
		"bad failure policy":                   {"--set", "injector.webhook.failurePolicy=Maybe"},
		"bad validation failure policy":        {"--set", "galley.validationWebhook.failurePolicy=Sometimes"},
		"no replicas":                          {"--set", "galley.replicaCount=0"},
		"a revision that is not a label value": {"--set", "injector.revision=Not_OK"},
		"a duration that is not one":           {"--set", "discovery.debounceQuiet=soon"},
		"a gateway Service of no known type":   {"--set", "gateways.ingress.enabled=true", "--set", "gateways.ingress.service.type=Magic"},
		"a gateway label that is no string":    {"--set", "gateways.ingress.enabled=true", "--set-json", `gateways.ingress.labels={"istio":1}`},
	} {
		t.Run("refuses "+name, func(t *testing.T) {
			if out, err := helmRun(t, helm, append([]string{"template", "flotilla", dir, "-n", namespace}, set...)...); err == nil {
				t.Fatalf("rendered:\n%.500s", out)
			}
		})
	}
}

func decode(rendered string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rendered), 4096)
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("rendered YAML: %w", err)
		}
		if len(o.Object) == 0 {
			continue
		}
		objs = append(objs, &o)
	}
}

// TestTheRenderedChartInstallsIntoARealAPIServer applies the CRDs and
// every rendered object (with the ingress and egress gateways on), as
// `helm install` would, and checks what the RBAC allows each service
// account.
func TestTheRenderedChartInstallsIntoARealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	helm, dir := chart(t)
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crds, err := os.ReadFile(filepath.Join(dir, "crds", "istio.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := helmRun(t, helm, "template", "flotilla", dir, "-n", namespace, "--set", "gateways.ingress.enabled=true", "--set", "gateways.egress.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	crdObjs, err := decode(string(crds))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(rendered)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	apply := func(objs []*unstructured.Unstructured) {
		t.Helper()
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				if o.GetNamespace() != namespace {
					t.Errorf("%s %s is in namespace %q, not the release's", gvk.Kind, o.GetName(), o.GetNamespace())
				}
				ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
			}
			if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldManager: "helm"}); err != nil {
				t.Errorf("the apiserver refused %s %s: %v", gvk.Kind, o.GetName(), err)
			}
		}
	}
	apply(crdObjs)
	apply(objs)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	t.Logf("installed %d CRDs and %d objects: %v", len(crdObjs), len(objs), kinds)
	for kind, want := range map[string]int{
		"Deployment": 6, "Service": 6, "ServiceAccount": 6, "PodDisruptionBudget": 6, "ConfigMap": 2,
		"MutatingWebhookConfiguration": 1, "ValidatingWebhookConfiguration": 1, "HorizontalPodAutoscaler": 3,
	} {
		if kinds[kind] != want {
			t.Errorf("%d %s objects, want %d", kinds[kind], kind, want)
		}
	}

	// Each container's Go runtime keeps within its memory limit: a
	// service sets 90 % of its container's limit itself
	// (internal/platform/memlimit), which a GOMEMLIMIT of the whole limit
	// would override; a gateway's agent gets GOMEMLIMIT from its
	// container's limit.
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		c, _ := containers[0].(map[string]any)
		env, _, _ := unstructured.NestedSlice(c, "env")
		fromLimit := false
		for _, e := range env {
			m, _ := e.(map[string]any)
			res, _, _ := unstructured.NestedString(m, "valueFrom", "resourceFieldRef", "resource")
			fromLimit = fromLimit || (m["name"] == "GOMEMLIMIT" && res == "limits.memory")
		}
		gateway := strings.HasSuffix(o.GetLabels()["app.kubernetes.io/component"], "-gateway")
		if gateway != fromLimit {
			t.Errorf("Deployment %s (a gateway: %v): GOMEMLIMIT from limits.memory: %v, want %v (env %v)", o.GetName(), gateway, fromLimit, gateway, env)
		}
	}

	// The configuration the chart ships is what galley accepts.
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		switch o.GetName() {
		case "istio":
			if _, err := istio.ParseMeshConfig([]byte(data["mesh"])); err != nil {
				t.Errorf("the mesh ConfigMap: %v", err)
			}
		case inject.ConfigMapName:
			c, err := inject.ParseConfig(inject.DefaultRevision, data[inject.ConfigMapTemplateKey], data[inject.ConfigMapValuesKey])
			if err != nil {
				t.Fatalf("the injection ConfigMap: %v", err)
			}
			if c.Values.DiscoveryAddress != "flotilla-discovery."+namespace+".svc:15012" || c.Values.ProxyImage != "flotilla-proxy:latest" {
				t.Errorf("injection values %+v", c.Values)
			}
		default:
			t.Errorf("unexpected ConfigMap %s", o.GetName())
		}
	}

	// Both webhooks fail closed by default; the injection webhook never
	// sees the control plane's namespace.
	val, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "flotilla-validator-"+namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := val.Webhooks[0].FailurePolicy; p == nil || *p != admregv1.Fail {
		t.Errorf("validation failurePolicy %v", p)
	}
	hook, err := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "flotilla-sidecar-injector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range hook.Webhooks {
		if w.FailurePolicy == nil || *w.FailurePolicy != admregv1.Fail || !excludes(w.NamespaceSelector, namespace) {
			t.Errorf("webhook %s: failurePolicy %v, namespaceSelector %v", w.Name, w.FailurePolicy, w.NamespaceSelector)
		}
	}

	// What each service account may do (SubjectAccessReview, as the
	// apiserver's RBAC authorizer decides).
	type check struct {
		sa              string
		verb, group, rs string
		ns, name, sub   string
		allowed         bool
	}
	checks := []check{
		// discovery: nothing at all.
		{"flotilla-discovery", "list", "", "pods", "", "", "", false},
		{"flotilla-discovery", "get", "", "configmaps", namespace, "istio", "", false},
		{"flotilla-discovery", "list", "networking.istio.io", "virtualservices", "", "", "", false},
		{"flotilla-discovery", "get", "", "secrets", namespace, "istio-ca-secret", "", false},
		{"flotilla-discovery", "create", "authentication.k8s.io", "tokenreviews", "", "", "", false},
		// galley: reads what it normalises, writes only status and its Lease.
		{"flotilla-galley", "watch", "networking.istio.io", "virtualservices", "", "", "", true},
		{"flotilla-galley", "update", "networking.istio.io", "virtualservices", "app", "vs", "status", true},
		{"flotilla-galley", "update", "networking.istio.io", "virtualservices", "app", "vs", "", false},
		{"flotilla-galley", "list", "discovery.k8s.io", "endpointslices", "", "", "", true},
		{"flotilla-galley", "list", "", "pods", "", "", "", true},
		{"flotilla-galley", "create", "", "pods", "app", "", "", false},
		{"flotilla-galley", "list", "", "configmaps", namespace, "", "", true},
		{"flotilla-galley", "list", "", "configmaps", "app", "", "", false},
		// Secrets everywhere, for credentialName (galley.secretNamespaces
		// limits it; see the chart README).
		{"flotilla-galley", "list", "", "secrets", "app", "", "", true},
		{"flotilla-galley", "update", "", "secrets", "app", "tls", "", false},
		{"flotilla-galley", "update", "coordination.k8s.io", "leases", namespace, "flotilla-galley-status", "", true},
		{"flotilla-galley", "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "flotilla-validator-" + namespace, "", true},
		{"flotilla-galley", "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "another", "", false},
		{"flotilla-galley", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "flotilla-sidecar-injector", "", false},
		// ca: TokenReview, its own Secrets, root ConfigMaps everywhere.
		{"flotilla-ca", "create", "authentication.k8s.io", "tokenreviews", "", "", "", true},
		{"flotilla-ca", "get", "", "secrets", namespace, "istio-ca-secret", "", true},
		{"flotilla-ca", "get", "", "secrets", namespace, "someone-elses", "", false},
		{"flotilla-ca", "get", "", "secrets", "app", "istio-ca-secret", "", false},
		{"flotilla-ca", "update", "", "configmaps", "app", "istio-ca-root-cert", "", true},
		{"flotilla-ca", "list", "", "pods", "", "", "", false},
		// injector: its own webhook configuration only.
		{"flotilla-injector", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "flotilla-sidecar-injector", "", true},
		{"flotilla-injector", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "another", "", false},
		{"flotilla-injector", "list", "", "namespaces", "", "", "", false},
		{"flotilla-injector", "get", "", "secrets", namespace, "istio-ca-secret", "", false},
		// gateways: nothing (their certificates come from ca, their
		// configuration from discovery).
		{"istio-ingressgateway", "get", "", "secrets", namespace, "some-tls-cert", "", false},
		{"istio-ingressgateway", "list", "", "pods", "", "", "", false},
		{"istio-egressgateway", "list", "", "services", "", "", "", false},
	}
	for _, c := range checks {
		sar, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + namespace + ":" + c.sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{
				Verb: c.verb, Group: c.group, Resource: c.rs, Namespace: c.ns, Name: c.name, Subresource: c.sub,
			},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.allowed {
			t.Errorf("%s may %s %s/%s %s (ns %q, name %q): %v, want %v", c.sa, c.verb, c.group, c.rs, c.sub, c.ns, c.name, sar.Status.Allowed, c.allowed)
		}
	}

	// The same objects again: helm upgrade of an unchanged chart must be
	// accepted too (no immutable field trips).
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "helm", Force: true}); err != nil && !apierrors.IsConflict(err) {
			t.Errorf("re-applying %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	}
}

func excludes(sel *metav1.LabelSelector, ns string) bool {
	if sel == nil {
		return false
	}
	for _, e := range sel.MatchExpressions {
		if e.Key == "kubernetes.io/metadata.name" && e.Operator == metav1.LabelSelectorOpNotIn {
			for _, v := range e.Values {
				if v == ns {
					return true
				}
			}
		}
	}
	return false
}
