// Package helm_test checks the chart (deploy/helm/flotilla) with the helm
// CLI pinned in tools/helm — lint, and rendering with several value sets —
// and installs what it renders into the real kube-apiserver from
// internal/testsupport/kubeenv: every object must be accepted, and the RBAC it grants
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
	"slices"
	"strconv"
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

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/test/build"
)

var env *kubeenv.Env

// binDir holds the services the revisions test runs.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, &env, "flotilla-galley", "flotilla-injector", "flotilla"))
}

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

// appVersion is the chart's appVersion, the images' default tag.
func appVersion(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := utilyaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q, %v", c.AppVersion, err)
	}
	return c.AppVersion
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
			"--set", "revision=canary", "--set", "global.imageRegistry=registry.example", "--set", "global.imageTag=v1.2.3",
			"--set", "galley.autoscaling.enabled=true", "--set", "ca.autoscaling.enabled=true", "--set", "discovery.autoscaling.enabled=false",
		},
		"a second revision, sharing galley and ca": {"--set", "revision=canary", "--set", "galley.enabled=false", "--set", "ca.enabled=false", "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.dashboards.enabled=true"},
		"no validation webhook":                    {"--set", "galley.validationWebhook.enabled=false"},
		"ingress and egress gateways": {
			"--set", "gateways.ingress.enabled=true", "--set", "gateways.egress.enabled=true",
			"--set", "gateways.ingress.autoscaling.enabled=false", "--set", "gateways.ingress.service.type=NodePort",
		},
		"validation failing open":             {"--set", "galley.validationWebhook.failurePolicy=Ignore"},
		"Istio's proxyv2 sidecar, a revision": {"--set", "injector.sidecar=proxyv2", "--set", "revision=canary"},
		"the istiod Service":                  {"--set", "discovery.istiodService.enabled=true"},
		"scheduling": {
			"--set", "discovery.nodeSelector.pool=mesh", "--set-json", `discovery.tolerations=[{"key":"mesh","operator":"Exists"}]`,
			"--set-json", `discovery.affinity={"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":100,"podAffinityTerm":{"topologyKey":"kubernetes.io/hostname","labelSelector":{"matchLabels":{"app.kubernetes.io/name":"flotilla-discovery"}}}}]}}`,
			"--set", "discovery.podAntiAffinityPreset=none",
		},
		"operator settings": operatorSettings,
		"ServiceMonitors":   {"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.interval=30s"},
		"one replica without a budget, a budget by maxUnavailable": {
			"--set", "galley.replicaCount=1", "--set", "galley.podDisruptionBudget.enabled=false",
			"--set", "ca.podDisruptionBudget.maxUnavailable=1", "--set", "injector.podDisruptionBudget.minAvailable=50%",
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
	// Each refusal names what was wrong; the chart's own checks (past the
	// schema) also name the way out.
	for name, c := range map[string]struct {
		set  []string
		want string
	}{
		"unknown top-level key": {[]string{"--set", "galey.replicaCount=2"}, "additional properties 'galey' not allowed"},
		// Misspelt keys of a service, a gateway and a nested setting:
		// each once rendered as if unset.
		"a misspelt service key":                       {[]string{"--set", "discovery.replicaCout=3"}, "at '/discovery': additional properties 'replicaCout' not allowed"},
		"an unknown service key":                       {[]string{"--set", "discovery.foo=1"}, "at '/discovery': additional properties 'foo' not allowed"},
		"a misspelt nested key":                        {[]string{"--set", "galley.validationWebhok.enabled=false"}, "at '/galley': additional properties 'validationWebhok' not allowed"},
		"a misspelt gateway key":                       {[]string{"--set", "gateways.ingress.enable=true"}, "at '/gateways/ingress': additional properties 'enable' not allowed"},
		"a misspelt toleration key":                    {[]string{"--set-json", `ca.tolerations=[{"key":"a","operater":"Exists"}]`}, "additional properties 'operater' not allowed"},
		"bad key type":                                 {[]string{"--set", "ca.keyType=DSA"}, "/ca/keyType"},
		"bad failure policy":                           {[]string{"--set", "injector.webhook.failurePolicy=Maybe"}, "/injector/webhook/failurePolicy"},
		"bad validation failure policy":                {[]string{"--set", "galley.validationWebhook.failurePolicy=Sometimes"}, "/galley/validationWebhook/failurePolicy"},
		"no replicas":                                  {[]string{"--set", "galley.replicaCount=0"}, "/galley/replicaCount"},
		"a revision that is not a label value":         {[]string{"--set", "revision=Not_OK"}, "/revision"},
		"a revision too long for the names made of it": {[]string{"--set", "revision=" + strings.Repeat("a", 41)}, "/revision"},
		"the revision where it used to be":             {[]string{"--set", "injector.revision=canary"}, "set revision=canary"},
		"a duration that is not one":                   {[]string{"--set", "discovery.debounceQuiet=soon"}, "/discovery/debounceQuiet"},
		"a gateway Service of no known type": {
			[]string{"--set", "gateways.ingress.enabled=true", "--set", "gateways.ingress.service.type=Magic"}, "/gateways/ingress/service/type",
		},
		"a gateway label that is no string": {
			[]string{"--set", "gateways.ingress.enabled=true", "--set-json", `gateways.ingress.labels={"istio":1}`}, "/gateways/ingress/labels/istio",
		},
		// Each of these was once silently ignored, or would block the
		// cluster's operations.
		"a replicaCount the autoscaler would override": {
			[]string{"--set", "discovery.replicaCount=5"}, "set discovery.autoscaling.enabled=false to fix the count",
		},
		"a gateway replicaCount the autoscaler would override": {
			[]string{"--set", "gateways.ingress.enabled=true", "--set", "gateways.ingress.replicaCount=3"}, "set gateways.ingress.autoscaling.enabled=false",
		},
		"minReplicas above maxReplicas": {[]string{"--set", "discovery.autoscaling.minReplicas=20"}, "discovery.autoscaling.minReplicas=20 is above maxReplicas=10"},
		"a budget no drain can satisfy (one replica)": {
			[]string{"--set", "galley.replicaCount=1"}, "galley.podDisruptionBudget.minAvailable=1 with 1 replica(s) at the fewest: every node drain would be blocked",
		},
		"a budget no drain can satisfy (autoscaled)": {
			[]string{"--set", "discovery.autoscaling.minReplicas=1"}, "discovery.podDisruptionBudget.minAvailable=1 with 1 replica(s)",
		},
		"a budget no drain can satisfy (a percentage)": {
			[]string{"--set", "ca.podDisruptionBudget.minAvailable=100%"}, "ca.podDisruptionBudget.minAvailable=100% with 2 replica(s)",
		},
		"a budget no drain can satisfy (maxUnavailable)": {
			[]string{"--set", "injector.podDisruptionBudget.maxUnavailable=0"}, "injector.podDisruptionBudget.maxUnavailable=0: every node drain would be blocked",
		},
		"a budget that is no number or percentage": {
			[]string{"--set", "injector.podDisruptionBudget.minAvailable=half"}, "/injector/podDisruptionBudget/minAvailable",
		},
		"a pod label replacing the chart's": {
			[]string{"--set", `galley.podLabels.app\.kubernetes\.io/name=other`}, "galley.podLabels.app.kubernetes.io/name: the chart sets that label",
		},
		"injecting the control plane": {
			[]string{"--set-string", `ca.podAnnotations.sidecar\.istio\.io/inject=true`}, "never injected",
		},
		"an own podAntiAffinity beside the preset": {
			[]string{"--set-json", `ca.affinity={"podAntiAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[{"topologyKey":"zone"}]}}`},
			"set ca.podAntiAffinityPreset=none to use your own",
		},
		"an anti-affinity preset of no known kind": {[]string{"--set", "ca.podAntiAffinityPreset=sometimes"}, "/ca/podAntiAffinityPreset"},
		"a topology spread constraint without its key": {
			[]string{"--set-json", `discovery.topologySpreadConstraints=[{"maxSkew":1,"whenUnsatisfiable":"DoNotSchedule"}]`}, "missing property 'topologyKey'",
		},
		"a second trust domain in meshConfig": {
			[]string{"--set", "meshConfig.trustDomain=other.example"}, "meshConfig.trustDomain=other.example differs from trustDomain=cluster.local",
		},
		"a second trust domain in the injection values": {
			[]string{"--set", "injector.values.trustDomain=other.example"}, "injector.values.trustDomain=other.example differs",
		},
		"an env variable the chart sets on a gateway": {
			[]string{"--set", "gateways.ingress.enabled=true", "--set", "gateways.ingress.env.TRUST_DOMAIN=other.example"}, "gateways.ingress.env.TRUST_DOMAIN: the chart sets that variable",
		},
		"an env name that is no variable name":    {[]string{"--set-json", `discovery.env={"1-BAD":"x"}`}, "'1-BAD' does not match pattern"},
		"a surge that is no number or percentage": {[]string{"--set", "discovery.rollingUpdate.maxSurge=lots"}, "/discovery/rollingUpdate/maxSurge"},
		"a scrape interval that is no duration":   {[]string{"--set", "metrics.serviceMonitor.interval=often"}, "/metrics/serviceMonitor/interval"},
		"a rollout that can never start": {
			[]string{"--set", "ca.rollingUpdate.maxSurge=0", "--set", "ca.rollingUpdate.maxUnavailable=0%"}, "ca.rollingUpdate: maxSurge and maxUnavailable are both 0",
		},
	} {
		t.Run("refuses "+name, func(t *testing.T) {
			out, err := helmRun(t, helm, append([]string{"template", "flotilla", dir, "-n", namespace}, c.set...)...)
			if err == nil {
				t.Fatalf("rendered:\n%.500s", out)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("refused with %v\nwant it to say %q", err, c.want)
			}
		})
	}
}

