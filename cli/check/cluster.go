package check

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	admregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/pemcerts"
)

// partOf selects the objects the chart installs.
const partOf = "app.kubernetes.io/part-of=flotilla"

// clusterResults checks, in the cluster conn names: the control plane's
// Deployments, the Istio CRDs and the webhook configurations' caBundles.
func clusterResults(ctx context.Context, conn *connect.Options, rootsPEM []byte) []Result {
	client, err := conn.Kube.Client()
	if err != nil {
		return []Result{fail("check --kubeconfig and --context", "the cluster: %v", err)}
	}
	ns := conn.SystemNamespace()
	var out []Result
	deployments, err := client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: partOf})
	if err != nil {
		out = append(out, fail("your kubeconfig needs list on deployments in "+ns, "the control plane's Deployments: %v", err))
	} else {
		out = append(out, deploymentResults(ns, deployments.Items)...)
	}
	out = append(out, crdResults(client)...)
	var roots []*x509.Certificate
	if rootsPEM != nil {
		roots, _ = pemcerts.Parse(rootsPEM) // reported with the certificates
	}
	mutating, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: partOf})
	if err != nil {
		return append(out, fail("your kubeconfig needs list on mutatingwebhookconfigurations", "the webhook configurations: %v", err))
	}
	validating, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: partOf})
	if err != nil {
		return append(out, fail("your kubeconfig needs list on validatingwebhookconfigurations", "the webhook configurations: %v", err))
	}
	return append(out, webhookResults(ns, mutating.Items, validating.Items, roots)...)
}

// deploymentResults reports each Deployment of the chart: all its
// replicas updated and ready.
func deploymentResults(ns string, ds []appsv1.Deployment) []Result {
	if len(ds) == 0 {
		return []Result{fail("install the chart (helm install flotilla deploy/helm/flotilla -n "+ns+"), or name its namespace with --istio-namespace",
			"no Deployment of Flotilla's in %s", ns)}
	}
	slices.SortFunc(ds, func(a, b appsv1.Deployment) int { return strings.Compare(a.Name, b.Name) })
	out := make([]Result, 0, len(ds))
	for _, d := range ds {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		if d.Status.ReadyReplicas < want || d.Status.UpdatedReplicas < want {
			out = append(out, fail(fmt.Sprintf("kubectl -n %s describe deployment %s, and the events and logs of its pods", ns, d.Name),
				"Deployment %s: %d of %d replicas ready, %d updated", d.Name, d.Status.ReadyReplicas, want, d.Status.UpdatedReplicas))
			continue
		}
		out = append(out, pass("Deployment %s: %d of %d replicas ready", d.Name, d.Status.ReadyReplicas, want))
	}
	return out
}

// crdResults reports each Istio kind Flotilla reads: served by the
// apiserver at every version Flotilla reads it in.
func crdResults(client kubernetes.Interface) []Result {
	served := map[string]map[string]bool{} // group/version → plural → served
	var missing []string
	for _, k := range istio.Kinds() {
		for _, v := range k.Versions {
			gv := k.Group + "/" + v
			if _, ok := served[gv]; !ok {
				served[gv] = map[string]bool{}
				if list, err := client.Discovery().ServerResourcesForGroupVersion(gv); err == nil {
					for _, r := range list.APIResources {
						served[gv][r.Name] = true
					}
				}
			}
			if !served[gv][k.Plural] {
				missing = append(missing, k.Plural+"."+gv)
			}
		}
	}
	if len(missing) > 0 {
		return []Result{fail("install the Istio CRDs Flotilla reads: kubectl apply --server-side -f deploy/helm/flotilla/crds/istio.yaml (helm installs them with the chart)",
			"%d Istio kinds are not served at a version Flotilla reads: %s", len(missing), strings.Join(first(missing, 5), ", "))}
	}
	return []Result{pass("the Istio CRDs serve every kind Flotilla reads (%d kinds) at every version it reads", len(istio.Kinds()))}
}

// webhookResults reports each webhook of the chart's configurations that
// calls a Service of namespace ns (another install's are not this
// control plane's): its caBundle holds every root of the mesh (the
// webhooks serve certificates from ca, which the apiserver checks against
// the caBundle).
func webhookResults(ns string, mutating []admregv1.MutatingWebhookConfiguration, validating []admregv1.ValidatingWebhookConfiguration, roots []*x509.Certificate) []Result {
	type hook struct {
		config, name string
		bundle       []byte
		writer       string // the Deployment that writes it: its Service's name
	}
	var hooks []hook
	ours := func(cc admregv1.WebhookClientConfig) bool { return cc.Service != nil && cc.Service.Namespace == ns }
	for _, c := range mutating {
		for _, w := range c.Webhooks {
			if ours(w.ClientConfig) {
				hooks = append(hooks, hook{"MutatingWebhookConfiguration " + c.Name, w.Name, w.ClientConfig.CABundle, w.ClientConfig.Service.Name}) // the revision's injector
			}
		}
	}
	for _, c := range validating {
		for _, w := range c.Webhooks {
			if ours(w.ClientConfig) {
				hooks = append(hooks, hook{"ValidatingWebhookConfiguration " + c.Name, w.Name, w.ClientConfig.CABundle, w.ClientConfig.Service.Name})
			}
		}
	}
	if len(hooks) == 0 {
		return []Result{fail("install the chart: its webhook configurations inject sidecars and validate Istio objects",
			"no webhook configuration of Flotilla's (label %s) calls a Service in %s", partOf, ns)}
	}
	if len(roots) == 0 {
		return []Result{skip("the webhooks' caBundles: the mesh's roots are not known")}
	}
	out := make([]Result, 0, len(hooks))
	for _, h := range hooks {
		bundle, err := pemcerts.Parse(h.bundle)
		var lacking []string
		for _, r := range roots {
			if err != nil || !slices.ContainsFunc(bundle, func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, r.Raw) }) {
				lacking = append(lacking, fmt.Sprintf("%q", r.Subject.String()))
			}
		}
		if len(lacking) > 0 {
			out = append(out, fail(fmt.Sprintf("%s writes the caBundle when it starts and when the roots change: look at its log; kubectl rollout restart deployment/%s rewrites it", h.writer, h.writer),
				"%s, webhook %s: its caBundle lacks the mesh's root %s, so the apiserver cannot trust the webhook", h.config, h.name, strings.Join(lacking, ", ")))
			continue
		}
		out = append(out, pass("%s, webhook %s: its caBundle holds the mesh's roots", h.config, h.name))
	}
	return out
}
