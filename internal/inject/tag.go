package inject

import (
	"fmt"
	"net/url"
	"strings"

	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// WebhookPath is where the injector serves its webhook; TagWebhookPath
// where a revision tag's webhook calls it (the injector then selects by
// the tag's name: Policy.Tag).
const WebhookPath = "/inject"

// TagWebhookPath is the path of tag's webhook.
func TagWebhookPath(tag string) string { return WebhookPath + "/tag/" + tag }

// NeverMatch is the selector a deactivated webhook is left with, kept so
// that it can be turned back on (istioctl's util.NeverMatch, set by
// DeactivateIstioInjectionWebhook when the default tag is set).
func NeverMatch() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"istio.io/deactivated": "never-match"}}
}

// TagWebhooks are the webhooks of revision tag tag's configuration, made
// from template (a webhook of the revision's own configuration: its
// client, rules and policies; its namespace selector's expressions other
// than the injection labels, which keep the control plane's and the
// system namespaces out). They select as the chart's revision webhooks
// do (deploy/helm/flotilla/templates/injector.yaml, Istio's
// istio-discovery mutatingwebhook.yaml) with the tag's name in the
// revision's place: a namespace labelled istio.io/rev=<tag> (without
// istio-injection), or a pod so labelled in an unlabelled namespace;
// the default tag also istio-injection=enabled namespaces and pods
// labelled sidecar.istio.io/inject=true. The client calls
// TagWebhookPath(tag).
func TagWebhooks(tag string, template admregv1.MutatingWebhook) ([]admregv1.MutatingWebhook, error) {
	if err := controlplane.CheckRevision(tag); err != nil {
		return nil, fmt.Errorf("tag %w", err)
	}
	client := *template.ClientConfig.DeepCopy()
	switch {
	case client.Service != nil:
		p := TagWebhookPath(tag)
		client.Service.Path = &p
	case client.URL != nil:
		u, err := url.Parse(*client.URL)
		if err != nil {
			return nil, fmt.Errorf("the revision's webhook URL: %w", err)
		}
		u.Path = strings.TrimSuffix(u.Path, WebhookPath) + TagWebhookPath(tag)
		s := u.String()
		client.URL = &s
	default:
		return nil, fmt.Errorf("the revision's webhook %s has neither a service nor a URL", template.Name)
	}
	var never []metav1.LabelSelectorRequirement
	if template.NamespaceSelector != nil {
		for _, e := range template.NamespaceSelector.MatchExpressions {
			if e.Key != RevisionLabel && e.Key != NamespaceLabel {
				never = append(never, e)
			}
		}
	}
	exists := func(k string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpDoesNotExist}
	}
	in := func(k, v string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{v}}
	}
	notOptedOut := metav1.LabelSelectorRequirement{Key: InjectLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"false"}}
	hook := func(name string, ns, obj []metav1.LabelSelectorRequirement) admregv1.MutatingWebhook {
		w := *template.DeepCopy()
		w.Name, w.ClientConfig = name, client
		w.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: append(append([]metav1.LabelSelectorRequirement{}, never...), ns...)}
		w.ObjectSelector = &metav1.LabelSelector{MatchExpressions: obj}
		return w
	}
	hooks := []admregv1.MutatingWebhook{
		hook("rev.namespace.injection.flotilla.io",
			[]metav1.LabelSelectorRequirement{in(RevisionLabel, tag), exists(NamespaceLabel)},
			[]metav1.LabelSelectorRequirement{notOptedOut}),
		hook("rev.object.injection.flotilla.io",
			[]metav1.LabelSelectorRequirement{exists(RevisionLabel), exists(NamespaceLabel)},
			[]metav1.LabelSelectorRequirement{notOptedOut, in(RevisionLabel, tag)}),
	}
	if tag == controlplane.DefaultRevision {
		hooks = append(hooks,
			hook("namespace.injection.flotilla.io",
				[]metav1.LabelSelectorRequirement{in(NamespaceLabel, "enabled")},
				[]metav1.LabelSelectorRequirement{notOptedOut}),
			hook("object.injection.flotilla.io",
				[]metav1.LabelSelectorRequirement{exists(NamespaceLabel), exists(RevisionLabel)},
				[]metav1.LabelSelectorRequirement{in(InjectLabel, "true"), exists(RevisionLabel)}))
	}
	return hooks, nil
}
