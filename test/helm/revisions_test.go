package helm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestTwoRevisionsSideBySideShareGalleyAndCAAndEachInjectsItsNamespaces
// installs the chart twice into one namespace of the real apiserver, as
// an Istio canary upgrade does: release flotilla (the default revision,
// with galley and ca) and release flotilla-canary (revision=canary,
// galley.enabled=false, ca.enabled=false). No object of one is the
// other's, and the apiserver accepts both. galley and each revision's
// injector then run as processes with the chart's settings (the apiserver
// reaches them through the chart's webhook configurations, pointed at
// loopback: there is no Service routing here); pods of a namespace
// labelled istio-injection=enabled get the default revision's sidecar,
// those of one labelled istio.io/rev=canary the canary's, each pointed at
// its revision's discovery; relabelling a namespace moves its new pods.
// The canary injects Istio's proxyv2 sidecar (injector.sidecar=proxyv2),
// the default revision Flotilla's: a move between sidecars is a move
// between revisions, and the canary's proxies dial discovery by Istio's
// name, istiod-canary.
func TestTwoRevisionsSideBySideShareGalleyAndCAAndEachInjectsItsNamespaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	helm, dir := chart(t)
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "revisions")
	if err != nil {
		t.Fatal(err)
	}
	stable := renderRelease(t, helm, dir, "flotilla", ns)
	canary := renderRelease(t, helm, dir, "flotilla-canary", ns, "--set", "revision=canary", "--set", "galley.enabled=false", "--set", "ca.enabled=false", "--set", "injector.sidecar=proxyv2")

	// Side by side: no object is both releases'.
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	stableKeys := map[string]bool{}
	for _, o := range stable {
		stableKeys[key(o)] = true
	}
	var canaryDeployments []string
	for _, o := range canary {
		if stableKeys[key(o)] {
			t.Errorf("%s is in both releases", key(o))
		}
		if o.GetKind() == "Deployment" {
			canaryDeployments = append(canaryDeployments, o.GetName())
		}
	}
	if slices.Sort(canaryDeployments); !slices.Equal(canaryDeployments, []string{"flotilla-discovery-canary", "flotilla-injector-canary"}) {
		t.Fatalf("the canary release's Deployments: %v, want its discovery and injector only", canaryDeployments)
	}

	// What the canary uses of the stable release, as its rendered
	// arguments and injection values name it and the cluster would route
	// it (Service, selector, target port): galley's MCP port for its
	// discovery and injector, ca for its discovery; its sidecars dial its
	// own discovery (Istio's istiod-canary name), and send their CSRs to
	// the stable ca or, without a CA address (proxyv2's default), to that
	// discovery, which relays them to the stable ca.
	both := append(slices.Clone(stable), canary...)
	for what, addr := range map[string]string{
		"the canary injector's galley":  injectorArg(t, canary, "--galley-address="),
		"the canary discovery's galley": componentArg(t, canary, "discovery", "--galley-address="),
	} {
		if dep, port := servedBy(t, both, addr); dep != "flotilla-galley" || port != "grpc-mcp" {
			t.Errorf("%s is %s: it reaches %s's port %s, want the stable galley's MCP port (grpc-mcp)", what, addr, dep, port)
		}
	}
	if dep, _ := servedBy(t, both, componentArg(t, canary, "discovery", "--ca-address=")); dep != "flotilla-ca" {
		t.Errorf("the canary discovery's ca reaches %s, want the stable release's flotilla-ca", dep)
	}
	values := injectionValues(t, canary, "flotilla-sidecar-injector-canary")
	if dep, _ := servedBy(t, both, values.DiscoveryAddress); dep != "flotilla-discovery-canary" {
		t.Errorf("the canary's sidecars dial %s, which reaches %s: want the canary's discovery", values.DiscoveryAddress, dep)
	}
	if values.CAAddress != "" {
		if dep, _ := servedBy(t, both, values.CAAddress); dep != "flotilla-ca" {
			t.Errorf("the canary's sidecars get certificates from %s, which reaches %s: want the stable release's flotilla-ca", values.CAAddress, dep)
		}
	}

	// Both into the apiserver; the webhook configurations are removed at
	// the end (cluster-wide, failing closed).
	rs := newResources(t)
	for _, o := range append(slices.Clone(stable), canary...) {
		ri, _ := rs.of(t, o, ns)
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldManager: "helm"}); err != nil {
			t.Fatalf("the apiserver refused %s: %v", key(o), err)
		}
		if k := o.GetKind(); k == "MutatingWebhookConfiguration" || k == "ValidatingWebhookConfiguration" {
			name := o.GetName()
			t.Cleanup(func() {
				if err := ri.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
					t.Errorf("deleting %s %s: %v", k, name, err)
				}
			})
		}
	}

	// Each revision's accounts may do what their revision needs, and not
	// the other revision's.
	for _, c := range []struct {
		sa, verb, group, resource, name string
		allowed                         bool
	}{
		{"flotilla-injector-canary", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "flotilla-sidecar-injector-canary", true},
		// Its revision's tags' configurations are named by users, so the
		// role names none (as istiod's); the injector writes only those
		// labelled with its revision (internal/platform/cabundle).
		{"flotilla-injector-canary", "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "istio-revision-tag-prod", true},
		{"flotilla-discovery-canary", "list", "", "pods", "", false},
		{"flotilla-discovery-canary", "get", "", "configmaps", "istio", false},
	} {
		sar, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":" + c.sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: c.verb, Group: c.group, Resource: c.resource, Namespace: ns, Name: c.name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.allowed {
			t.Errorf("%s may %s %s %s: %v, want %v", c.sa, c.verb, c.resource, c.name, sar.Status.Allowed, c.allowed)
		}
	}

	// The processes, with the chart's arguments for what the test does
	// not replace (addresses, certificates: ca's are files here).
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	mcpAddr, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--kubeconfig", kubeconfig, "--mcp-address", mcpAddr,
		"--admin-address", galleyAdmin, "--system-namespace", ns)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	pki, err := testpki.NewCA("injectors")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.Issue(testpki.Request{CommonName: "injector", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	cert, keyFile, err := leaf.WriteFiles(certDir)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(certDir, "bundle.pem")
	if err := os.WriteFile(bundle, pki.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	hooks := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	injectors := map[string]*proc.Process{}
	for _, rev := range []string{"default", "canary"} {
		objs, config := stable, "flotilla-sidecar-injector"
		if rev == "canary" {
			objs, config = canary, "flotilla-sidecar-injector-canary"
		}
		if got := injectorArg(t, objs, "--revision="); got != rev {
			t.Fatalf("the %s release's injector runs --revision=%s", rev, got)
		}
		if got := injectorArg(t, objs, "--webhook-config="); got != config {
			t.Fatalf("the %s release's injector keeps the caBundle of %s", rev, got)
		}
		hook, admin := proc.FreeAddr(t), proc.FreeAddr(t)
		// The chart's configuration, its Service reference pointed at the
		// process: before the process starts, whose leader then patches
		// the caBundle (updating it at the same time would conflict).
		c, err := hooks.Get(ctx, config, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		url := "https://" + hook + "/inject"
		for i := range c.Webhooks {
			c.Webhooks[i].ClientConfig.Service, c.Webhooks[i].ClientConfig.URL = nil, &url
		}
		if _, err := hooks.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No --webhook-config: the revision's own is the default. Its
		// leader (a Lease per revision) writes the caBundle.
		// The galley it dials is the one its rendered --galley-address
		// reaches (the stable release's, for both): here, that process.
		running := map[string]string{"flotilla-galley": mcpAddr}
		galleyAt, _ := servedBy(t, both, injectorArg(t, objs, "--galley-address="))
		if running[galleyAt] == "" {
			t.Fatalf("the %s release's injector dials %s, which is not running here", rev, galleyAt)
		}
		injectors[rev] = proc.Start(t, "injector-"+rev, filepath.Join(binDir, "flotilla-injector"), "--revision", rev,
			"--galley-address", running[galleyAt], "--admin-address", admin, "--webhook-address", hook, "--system-namespace", ns,
			"--webhook-tls-cert-file", cert, "--webhook-tls-key-file", keyFile, "--kubeconfig", kubeconfig, "--ca-bundle-file", bundle)
		proc.WaitReady(t, "http://"+admin+"/readyz")
	}
	for _, config := range []string{"flotilla-sidecar-injector", "flotilla-sidecar-injector-canary"} {
		xdstest.Eventually(t, config+"'s caBundle from its revision's injector", func() bool {
			c, err := hooks.Get(ctx, config, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, w := range c.Webhooks {
				if string(w.ClientConfig.CABundle) != string(pki.CertPEM) {
					return false
				}
			}
			return true
		})
	}

	// The applications' namespaces.
	stableApp := labelledNamespace(t, ctx, "shop", map[string]string{"istio-injection": "enabled"})
	canaryApp := labelledNamespace(t, ctx, "cart", map[string]string{"istio.io/rev": "canary"})
	plain := labelledNamespace(t, ctx, "plain", nil)
	discovery := func(rev string) string {
		if rev == "default" {
			return "flotilla-discovery." + ns + ".svc:15012"
		}
		return "istiod-" + rev + "." + ns + ".svc:15012"
	}
	// injected creates a pod (dry run: nothing runs here) and says which
	// revision injected it and which discovery its proxy dials: "" when
	// none did.
	injected := func(namespace string, labels map[string]string) (rev, dials string) {
		t.Helper()
		p, err := env.Client.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("creating a pod in %s: %v", namespace, err)
		}
		for _, c := range p.Spec.Containers {
			if c.Name != "istio-proxy" {
				continue
			}
			// Flotilla's agent reads DISCOVERY_ADDRESS, pilot-agent the
			// proxy configuration's discoveryAddress.
			for _, e := range c.Env {
				var pc struct {
					DiscoveryAddress string `json:"discoveryAddress"`
				}
				switch {
				case e.Name == "DISCOVERY_ADDRESS":
					dials = e.Value
				case e.Name == "PROXY_CONFIG" && json.Unmarshal([]byte(e.Value), &pc) == nil && pc.DiscoveryAddress != "":
					dials = pc.DiscoveryAddress
				}
			}
		}
		return p.Annotations["istio.io/rev"], dials
	}
	expect := func(what, namespace string, labels map[string]string, rev string) {
		t.Helper()
		var got, dials string
		xdstest.Eventually(t, what, func() bool {
			got, dials = injected(namespace, labels)
			return got == rev && (rev == "" || dials == discovery(rev))
		})
		t.Logf("%s: revision %q, dials %q", what, got, dials)
	}
	expect("a pod of the istio-injection=enabled namespace", stableApp, nil, "default")
	expect("a pod of the istio.io/rev=canary namespace", canaryApp, nil, "canary")
	expect("a pod labelled istio.io/rev=canary in an unlabelled namespace", plain, map[string]string{"istio.io/rev": "canary"}, "canary")
	expect("a pod labelled sidecar.istio.io/inject=true in an unlabelled namespace", plain, map[string]string{"sidecar.istio.io/inject": "true"}, "default")
	expect("a pod of an unlabelled namespace", plain, nil, "")
	expect("a pod opting out in the canary namespace", canaryApp, map[string]string{"sidecar.istio.io/inject": "false"}, "")

	// The canary upgrade: the stable namespace moves to canary by
	// relabelling (istio-injection would win over istio.io/rev, so it
	// goes), and the canary one back to the default revision.
	relabel(t, ctx, stableApp, map[string]string{"istio.io/rev": "canary"}, "istio-injection")
	relabel(t, ctx, canaryApp, map[string]string{"istio.io/rev": "default"})
	expect("a new pod of the namespace moved to canary", stableApp, nil, "canary")
	expect("a new pod of the namespace moved back", canaryApp, nil, "default")

	// Revision tags, as istioctl tag makes them: prod points at canary,
	// then moves to the default revision; the default tag takes the
	// default revision's selections to canary.
	for _, name := range []string{"istio-revision-tag-prod", "istio-revision-tag-default"} {
		t.Cleanup(func() {
			if err := hooks.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", name, err)
			}
		})
	}
	tag := func(stdin string, args ...string) (string, error) {
		t.Helper()
		c := exec.Command(filepath.Join(binDir, "flotilla"), append([]string{"tag"}, append(args, "--kubeconfig", kubeconfig)...)...)
		c.Stdin = strings.NewReader(stdin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	mustTag := func(args ...string) string {
		t.Helper()
		out, err := tag("", args...)
		if err != nil {
			t.Fatalf("flotilla tag %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := mustTag("set", "prod", "--revision", "canary"); !strings.Contains(out, `Revision tag "prod" created, referencing control plane revision "canary"`) {
		t.Fatalf("tag set: %s", out)
	}
	prodApp := labelledNamespace(t, ctx, "prod", map[string]string{"istio.io/rev": "prod"})
	expect("a pod of the istio.io/rev=prod namespace, prod at canary", prodApp, nil, "canary")
	expect("a pod labelled istio.io/rev=prod in an unlabelled namespace", plain, map[string]string{"istio.io/rev": "prod"}, "canary")
	for args, says := range map[string]string{
		"set prod --revision canary":    `revision tag "prod" already exists, and --overwrite is false`,
		"set canary --revision default": `cannot create revision tag "canary": found existing control plane revision with same name`,
		"set next --revision nightly":   `cannot find MutatingWebhookConfiguration with revision "nightly"`,
		"remove nothing -y":             `cannot remove tag "nothing"`,
		"set Bad_Tag --revision canary": `want lower-case letters`,
	} {
		if out, err := tag("", strings.Fields(args)...); err == nil || !strings.Contains(out, says) {
			t.Errorf("flotilla tag %s: %v\n%s\nwant it refused saying %q", args, err, out, says)
		}
	}
	mustTag("set", "prod", "--revision", "default", "--overwrite")
	expect("a new pod of the istio.io/rev=prod namespace, prod moved to the default revision", prodApp, nil, "default")
	if out := mustTag("list"); !regexp.MustCompile(`(?m)^TAG +REVISION +NAMESPACES\n^prod +default +` + prodApp + `$`).MatchString(out) {
		t.Errorf("tag list:\n%s", out)
	}
	mustTag("set", "default", "--revision", "canary")
	enabledApp := labelledNamespace(t, ctx, "enabled", map[string]string{"istio-injection": "enabled"})
	expect("a pod of an istio-injection=enabled namespace, default tag at canary", enabledApp, nil, "canary")
	expect("a pod labelled sidecar.istio.io/inject=true, default tag at canary", plain, map[string]string{"sidecar.istio.io/inject": "true"}, "canary")
	expect("a pod of the istio.io/rev=default namespace, default tag at canary", canaryApp, nil, "canary")
	if out := mustTag("list", "-o", "json"); !strings.Contains(out, `"tag": "default"`) || !strings.Contains(out, `"revision": "canary"`) {
		t.Errorf("tag list -o json:\n%s", out)
	}
	// Removing a tag in use asks first; no is no.
	if out, err := tag("n\n", "remove", "prod"); err != nil || !strings.Contains(out, "still injected by tag \"prod\": "+prodApp) || !strings.Contains(out, "Aborting operation.") {
		t.Fatalf("tag remove, answered no: %v\n%s", err, out)
	}
	expect("a pod of the prod namespace, the removal refused", prodApp, nil, "default")
	if out := mustTag("remove", "prod", "-y"); !strings.Contains(out, "Revision tag prod removed") {
		t.Fatalf("tag remove -y: %s", out)
	}
	expect("a pod of the prod namespace, prod removed", prodApp, nil, "")

	for rev, p := range injectors {
		if p.Out.Count("msg=injected") == 0 {
			t.Errorf("revision %s's injector logged no injection", rev)
		}
	}
}

// injectorArg is the value of the injector Deployment's argument with
// prefix, among objs.
func injectorArg(t *testing.T, objs []*unstructured.Unstructured, prefix string) string {
	t.Helper()
	return componentArg(t, objs, "injector", prefix)
}

// componentArg is the value of the argument with prefix of the Deployment
// of component (discovery, injector, ...) among objs.
func componentArg(t *testing.T, objs []*unstructured.Unstructured, component, prefix string) string {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetLabels()["app.kubernetes.io/component"] != component {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		c, _ := containers[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, prefix); ok {
				return v
			}
		}
	}
	t.Fatalf("no %s Deployment with %s", component, prefix)
	return ""
}

// servedBy says which Deployment among objs an address <service>.<namespace>.svc:<port>
// reaches, as the cluster would route it: the Service of that name and
// namespace, its port's targetPort, the Deployment whose pods its selector
// selects, and the container port the targetPort names (its name is
// returned). It fails the test when any link is missing.
func servedBy(t *testing.T, objs []*unstructured.Unstructured, addr string) (deployment, portName string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	parts := strings.Split(host, ".")
	if len(parts) != 3 || parts[2] != "svc" {
		t.Fatalf("%q names no Service (<service>.<namespace>.svc)", addr)
	}
	var selector map[string]string
	target := ""
	for _, o := range objs {
		if o.GetKind() != "Service" || o.GetName() != parts[0] || o.GetNamespace() != parts[1] {
			continue
		}
		selector, _, _ = unstructured.NestedStringMap(o.Object, "spec", "selector")
		ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
		for _, p := range ports {
			pm, _ := p.(map[string]any)
			if fmt.Sprint(pm["port"]) == port {
				target = fmt.Sprint(pm["targetPort"])
			}
		}
	}
	if len(selector) == 0 || target == "" {
		t.Fatalf("%q: no Service %s in %s with port %s", addr, parts[0], parts[1], port)
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetNamespace() != parts[1] {
			continue
		}
		labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		selected := true
		for k, v := range selector {
			selected = selected && labels[k] == v
		}
		if !selected {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			cm, _ := c.(map[string]any)
			ports, _, _ := unstructured.NestedSlice(cm, "ports")
			for _, p := range ports {
				pm, _ := p.(map[string]any)
				if fmt.Sprint(pm["name"]) == target || fmt.Sprint(pm["containerPort"]) == target {
					return o.GetName(), fmt.Sprint(pm["name"])
				}
			}
		}
	}
	t.Fatalf("%q: Service %s's port %s (targetPort %s) reaches no Deployment's container port", addr, parts[0], port, target)
	return "", ""
}

// injectionValues are a revision's injection values as the chart renders
// its injection ConfigMap.
func injectionValues(t *testing.T, objs []*unstructured.Unstructured, name string) inject.Values {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || o.GetName() != name {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		cfg, err := inject.ParseConfig("canary", data[inject.ConfigMapTemplateKey], data[inject.ConfigMapValuesKey])
		if err != nil {
			t.Fatalf("ConfigMap %s: %v", name, err)
		}
		return cfg.Values
	}
	t.Fatalf("no ConfigMap %s", name)
	return inject.Values{}
}

// labelledNamespace creates a namespace with labels.
func labelledNamespace(t *testing.T, ctx context.Context, prefix string, labels map[string]string) string {
	t.Helper()
	name, err := env.CreateNamespace(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	relabel(t, ctx, name, labels)
	return name
}

// relabel sets labels on a namespace and removes the ones named in drop.
func relabel(t *testing.T, ctx context.Context, name string, labels map[string]string, drop ...string) {
	t.Helper()
	n, err := env.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	for k, v := range labels {
		n.Labels[k] = v
	}
	for _, k := range drop {
		delete(n.Labels, k)
	}
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(fmt.Errorf("labelling namespace %s: %w", name, err))
	}
}

// TestATagsWebhooksSelectAsTheChartsRevisionWebhooks: the webhooks
// flotilla tag makes (inject.TagWebhooks) select by the tag's name
// exactly as the chart's select by the revision's, the default's
// included, and differ only in the path they call.
func TestATagsWebhooksSelectAsTheChartsRevisionWebhooks(t *testing.T) {
	helm, dir := chart(t)
	for _, rev := range []string{"default", "canary"} {
		objs := renderRelease(t, helm, dir, "flotilla-"+rev, "istio-system", "--set", "revision="+rev)
		name := inject.RevisionName(rev)
		u := object(objs, "MutatingWebhookConfiguration", name)
		if u == nil {
			t.Fatalf("the %s release has no %s", rev, name)
		}
		var chartCfg admregv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &chartCfg); err != nil {
			t.Fatal(err)
		}
		tagged, err := inject.TagWebhooks(rev, chartCfg.Webhooks[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(tagged) != len(chartCfg.Webhooks) {
			t.Fatalf("%s: the tag has %d webhooks, the chart %d", rev, len(tagged), len(chartCfg.Webhooks))
		}
		for i, w := range chartCfg.Webhooks {
			got := tagged[i]
			if got.Name != w.Name || !equality.Semantic.DeepEqual(got.NamespaceSelector, w.NamespaceSelector) || !equality.Semantic.DeepEqual(got.ObjectSelector, w.ObjectSelector) {
				t.Errorf("%s webhook %d: the tag's\n%s %v %v\nthe chart's\n%s %v %v", rev, i, got.Name, got.NamespaceSelector, got.ObjectSelector, w.Name, w.NamespaceSelector, w.ObjectSelector)
			}
			if p := got.ClientConfig.Service.Path; p == nil || *p != "/inject/tag/"+rev {
				t.Errorf("%s webhook %d calls %v", rev, i, p)
			}
		}
	}
}
