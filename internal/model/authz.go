package model

import (
	"strconv"

	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
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
// A policy with a targetRef attaches to the Gateway API gateways it names,
// never by selector (Istio's ShouldAttachPolicy; Flotilla has no
// waypoints).
func (pc *PushContext) WorkloadAuthorizationPolicies(namespace string, labels map[string]string) []*AuthorizationPolicy {
	return workloadPolicies(pc, pc.cfg.authz, namespace, labels, func(ap *AuthorizationPolicy) policyTarget { return ap.Spec })
}

// policyTarget is how a security policy says which workloads it applies
// to.
type policyTarget interface {
	GetSelector() *typev1beta1.WorkloadSelector
	GetTargetRef() *typev1beta1.PolicyTargetReference
	GetTargetRefs() []*typev1beta1.PolicyTargetReference
}

// workloadPolicies selects a workload's policies of one kind: the root
// namespace's, then the namespace's, that attach to it (attaches: by
// selector, or by targetRefs to a Gateway API gateway of the policy's
// namespace).
func workloadPolicies[P any](pc *PushContext, byNamespace map[string][]P, namespace string, labels map[string]string, target func(P) policyTarget) []P {
	var out []P
	add := func(ns string) {
		for _, p := range byNamespace[ns] {
			t := target(p)
			if attaches(t.GetSelector().GetMatchLabels(), targetRefs(t.GetTargetRef(), t.GetTargetRefs()), ns, namespace, labels) {
				out = append(out, p)
			}
		}
	}
	add(pc.RootNamespace)
	if namespace != pc.RootNamespace {
		add(namespace)
	}
	return out
}

func dryRun(annotations map[string]string) bool {
	v, err := strconv.ParseBool(annotations[DryRunAnnotation])
	return err == nil && v
}