// operatorSettings sets each Deployment setting an operator reaches for,
// on different services; TestTheOperatorsSettingsReachThePods checks
// where each lands, and the install test has the apiserver accept them.
var operatorSettings = []string{
	"--set", "galley.replicaCount=3",
	"--set", "galley.rollingUpdate.maxSurge=1", "--set", "galley.rollingUpdate.maxUnavailable=0",
	"--set", "discovery.podLabels.team=mesh", "--set", `discovery.podAnnotations.example\.com/owner=mesh-team`,
	"--set-string", `discovery.podAnnotations.prometheus\.io/scrape=false`,
	"--set-json", `discovery.topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway"}]`,
	"--set", "discovery.priorityClassName=system-cluster-critical",
	"--set", "discovery.env.PILOT_EXTRA=1", "--set", "discovery.env.GOMEMLIMIT=700MiB",
	"--set", "discovery.podDisruptionBudget.maxUnavailable=1",
	"--set", "ca.podAntiAffinityPreset=hard",
	"--set-json", `injector.affinity={"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"preference":{"matchExpressions":[{"key":"pool","operator":"In","values":["mesh"]}]}}]}}`,
	"--set", "trustDomain=mesh.example",
	"--set", "gateways.ingress.enabled=true", "--set", "gateways.ingress.env.EXTRA=yes",
	"--set", "metrics.dashboards.enabled=true",
}

