// Package inject decides whether a pod gets a sidecar and renders what is
// added (the init container that installs traffic capture, the
// istio-proxy container, their volumes and the status annotation) from a
// text/template and values, with Istio's per-pod annotations as
// overrides; and it computes the JSONPatch the webhook returns. The
// values choose the sidecar: Flotilla's own (flotilla-init and
// flotilla-agent) or Istio's proxyv2 (istio-init and pilot-agent, laid
// out as Istio's injection templates do). It does no
// I/O beyond reading configuration files it is named: the webhook, galley
// (which validates the injection ConfigMap) and kube-inject share it.
package inject

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// Labels and annotations read and written, as Istio names them.
const (
	InjectLabel      = "sidecar.istio.io/inject"
	StatusAnnotation = "sidecar.istio.io/status"
	NamespaceLabel   = "istio-injection"
	RevisionLabel    = controlplane.RevisionLabel
	TLSModeLabel     = "security.istio.io/tlsMode"
	ProxyContainer   = "istio-proxy"
	// InitContainer is Flotilla's sidecar's capture container (the
	// proxyv2 sidecar's is ProxyV2InitContainer).
	InitContainer = "flotilla-init"
)

// Policy says which pods are injected.
type Policy struct {
	// SystemNamespace (the control plane's) is never injected, nor are
	// kube-system and kube-public.
	SystemNamespace string
	// Revision this injector serves ("default" when empty).
	Revision string
	// Tag, when set, is the revision tag (istio.io/tag) whose webhook
	// called: a tag points at Revision, and selects pods and namespaces
	// by its own name in Revision's place (the default tag as the
	// default revision does), as Istio's istio-revision-tag-<tag>
	// webhooks do.
	Tag string
}

// selects is the name this decision selects by: the tag's, else the
// revision's.
func (p Policy) selects() string { return cmp.Or(p.Tag, p.Revision, controlplane.DefaultRevision) }

// serves names what this decision serves, for its reasons.
func (p Policy) serves() string {
	if p.Tag != "" {
		return "tag " + p.Tag + " (revision " + cmp.Or(p.Revision, controlplane.DefaultRevision) + ")"
	}
	return cmp.Or(p.Revision, controlplane.DefaultRevision)
}

// Decide reports whether pod, in a namespace with nsLabels, gets a sidecar
// from revision p.Revision's injector, and why. It is the decision Istio's
// revision webhooks and injector make together
// (manifests/charts/istio-control/istio-discovery/templates/mutatingwebhook.yaml,
// pkg/kube/inject's injectRequired), so an injector called outside those
// selectors decides the same:
//   - never the system namespaces, hostNetwork pods, or a pod injected
//     already;
//   - a namespace labelled istio-injection is the default revision's:
//     enabled injects, disabled injects nothing, whatever the pod says
//     (that label wins over istio.io/rev);
//   - else a namespace labelled istio.io/rev=r is revision r's;
//   - else, in an unlabelled namespace, a pod labelled istio.io/rev=r is
//     revision r's, and a pod labelled sidecar.istio.io/inject=true the
//     default revision's;
//   - where a revision's selection applies, the pod's
//     sidecar.istio.io/inject label (or, without it, annotation) set to
//     anything but true opts it out.
func Decide(pod *corev1.Pod, namespace string, nsLabels map[string]string, p Policy) (bool, string) {
	if slices.Contains([]string{"kube-system", "kube-public", p.SystemNamespace}, namespace) {
		return false, fmt.Sprintf("namespace %s is never injected", namespace)
	}
	if pod.Spec.HostNetwork {
		return false, "the pod uses the host network"
	}
	if _, ok := pod.Annotations[StatusAnnotation]; ok {
		return false, "the pod is already injected"
	}
	rev := p.selects()
	var selected string // why this revision's webhook would be called
	if v, ok := nsLabels[NamespaceLabel]; ok {
		if v != "enabled" {
			return false, "namespace " + namespace + " has " + NamespaceLabel + "=" + v
		}
		if rev != controlplane.DefaultRevision {
			return false, "namespace " + namespace + " has " + NamespaceLabel + "=enabled, the default revision's; this injector serves " + p.serves()
		}
		selected = "namespace " + namespace + " has " + NamespaceLabel + "=enabled"
	} else if r, ok := nsLabels[RevisionLabel]; ok {
		if r != rev {
			return false, "namespace " + namespace + " is for revision " + r + ", this injector serves " + p.serves()
		}
		selected = "namespace " + namespace + " has " + RevisionLabel + "=" + r
	} else if r, ok := pod.Labels[RevisionLabel]; ok {
		if r != rev {
			return false, "the pod is for revision " + r + ", this injector serves " + p.serves()
		}
		selected = "the pod has " + RevisionLabel + "=" + r
	} else {
		switch v, ok := pod.Labels[InjectLabel]; {
		case ok && optIn(v) && rev == controlplane.DefaultRevision:
			return true, "the pod's " + InjectLabel + " label is true"
		case ok && optIn(v):
			return false, "the pod's " + InjectLabel + " label asks the default revision; this injector serves " + p.serves()
		case ok:
			return false, "the pod's " + InjectLabel + " label is " + v
		}
		if pod.Annotations[InjectLabel] != "" {
			return false, "neither the pod's labels nor namespace " + namespace + " ask for injection (the " + InjectLabel + " annotation does not select a pod: label it)"
		}
		return false, "neither the pod nor namespace " + namespace + " asks for injection"
	}
	for _, src := range []struct {
		what string
		m    map[string]string
	}{{"label", pod.Labels}, {"annotation", pod.Annotations}} {
		if v, ok := src.m[InjectLabel]; ok {
			if !optIn(v) {
				return false, selected + ", but the pod's " + InjectLabel + " " + src.what + " is " + v
			}
			break
		}
	}
	return true, selected
}

// optIn is how Istio's injector reads a sidecar.istio.io/inject value.
func optIn(v string) bool {
	switch strings.ToLower(v) {
	case "y", "yes", "true", "on":
		return true
	}
	return false
}
