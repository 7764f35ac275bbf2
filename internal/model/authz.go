package model

import (
	"strconv"

	security "istio.io/api/security/v1beta1"
)

// DryRunAnnotation marks an AuthorizationPolicy whose decisions are logged
// and counted, never enforced (Istio's istio.io/dry-run).
const DryRunAnnotation = "istio.io/dry-run"

// AuthorizationPolicy is an AuthorizationPolicy resource.
type AuthorizationPolicy struct {
	Name, Namespace string
	Spec            *security.AuthorizationPolicy
	// DryRun is set by the istio.io/dry-run annotation ("true", or any
	// value strconv.ParseBool reads as true).
	DryRun bool
}

// WorkloadAuthorizationPolicies returns the AuthorizationPolicies that
// apply to the workload with labels in namespace, as Istio's
// ListAuthorizationPolicies: the root namespace's (mesh-wide, or for the
// workloads of any namespace their selector matches), then the
// namespace's own (namespace-wide, or for the workloads their selector
// matches), each in name order. Istio orders by creation time within a
// namespace; order matters only for which CUSTOM provider is named first.
// A policy with a targetRef attaches to the Gateway API gateways or
// waypoints it names, never by selector (Istio's ShouldAttachPolicy);
// Flotilla has neither, so those apply to no proxy.
func (pc *PushContext) WorkloadAuthorizationPolicies(namespace string, labels map[string]string) []*AuthorizationPolicy {
	var out []*AuthorizationPolicy
	add := func(ns string) {
		for _, ap := range pc.cfg.authz[ns] {
			if ap.Spec.GetTargetRef() != nil || len(ap.Spec.GetTargetRefs()) > 0 {
				continue
			}
			if LabelsMatch(ap.Spec.GetSelector().GetMatchLabels(), labels) {
				out = append(out, ap)
			}
		}
	}
	add(pc.RootNamespace)
	if namespace != pc.RootNamespace {
		add(namespace)
	}
	return out
}

// HasAuthorizationPolicies reports whether any AuthorizationPolicy exists.
func (pc *PushContext) HasAuthorizationPolicies() bool { return len(pc.cfg.authz) > 0 }

func dryRun(annotations map[string]string) bool {
	v, err := strconv.ParseBool(annotations[DryRunAnnotation])
	return err == nil && v
}
