package istio

import (
	"strconv"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
)

// The health of a WorkloadEntry whose workload probes its readiness (a
// VM's agent with a WorkloadGroup's probe): the entry has the annotation,
// and its Healthy condition says whether it may be sent traffic.
const (
	// AnnotationHealthChecks marks such an entry (Istio's
	// WorkloadEntryHealthCheckAnnotation).
	AnnotationHealthChecks = "proxy.istio.io/health-checks-enabled"
	// ConditionHealthy is the condition (Istio's status.ConditionHealthy).
	ConditionHealthy = "Healthy"
)

// HealthStatus is the status Flotilla serves of a WorkloadEntry
// (Object.Status): its Healthy condition's status alone, so that a probe
// time moving changes nothing.
func HealthStatus(status string) *metav1alpha1.IstioStatus {
	return &metav1alpha1.IstioStatus{Conditions: []*metav1alpha1.IstioCondition{{Type: ConditionHealthy, Status: status}}}
}

// Healthy reports whether a WorkloadEntry may be sent traffic (Istio's
// serviceentry isHealthy): always, unless its health is checked; then
// only once its Healthy condition is True, so a new entry waits for its
// first successful probe.
func Healthy(o *Object) bool {
	if checked, _ := strconv.ParseBool(o.Meta.Annotations[AnnotationHealthChecks]); !checked {
		return true
	}
	st, ok := o.Status.(*metav1alpha1.IstioStatus)
	if !ok {
		return false
	}
	for _, c := range st.GetConditions() {
		if c.GetType() == ConditionHealthy {
			return c.GetStatus() == "True"
		}
	}
	return false
}
