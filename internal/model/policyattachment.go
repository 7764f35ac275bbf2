package model

import (
	typev1beta1 "istio.io/api/type/v1beta1"
)

// LabelGatewayName is on the pods of a Gateway API gateway: the name of
// their Gateway (Istio's label.IoK8sNetworkingGatewayGatewayName).
const LabelGatewayName = "gateway.networking.k8s.io/gateway-name"

// gatewayAPIGroup is the Gateway API's group, which a targetRef to a
// Gateway names.
const gatewayAPIGroup = "gateway.networking.k8s.io"

// targetRefs are a policy's targetRefs, its deprecated targetRef when it
// has none (Istio's GetTargetRefs).
func targetRefs(ref *typev1beta1.PolicyTargetReference, refs []*typev1beta1.PolicyTargetReference) []*typev1beta1.PolicyTargetReference {
	if len(refs) == 0 && ref != nil {
		return []*typev1beta1.PolicyTargetReference{ref}
	}
	return refs
}

// attaches reports whether a policy of namespace policyNS, with selector
// labels and targetRefs refs, applies to a workload of namespace ns with
// labels, as Istio's WorkloadPolicyMatcher.ShouldAttachPolicy decides it
// (without waypoints, which Flotilla has not; selector-based policies
// apply to Gateway API gateways too, ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY
// being on by default): a policy without targetRefs applies by its
// selector (none: every workload); one with targetRefs never by its
// selector, only to the pods of the Gateways (gateway.networking.k8s.io)
// they name in the policy's own namespace. Which namespaces' policies a
// workload looks at is the caller's.
func attaches(selector map[string]string, refs []*typev1beta1.PolicyTargetReference, policyNS, ns string, labels map[string]string) bool {
	if len(refs) == 0 {
		return LabelsMatch(selector, labels)
	}
	gateway, ok := labels[LabelGatewayName]
	if !ok || policyNS != ns {
		return false
	}
	for _, r := range refs {
		if name, ok := gatewayOf(r, ns); ok && name == gateway {
			return true
		}
	}
	return false
}

// gatewayOf is the name of the Gateway (gateway.networking.k8s.io) a
// targetRef of a policy of namespace ns names, if it names one there.
func gatewayOf(r *typev1beta1.PolicyTargetReference, ns string) (string, bool) {
	if r.GetGroup() != gatewayAPIGroup || r.GetKind() != "Gateway" || (r.GetNamespace() != "" && r.GetNamespace() != ns) {
		return "", false
	}
	return r.GetName(), true
}

// gatewaySelections are the proxies a policy's targetRefs can attach to
// (attaches): the pods of each Gateway they name, in the policy's
// namespace.
func gatewaySelections(namespace string, refs []*typev1beta1.PolicyTargetReference) []Selection {
	var out []Selection
	for _, r := range refs {
		if name, ok := gatewayOf(r, namespace); ok {
			out = append(out, Selection{Namespace: namespace, Labels: map[string]string{LabelGatewayName: name}})
		}
	}
	return out
}
