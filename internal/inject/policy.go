// Package inject decides whether a pod gets a sidecar and renders what is
// added (the flotilla-init container that installs traffic capture, the
// istio-proxy container, their volumes and the status annotation) from a
// text/template and values, with Istio's per-pod annotations as
// overrides; and it computes the JSONPatch the webhook returns. It does no
// I/O beyond reading configuration files it is named: the webhook, galley
// (which validates the injection ConfigMap) and kube-inject share it.
package inject

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Labels and annotations read and written, as Istio names them.
const (
	InjectLabel      = "sidecar.istio.io/inject"
	StatusAnnotation = "sidecar.istio.io/status"
	NamespaceLabel   = "istio-injection"
	RevisionLabel    = "istio.io/rev"
	TLSModeLabel     = "security.istio.io/tlsMode"
	ProxyContainer   = "istio-proxy"
	InitContainer    = "flotilla-init"
)

// Policy says which pods are injected.
type Policy struct {
	// SystemNamespace (the control plane's) is never injected, nor are
	// kube-system and kube-public.
	SystemNamespace string
	// Revision this injector serves: namespaces labelled istio.io/rev
	// with it are injected ("default" when empty).
	Revision string
}

// Decide reports whether pod, in a namespace with nsLabels, gets a
// sidecar, and why. In order: never the system namespaces, never
// hostNetwork pods, never a pod already injected; the pod's
// sidecar.istio.io/inject label, then annotation, wins; else the
// namespace's istio-injection label, or istio.io/rev naming this
// revision, decides; else no.
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
	if slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer }) {
		return false, "the pod already has an istio-proxy container"
	}
	for _, src := range []struct {
		what string
		m    map[string]string
	}{{"label", pod.Labels}, {"annotation", pod.Annotations}} {
		switch src.m[InjectLabel] {
		case "true":
			return true, "the pod's " + InjectLabel + " " + src.what + " is true"
		case "false":
			return false, "the pod's " + InjectLabel + " " + src.what + " is false"
		}
	}
	switch nsLabels[NamespaceLabel] {
	case "enabled":
		return true, "namespace " + namespace + " has " + NamespaceLabel + "=enabled"
	case "disabled":
		return false, "namespace " + namespace + " has " + NamespaceLabel + "=disabled"
	}
	rev := p.Revision
	if rev == "" {
		rev = "default"
	}
	if r, ok := nsLabels[RevisionLabel]; ok {
		if r == rev {
			return true, "namespace " + namespace + " has " + RevisionLabel + "=" + r
		}
		return false, "namespace " + namespace + " is for revision " + r + ", this injector serves " + rev
	}
	return false, "neither the pod nor namespace " + namespace + " asks for injection"
}