// TestTheOperatorsSettingsReachThePods renders operatorSettings and finds
// each where Kubernetes reads it; the defaults are checked beside them.
func TestTheOperatorsSettingsReachThePods(t *testing.T) {
	helm, dir := chart(t)
	objs := render(t, helm, dir, namespace, operatorSettings...)
	version := appVersion(t, dir)
	find := func(kind, name string) map[string]any {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() == kind && o.GetName() == name {
				return o.Object
			}
		}
		t.Fatalf("no %s %s rendered", kind, name)
		return nil
	}
	str := func(o map[string]any, path ...string) string {
		v, _, _ := unstructured.NestedFieldNoCopy(o, path...)
		if v == nil {
			return ""
		}
		return fmt.Sprint(v)
	}
	pod := func(deployment string) map[string]any {
		m, _, _ := unstructured.NestedMap(find("Deployment", deployment), "spec", "template")
		return m
	}
	type want struct{ what, got, want string }
	galley, discovery, ca, injector, ingress := pod("flotilla-galley"), pod("flotilla-discovery"), pod("flotilla-ca"), pod("flotilla-injector"), pod("istio-ingressgateway")
	envOf := func(p map[string]any) string {
		cs, _, _ := unstructured.NestedSlice(p, "spec", "containers")
		env, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "env")
		var b strings.Builder
		for _, e := range env {
			m := e.(map[string]any)
			if v, ok := m["value"]; ok {
				fmt.Fprintf(&b, "%s=%v ", m["name"], v)
			}
		}
		return strings.TrimSpace(b.String())
	}
	imageOf := func(p map[string]any) string {
		cs, _, _ := unstructured.NestedSlice(p, "spec", "containers")
		return fmt.Sprint(cs[0].(map[string]any)["image"])
	}
	mesh := str(find("ConfigMap", "istio"), "data", "mesh")
	injection := str(find("ConfigMap", inject.ConfigMapName), "data", inject.ConfigMapValuesKey)
	for _, c := range []want{
		// Replicas: fixed where there is no autoscaler, absent where there is one.
		{"galley replicas", str(find("Deployment", "flotilla-galley"), "spec", "replicas"), "3"},
		{"ca replicas (default)", str(find("Deployment", "flotilla-ca"), "spec", "replicas"), "2"},
		{"discovery replicas (autoscaled)", str(find("Deployment", "flotilla-discovery"), "spec", "replicas"), ""},
		// Rollouts: Istio's surge by default, the values' where given.
		{"galley surge", str(find("Deployment", "flotilla-galley"), "spec", "strategy", "rollingUpdate", "maxSurge") + "/" + str(find("Deployment", "flotilla-galley"), "spec", "strategy", "rollingUpdate", "maxUnavailable"), "1/0"},
		{"ca surge (default)", str(find("Deployment", "flotilla-ca"), "spec", "strategy", "rollingUpdate", "maxSurge") + "/" + str(find("Deployment", "flotilla-ca"), "spec", "strategy", "rollingUpdate", "maxUnavailable"), "100%/25%"},
		// Pod labels and annotations, beside the chart's.
		{"discovery pod label", str(discovery, "metadata", "labels", "team"), "mesh"},
		{"discovery selector label kept", str(discovery, "metadata", "labels", "app.kubernetes.io/name"), "flotilla-discovery"},
		{"discovery annotation", str(discovery, "metadata", "annotations", "example.com/owner"), "mesh-team"},
		{"discovery scrape turned off", str(discovery, "metadata", "annotations", "prometheus.io/scrape"), "false"},
		{"galley scrape", str(galley, "metadata", "annotations", "prometheus.io/scrape"), "true"},
		{"galley scrape port (its admin port)", str(galley, "metadata", "annotations", "prometheus.io/port"), "15015"},
		{"galley scrape path", str(galley, "metadata", "annotations", "prometheus.io/path"), "/metrics"},
		{"gateway scrape port (the agent's merged stats)", str(ingress, "metadata", "annotations", "prometheus.io/port") + str(ingress, "metadata", "annotations", "prometheus.io/path"), "15020/stats/prometheus"},
		{"never injected", str(discovery, "metadata", "annotations", "sidecar.istio.io/inject"), "false"},
		// Scheduling.
		{"discovery priority class", str(discovery, "spec", "priorityClassName"), "system-cluster-critical"},
		{"discovery spread counts its own pods", fmt.Sprint(discovery["spec"].(map[string]any)["topologySpreadConstraints"]), "[map[labelSelector:map[matchLabels:map[app.kubernetes.io/instance:flotilla app.kubernetes.io/name:flotilla-discovery]] maxSkew:1 topologyKey:topology.kubernetes.io/zone whenUnsatisfiable:ScheduleAnyway]]"},
		{"galley anti-affinity (default: preferred, per node)", str(galley, "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"), "[map[podAffinityTerm:map[labelSelector:map[matchLabels:map[app.kubernetes.io/instance:flotilla app.kubernetes.io/name:flotilla-galley]] topologyKey:kubernetes.io/hostname] weight:100]]"},
		{"ca anti-affinity (hard)", str(ca, "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"), "[map[labelSelector:map[matchLabels:map[app.kubernetes.io/instance:flotilla app.kubernetes.io/name:flotilla-ca]] topologyKey:kubernetes.io/hostname]]"},
		{"injector keeps its node affinity beside the preset", fmt.Sprint(str(injector, "spec", "affinity", "nodeAffinity") != "" && str(injector, "spec", "affinity", "podAntiAffinity") != ""), "true"},
		// Environment: sorted, after the chart's.
		{"discovery env", envOf(discovery), "GOMEMLIMIT=700MiB PILOT_EXTRA=1"},
		{"gateway env ends with the values'", envOf(ingress)[strings.LastIndex(envOf(ingress), " ")+1:], "EXTRA=yes"},
		// The disruption budget by maxUnavailable.
		{"discovery budget", str(find("PodDisruptionBudget", "flotilla-discovery"), "spec", "maxUnavailable") + "/" + str(find("PodDisruptionBudget", "flotilla-discovery"), "spec", "minAvailable"), "1/"},
		// Images: the chart's appVersion when no tag is given.
		{"galley image", imageOf(galley), "flotilla-galley:" + version},
		{"gateway image", imageOf(ingress), "flotilla-proxy:" + version},
		// One trust domain: ca issues in it, the mesh and the injected proxies use it.
		{"ca's trust domain", fmt.Sprint(hasArg(ca, "--trust-domain=mesh.example")), "true"},
		{"mesh trustDomain", fmt.Sprint(strings.Contains(mesh, "trustDomain: mesh.example")), "true"},
		{"injection trustDomain", fmt.Sprint(strings.Contains(injection, "trustDomain: mesh.example")), "true"},
		{"gateway trust domain", fmt.Sprint(strings.Contains(envOf(ingress), "TRUST_DOMAIN=mesh.example")), "true"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %q, want %q", c.what, c.got, c.want)
		}
	}
}

