package helm_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// chartInjection is the rendered injection ConfigMap's configuration, as
// galley would parse it for the release's revision.
func chartInjection(t *testing.T, objs []*unstructured.Unstructured, revision string) inject.Config {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != inject.RevisionName(revision) {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		c, err := inject.ParseConfig(revision, data[inject.ConfigMapTemplateKey], data[inject.ConfigMapValuesKey])
		if err != nil {
			t.Fatalf("the injection ConfigMap: %v", err)
		}
		return c
	}
	t.Fatalf("no injection ConfigMap %s rendered", inject.RevisionName(revision))
	return inject.Config{}
}

func object(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// TestInjectorSidecarProxyV2InjectsIstiosSidecarAndNamesDiscoveryAsIstiod:
// injector.sidecar chooses the sidecar once; with proxyv2 the injection
// ConfigMap chooses Istio's template, image and discovery address, and the
// chart renders the istiod Service that address names.
func TestInjectorSidecarProxyV2InjectsIstiosSidecarAndNamesDiscoveryAsIstiod(t *testing.T) {
	helm, dir := chart(t)
	for _, tc := range []struct {
		name                       string
		args                       []string
		revision, service, sidecar string
		image, discovery, ca       string
		ports                      []string
	}{
		{
			name: "the default: Flotilla's sidecar, no istiod Service", revision: "default", sidecar: inject.SidecarFlotilla,
			image: "flotilla-proxy:" + appVersion(t, dir), discovery: "flotilla-discovery." + namespace + ".svc:15012", ca: "flotilla-ca." + namespace + ".svc:15013",
		},
		{
			name: "proxyv2", args: []string{"--set", "injector.sidecar=proxyv2"},
			revision: "default", service: "istiod", sidecar: inject.SidecarProxyV2,
			image: inject.ProxyV2Image, discovery: "istiod." + namespace + ".svc:15012", ports: []string{"15012", "15014"},
		},
		{
			name: "proxyv2 of a revision, its own image and CA, plain-text xDS open",
			args: []string{
				"--set", "injector.sidecar=proxyv2", "--set", "revision=canary", "--set", "injector.proxyv2.image=registry.local/istio/proxyv2:1.32.1",
				"--set", "injector.proxyv2.caAddress=ca.example:15012", "--set", "discovery.plaintextXDS.enabled=true",
			},
			revision: "canary", service: "istiod-canary", sidecar: inject.SidecarProxyV2,
			image: "registry.local/istio/proxyv2:1.32.1", discovery: "istiod-canary." + namespace + ".svc:15012", ca: "ca.example:15012",
			ports: []string{"15010", "15012", "15014"},
		},
		{
			name: "the istiod Service beside Flotilla's sidecar", args: []string{"--set", "discovery.istiodService.enabled=true"},
			revision: "default", service: "istiod", sidecar: inject.SidecarFlotilla,
			image: "flotilla-proxy:" + appVersion(t, dir), discovery: "flotilla-discovery." + namespace + ".svc:15012", ca: "flotilla-ca." + namespace + ".svc:15013",
			ports: []string{"15012", "15014"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, helm, dir, namespace, tc.args...)
			c := chartInjection(t, objs, tc.revision)
			v := c.Values
			if v.Sidecar != tc.sidecar || v.ProxyImage != tc.image || v.DiscoveryAddress != tc.discovery || v.CAAddress != tc.ca {
				t.Errorf("injection values: sidecar %q, image %q, discovery %q, CA %q", v.Sidecar, v.ProxyImage, v.DiscoveryAddress, v.CAAddress)
			}
			injected, err := c.Template.Inject(&corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "shop"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
			}, v)
			if err != nil {
				t.Fatal(err)
			}
			wantInit := inject.InitContainer
			if tc.sidecar == inject.SidecarProxyV2 {
				wantInit = inject.ProxyV2InitContainer
			}
			if got := injected.Spec.InitContainers[0]; got.Name != wantInit || got.Image != tc.image {
				t.Errorf("init container %s %s, want %s %s", got.Name, got.Image, wantInit, tc.image)
			}

			var istiods []string
			for _, o := range objs {
				if o.GetKind() == "Service" && (o.GetName() == "istiod" || strings.HasPrefix(o.GetName(), "istiod-")) {
					istiods = append(istiods, o.GetName())
				}
			}
			// Kiali finds istiod as a Deployment and pods labelled app:
			// istiod and istio.io/rev, and reads /ready on their port 8080:
			// so are discovery's, under Istio's names only (a real istiod of
			// the revision beside it would have its Service select them).
			deploy := object(objs, "Deployment", map[string]string{"default": "flotilla-discovery", "canary": "flotilla-discovery-canary"}[tc.revision])
			podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
			asIstiod := deploy.GetLabels()["app"] == "istiod" && deploy.GetLabels()["istio.io/rev"] == tc.revision &&
				podLabels["app"] == "istiod" && podLabels["istio.io/rev"] == tc.revision
			if asIstiod != (tc.service != "") {
				t.Errorf("discovery labelled as istiod: %t, want %t (Deployment %v, pods %v)", asIstiod, tc.service != "", deploy.GetLabels(), podLabels)
			}
			tmpl, _, _ := unstructured.NestedMap(deploy.Object, "spec", "template")
			containers, _, _ := unstructured.NestedSlice(tmpl, "spec", "containers")
			if !hasArg(tmpl, "--istiod-http-address=:8080") || !strings.Contains(fmt.Sprint(containers[0].(map[string]any)["ports"]), "containerPort:8080") {
				t.Errorf("discovery without istiod's port 8080: %v", containers[0])
			}
			if tc.service == "" {
				if len(istiods) != 0 {
					t.Fatalf("istiod Services %v rendered", istiods)
				}
				return
			}
			if !slices.Equal(istiods, []string{tc.service}) {
				t.Fatalf("istiod Services %v, want %s", istiods, tc.service)
			}
			svc := object(objs, "Service", tc.service)
			own := object(objs, "Service", map[string]string{"default": "flotilla-discovery", "canary": "flotilla-discovery-canary"}[tc.revision])
			sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
			ownSel, _, _ := unstructured.NestedStringMap(own.Object, "spec", "selector")
			if fmt.Sprint(sel) != fmt.Sprint(ownSel) {
				t.Errorf("%s selects %v, discovery's own Service %v", tc.service, sel, ownSel)
			}
			var ports []string
			sp, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			for _, p := range sp {
				ports = append(ports, fmt.Sprint(p.(map[string]any)["port"]))
			}
			if !slices.Equal(ports, tc.ports) {
				t.Errorf("%s ports %v, want %v", tc.service, ports, tc.ports)
			}
			// The ServiceMonitor selects discovery's own Service by
			// app.kubernetes.io/name: the istiod Service must not match it,
			// or Prometheus would scrape each pod twice.
			labels := svc.GetLabels()
			if _, ok := labels["app.kubernetes.io/name"]; ok || labels["istio.io/rev"] != tc.revision || labels["app"] != "istiod" {
				t.Errorf("%s labels %v", tc.service, labels)
			}
		})
	}

	for name, c := range map[string]struct {
		set  []string
		want string
	}{
		"a sidecar of no known kind":                      {[]string{"--set", "injector.sidecar=envoy"}, "/injector/sidecar"},
		"a second sidecar choice in the injection values": {[]string{"--set", "injector.values.sidecar=proxyv2"}, "injector.values.sidecar=proxyv2 differs from injector.sidecar=flotilla"},
		"no proxyv2 image":                                {[]string{"--set", "injector.sidecar=proxyv2", "--set", "injector.proxyv2.image="}, "/injector/proxyv2/image"},
		"an unknown proxyv2 key":                          {[]string{"--set", "injector.proxyv2.tag=1.32.0"}, "/injector/proxyv2"},
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

// TestTheProxyV2ReleaseIsAcceptedByARealAPIServer has the apiserver
// validate (server-side apply, dry run) what the chart renders with
// injector.sidecar=proxyv2: the istiod Service among the rest.
func TestTheProxyV2ReleaseIsAcceptedByARealAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	helm, dir := chart(t)
	ns, err := env.CreateNamespace(ctx, "proxyv2")
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, helm, dir, ns, "--skip-crds", "--set", "injector.sidecar=proxyv2", "--set", "revision=canary")
	rs := newResources(t)
	for _, o := range objs {
		ri, _ := rs.of(t, o, ns)
		if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "helm", Force: true, DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the apiserver refused %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if object(objs, "Service", "istiod-canary") == nil {
		t.Error("no istiod-canary Service")
	}
}
