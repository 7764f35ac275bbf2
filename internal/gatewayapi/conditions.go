package gatewayapi

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// condition is one condition to set (Istio's condition): true with reason
// and message unless err is set, when it is the opposite of status with
// err's reason and message.
type condition struct {
	reason, message string
	// status is the condition's status when err is nil; "" is True.
	status metav1.ConditionStatus
	err    *configError
}

// setConditions sets conds on existing, in the order of their types, as
// Istio's SetListenerConditions does: a condition whose status, message
// and observed generation are unchanged is left as it is (and so is its
// transition time); a condition whose status is unchanged keeps its
// transition time.
func setConditions(generation int64, existing []metav1.Condition, conds map[string]*condition, now metav1.Time) []metav1.Condition {
	for _, t := range slices.Sorted(maps.Keys(conds)) {
		c := conds[t]
		status := c.status
		if status == "" {
			status = metav1.ConditionTrue
		}
		next := metav1.Condition{Type: t, Status: status, ObservedGeneration: generation, LastTransitionTime: now, Reason: c.reason, Message: c.message}
		if c.err != nil {
			next.Status = invert(status)
			next.Reason, next.Message = c.err.reason, c.err.message
		}
		existing = updateCondition(existing, next)
	}
	return existing
}

func invert(s metav1.ConditionStatus) metav1.ConditionStatus {
	if s == metav1.ConditionFalse {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// updateCondition is Istio's kstatus.UpdateConditionIfChanged.
func updateCondition(conds []metav1.Condition, c metav1.Condition) []metav1.Condition {
	i := slices.IndexFunc(conds, func(e metav1.Condition) bool { return e.Type == c.Type })
	if i < 0 {
		return append(slices.Clone(conds), c)
	}
	old := conds[i]
	if old.Status == c.Status {
		if old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration {
			return conds
		}
		c.LastTransitionTime = old.LastTransitionTime
	}
	out := slices.Clone(conds)
	out[i] = c
	return out
}

func removeCondition(conds []metav1.Condition, t string) []metav1.Condition {
	return slices.DeleteFunc(slices.Clone(conds), func(c metav1.Condition) bool { return c.Type == t })
}