// hasArg reports whether the pod's first container has arg.
func hasArg(pod map[string]any, arg string) bool {
	cs, _, _ := unstructured.NestedSlice(pod, "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	for _, a := range args {
		if a == arg {
			return true
		}
	}
	return false
}

// render is helm template of the chart in namespace ns with args, as
// objects.
func render(t *testing.T, helm, dir, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderRelease(t, helm, dir, "flotilla", ns, args...)
}

// renderRelease is render of a release of another name.
func renderRelease(t *testing.T, helm, dir, release, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helmRun(t, helm, append([]string{"template", release, dir, "-n", ns}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
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
	objs := render(t, helm, dir, namespace, "--set", "gateways.ingress.enabled=true", "--set", "gateways.egress.enabled=true")
	crdObjs, err := decode(string(crds))
	if err != nil {
		t.Fatal(err)
	}
	rs := newResources(t)
	apply := func(objs []*unstructured.Unstructured) {
		t.Helper()
		for _, o := range objs {
			ri, namespaced := rs.of(t, o, o.GetNamespace())
			if namespaced && o.GetNamespace() != namespace {
				t.Errorf("%s %s is in namespace %q, not the release's", o.GetKind(), o.GetName(), o.GetNamespace())
			}
			if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldManager: "helm"}); err != nil {
				t.Errorf("the apiserver refused %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	apply(crdObjs)
	apply(objs)
	// The webhook configurations are cluster-wide and fail closed: left
	// behind, they would refuse the pods other tests create (their
	// Services have no endpoints here).
	t.Cleanup(func() {
		for _, o := range objs {
			if k := o.GetKind(); k == "MutatingWebhookConfiguration" || k == "ValidatingWebhookConfiguration" {
				ri, _ := rs.of(t, o, "")
				if err := ri.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}); err != nil {
					t.Errorf("deleting %s %s: %v", k, o.GetName(), err)
				}
			}
		}
	})
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
			c, err := inject.ParseConfig(controlplane.DefaultRevision, data[inject.ConfigMapTemplateKey], data[inject.ConfigMapValuesKey])
			if err != nil {
				t.Fatalf("the injection ConfigMap: %v", err)
			}
			if c.Values.DiscoveryAddress != "flotilla-discovery."+namespace+".svc:15012" || c.Values.ProxyImage != "flotilla-proxy:"+appVersion(t, dir) {
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
		// Every namespace's ConfigMaps, read only: a Gateway's
		// parametersRef and CA certificates (as istiod reads them).
		{"flotilla-galley", "list", "", "configmaps", "app", "", "", true},
		{"flotilla-galley", "update", "", "configmaps", "app", "x", "", false},
		// A Gateway's deployment, server-side applied; never deleted by
		// galley (the garbage collector removes it with the Gateway).
		{"flotilla-galley", "patch", "apps", "deployments", "app", "web-flotilla", "", true},
		{"flotilla-galley", "create", "", "serviceaccounts", "app", "", "", true},
		{"flotilla-galley", "patch", "", "services", "app", "web-flotilla", "", true},
		{"flotilla-galley", "patch", "autoscaling", "horizontalpodautoscalers", "app", "web-flotilla", "", true},
		{"flotilla-galley", "patch", "policy", "poddisruptionbudgets", "app", "web-flotilla", "", true},
		{"flotilla-galley", "delete", "apps", "deployments", "app", "web-flotilla", "", false},
		{"flotilla-galley", "create", "", "pods", "app", "", "", false},
		{"flotilla-galley", "create", "gateway.networking.k8s.io", "gatewayclasses", "", "", "", true},
		{"flotilla-galley", "delete", "gateway.networking.k8s.io", "gatewayclasses", "", "istio", "", false},
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
		// injector: mutating webhook configurations (its own, and its
		// revision's tags', whose names users choose: as istiod's role,
		// every one; it writes only its own and those labelled with its
		// revision and a tag), and nothing else.
		{"flotilla-injector", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "flotilla-sidecar-injector", "", true},
		{"flotilla-injector", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "istio-revision-tag-prod", "", true},
		{"flotilla-injector", "delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "istio-revision-tag-prod", "", false},
		{"flotilla-injector", "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "flotilla-validator-" + namespace, "", false},
		{"flotilla-injector", "list", "", "namespaces", "", "", "", false},
		{"flotilla-injector", "get", "", "secrets", namespace, "istio-ca-secret", "", false},
		// galley: whether a gateway's account may read its Secrets.
		{"flotilla-galley", "create", "authorization.k8s.io", "subjectaccessreviews", "", "", "", true},
		{"flotilla-galley", "watch", "rbac.authorization.k8s.io", "rolebindings", "", "", "", true},
		{"flotilla-galley", "update", "rbac.authorization.k8s.io", "rolebindings", "app", "x", "", false},
		// gateways: the Secrets of their namespace, which discovery checks
		// (through galley) before it serves them a credentialName's key, as
		// Istio's gateway chart grants; nothing else (their certificates
		// come from ca, their configuration from discovery).
		{"istio-ingressgateway", "list", "", "secrets", namespace, "", "", true},
		{"istio-ingressgateway", "get", "", "secrets", namespace, "some-tls-cert", "", true},
		{"istio-ingressgateway", "get", "", "secrets", "app", "some-tls-cert", "", false},
		{"istio-ingressgateway", "update", "", "secrets", namespace, "some-tls-cert", "", false},
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
		ri, _ := rs.of(t, o, o.GetNamespace())
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "helm", Force: true}); err != nil && !apierrors.IsConflict(err) {
			t.Errorf("re-applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// TestTheOperatorsSettingsAreAcceptedByARealAPIServer has the apiserver
// validate (server-side apply, dry run) every object the chart renders
// with operatorSettings: a topology spread, a surge or an affinity the
// chart put in the wrong shape would be refused here.
func TestTheOperatorsSettingsAreAcceptedByARealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	helm, dir := chart(t)
	ns, err := env.CreateNamespace(ctx, "settings")
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, helm, dir, ns, append([]string{"--skip-crds"}, operatorSettings...)...)
	rs := newResources(t)
	kinds := map[string]int{}
	for _, o := range objs {
		ri, _ := rs.of(t, o, ns)
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "helm", Force: true, DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the apiserver refused %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		kinds[o.GetKind()]++
	}
	if kinds["Deployment"] != 5 || kinds["PodDisruptionBudget"] != 5 || kinds["ConfigMap"] == 0 {
		t.Errorf("validated %v, want 5 Deployments and 5 PodDisruptionBudgets (the services and the ingress gateway), and the ConfigMaps", kinds)
	}
}

// resources finds the dynamic client of a rendered object's resource in
// the real apiserver, as helm does from its kind.
type resources struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newResources(t *testing.T) *resources {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &resources{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// of is o's resource, in namespace ns when it is namespaced (and
// whether it is).
func (r *resources) of(t *testing.T, o *unstructured.Unstructured, ns string) (dynamic.ResourceInterface, bool) {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return r.dyn.Resource(m.Resource).Namespace(ns), true
	}
	return r.dyn.Resource(m.Resource), false
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

// TestNOTESSaysWhatEachServiceGotAndWhatToDoNext renders NOTES.txt as
// helm install prints it (a dry run against the real apiserver): each
// service's replicas, fixed or autoscaled (and how to change which),
// and the namespace label for the release's revision.
func TestNOTESSaysWhatEachServiceGotAndWhatToDoNext(t *testing.T) {
	helm, dir := chart(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	// A namespace of its own: helm refuses to install over the objects
	// another test applied.
	ns, err := env.CreateNamespace(t.Context(), "notes")
	if err != nil {
		t.Fatal(err)
	}
	out, err := helmRun(t, helm, "install", "flotilla", dir, "-n", ns, "--dry-run=client", "--kubeconfig", kubeconfig,
		"--set", "galley.replicaCount=3", "--set", "revision=canary", "--set", "gateways.ingress.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	_, notes, ok := strings.Cut(out, "NOTES:\n")
	if !ok {
		t.Fatalf("no NOTES in:\n%.2000s", out)
	}
	version := appVersion(t, dir)
	for _, want := range []string{
		"Flotilla " + version + " is installed in namespace " + ns + " (release flotilla), trust domain cluster.local, revision canary.",
		"galley     flotilla-galley, image flotilla-galley:" + version + ", 3 replicas (galley.replicaCount; no autoscaler)",
		"discovery  flotilla-discovery-canary, image flotilla-discovery:" + version + ", 2–10 replicas, as the HorizontalPodAutoscaler decides (CPU 80 %); set discovery.autoscaling.enabled=false and discovery.replicaCount to fix the count",
		"ca         flotilla-ca, image flotilla-ca:" + version + ", 2 replicas",
		"injector   flotilla-injector-canary, image flotilla-injector:" + version,
		"ingress    gateway istio-ingressgateway, 2–5 replicas (autoscaled)",
		"kubectl label namespace <namespace> istio-injection- istio.io/rev=canary --overwrite",
		"flotilla proxy-status shows each proxy's revision",
		"flotilla check --kubeconfig <kubeconfig> --istio-namespace " + ns,
		"prometheus.io/scrape",
		"metrics.dashboards.enabled=true ships",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES lack %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "egress ") {
		t.Errorf("NOTES mention the egress gateway, which is off:\n%s", notes)
	}
}

// TestEachServiceMonitorSelectsItsServiceAndItsMetricsPort renders the
// Prometheus Operator's ServiceMonitors and checks what the operator
// would: each selects exactly one of the chart's Services, in the
// release's namespace, and names a port that Service has, which targets
// the port the pods' prometheus.io/port annotation names.
func TestEachServiceMonitorSelectsItsServiceAndItsMetricsPort(t *testing.T) {
	helm, dir := chart(t)
	objs := render(t, helm, dir, namespace, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prometheus")
	var monitors, services, deployments []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceMonitor":
			monitors = append(monitors, o)
		case "Service":
			services = append(services, o)
		case "Deployment":
			deployments = append(deployments, o)
		}
	}
	if len(monitors) != 4 {
		t.Fatalf("%d ServiceMonitors, want one per service (4)", len(monitors))
	}
	for _, m := range monitors {
		if m.GetLabels()["release"] != "prometheus" || m.GetNamespace() != namespace {
			t.Errorf("%s: labels %v, namespace %s", m.GetName(), m.GetLabels(), m.GetNamespace())
		}
		sel, _, _ := unstructured.NestedStringMap(m.Object, "spec", "selector", "matchLabels")
		names, _, _ := unstructured.NestedStringSlice(m.Object, "spec", "namespaceSelector", "matchNames")
		endpoints, _, _ := unstructured.NestedSlice(m.Object, "spec", "endpoints")
		if len(endpoints) != 1 || len(names) != 1 || names[0] != namespace {
			t.Fatalf("%s: endpoints %v, namespaces %v", m.GetName(), endpoints, names)
		}
		ep := endpoints[0].(map[string]any)
		var selected []*unstructured.Unstructured
		for _, s := range services {
			if labelsMatch(sel, s.GetLabels()) {
				selected = append(selected, s)
			}
		}
		if len(selected) != 1 || selected[0].GetName() != m.GetName() {
			t.Errorf("%s selects %d Services, want its own", m.GetName(), len(selected))
			continue
		}
		ports, _, _ := unstructured.NestedSlice(selected[0].Object, "spec", "ports")
		var port int64
		for _, p := range ports {
			if pm := p.(map[string]any); pm["name"] == ep["port"] {
				port, _ = strconv.ParseInt(fmt.Sprint(pm["port"]), 10, 64)
			}
		}
		var annotated string
		for _, d := range deployments {
			if d.GetName() == m.GetName() {
				annotated, _, _ = unstructured.NestedString(d.Object, "spec", "template", "metadata", "annotations", "prometheus.io/port")
			}
		}
		if port == 0 || fmt.Sprint(port) != annotated || ep["path"] != "/metrics" {
			t.Errorf("%s: port %v (%d on the Service), path %v; the pods' annotation says port %q", m.GetName(), ep["port"], port, ep["path"], annotated)
		}
	}
}

// TestTheDashboardsConfigMapHoldsEveryShippedDashboardForGrafanasSidecar:
// with metrics.dashboards.enabled the chart adds one ConfigMap, labelled
// for Grafana's dashboard sidecar (and as the operator asks), holding each
// file of dashboards/ unchanged; without, none.
func TestTheDashboardsConfigMapHoldsEveryShippedDashboardForGrafanasSidecar(t *testing.T) {
	helm, dir := chart(t)
	files, err := filepath.Glob(filepath.Join(dir, "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in the chart (%v)", err)
	}
	dashboards := func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
		var out []*unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == "ConfigMap" && o.GetName() == "flotilla-dashboards" {
				out = append(out, o)
			}
		}
		return out
	}
	if got := dashboards(render(t, helm, dir, namespace)); len(got) != 0 {
		t.Fatalf("dashboards rendered by default: %v", got)
	}
	got := dashboards(render(t, helm, dir, namespace, "--set", "metrics.dashboards.enabled=true",
		"--set", "metrics.dashboards.labels.team=mesh", "--set", "metrics.dashboards.annotations.grafana_folder=Mesh"))
	if len(got) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(got))
	}
	cm := got[0]
	if l := cm.GetLabels(); l["grafana_dashboard"] != "1" || l["team"] != "mesh" || cm.GetAnnotations()["grafana_folder"] != "Mesh" {
		t.Errorf("labels %v, annotations %v: want Grafana's sidecar label, and the operator's", l, cm.GetAnnotations())
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if len(data) != len(files) {
		t.Errorf("%d dashboards in the ConfigMap, %d in the chart", len(data), len(files))
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if data[filepath.Base(f)] != string(want) {
			t.Errorf("%s differs in the ConfigMap", filepath.Base(f))
		}
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestDiscoverysPlainTextPortStaysInThePodUnlessAValueOpensIt: plain-text
// xDS checks no identity, so by default discovery listens for it on the
// pod's loopback and neither the pod nor the Service names port 15010;
// discovery.plaintextXDS.enabled=true opens it as istiod's is.
func TestDiscoverysPlainTextPortStaysInThePodUnlessAValueOpensIt(t *testing.T) {
	helm, dir := chart(t)
	for _, tc := range []struct {
		name   string
		args   []string
		listen string
		open   bool
	}{
		{"default", nil, "--xds-address=127.0.0.1:15010", false},
		{"opened", []string{"--set", "discovery.plaintextXDS.enabled=true"}, "--xds-address=:15010", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args, ports []string
			for _, o := range render(t, helm, dir, namespace, tc.args...) {
				if o.GetName() != "flotilla-discovery" {
					continue
				}
				switch o.GetKind() {
				case "Deployment":
					cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
					c := cs[0].(map[string]any)
					for _, a := range c["args"].([]any) {
						args = append(args, fmt.Sprint(a))
					}
					for _, p := range c["ports"].([]any) {
						ports = append(ports, fmt.Sprint(p.(map[string]any)["containerPort"]))
					}
				case "Service":
					sp, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
					for _, p := range sp {
						ports = append(ports, fmt.Sprint(p.(map[string]any)["port"]))
					}
				}
			}
			if !slices.Contains(args, tc.listen) {
				t.Errorf("discovery's args %q, want %s", args, tc.listen)
			}
			if got := slices.Contains(ports, "15010"); got != tc.open {
				t.Errorf("port 15010 among the pod's and Service's ports %q: %v, want %v", ports, got, tc.open)
			}
		})
	}
}
