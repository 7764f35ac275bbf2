// Package autoregister keeps the WorkloadEntries of workloads that join
// the mesh with a WorkloadGroup (Istio's auto-registration): discovery
// replicas report connections and disconnections over
// flotilla.galley.v1.WorkloadEntryService, and galley, the only service
// that writes to Kubernetes, creates each entry from its group, marks
// which replica controls it since when, and removes it once it has stayed
// disconnected for a grace period — as istiod's autoregistration
// controller does, with the same annotations, so that the entries Istio
// wrote and Flotilla's are one and the same.
package autoregister

import (
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// Istio's annotations of an auto-registered WorkloadEntry.
const (
	// AnnotationGroup names the WorkloadGroup an entry was made from.
	AnnotationGroup = "istio.io/autoRegistrationGroup"
	// AnnotationController names the replica the workload is connected to.
	AnnotationController = "istio.io/workloadController"
	// AnnotationConnectedAt is when that connection began.
	AnnotationConnectedAt = "istio.io/connectedAt"
	// AnnotationDisconnectedAt is when the last connection ended.
	AnnotationDisconnectedAt = "istio.io/disconnectedAt"
	// AnnotationHealthChecks marks an entry whose health its workload's
	// readiness probe reports.
	AnnotationHealthChecks = istio.AnnotationHealthChecks
	// timeFormat is the annotations' time format (Istio's).
	timeFormat = time.RFC3339Nano
	// localityLabel is the label Istio's agent turns the locality into;
	// "/" is not allowed in a label value, and the entry has the locality.
	localityLabel = "istio-locality"
	// maxNameLength bounds an entry's name (a Kubernetes object name).
	maxNameLength = 253
)

// EntryName is the name of a workload's entry: the one it names when it
// has no group; else its group, its address (":" made "-") and its
// network, joined by "-", the last 253 characters of it (Istio's
// autoregisteredWorkloadEntryName).
func EntryName(w *galleyv1.Workload) string {
	if w.GetGroup() == "" {
		return w.GetEntry()
	}
	parts := []string{w.GetGroup(), strings.ReplaceAll(w.GetAddress(), ":", "-")}
	if w.GetNetwork() != "" {
		parts = append(parts, w.GetNetwork())
	}
	name := strings.Join(parts, "-")
	if len(name) > maxNameLength {
		name = name[len(name)-maxNameLength:]
	}
	return name
}

// fromGroup is the entry a workload gets from its group (Istio's
// workloadEntryFromGroup): the template with the workload's address,
// labels merged template < group < workload (the locality label left
// out), the group's annotations and which group it is of, the workload's
// network and locality, health checks marked when the workload probes
// its readiness, and owned by the group so that the cluster removes the
// entries with it.
func fromGroup(name string, w *galleyv1.Workload, wg *clientnetworking.WorkloadGroup) *clientnetworking.WorkloadEntry {
	we := &clientnetworking.WorkloadEntry{}
	if t := wg.Spec.GetTemplate(); t != nil {
		t.DeepCopyInto(&we.Spec)
	}
	we.Spec.Address = w.GetAddress()
	labels := maps.Clone(we.Spec.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, wg.Spec.GetMetadata().GetLabels())
	maps.Copy(labels, w.GetLabels())
	delete(labels, localityLabel)
	if len(labels) == 0 {
		labels = nil
	}
	we.Spec.Labels = labels
	annotations := map[string]string{AnnotationGroup: wg.Name}
	maps.Copy(annotations, wg.Spec.GetMetadata().GetAnnotations())
	if w.GetNetwork() != "" {
		we.Spec.Network = w.GetNetwork()
	}
	if w.GetLocality() != "" {
		we.Spec.Locality = w.GetLocality()
	}
	if w.GetHealthChecked() {
		annotations[AnnotationHealthChecks] = "true"
	}
	controller := true
	we.ObjectMeta = metav1.ObjectMeta{
		Name:        name,
		Namespace:   w.GetNamespace(),
		Labels:      maps.Clone(labels),
		Annotations: annotations,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: clientnetworking.SchemeGroupVersion.String(),
			Kind:       "WorkloadGroup",
			Name:       wg.Name,
			UID:        wg.UID,
			Controller: &controller,
		}},
	}
	return we
}

// autoRegistered reports whether an entry was made by auto-registration
// (Istio's isAutoRegisteredWorkloadEntry).
func autoRegistered(we *clientnetworking.WorkloadEntry) bool {
	return we.Annotations[AnnotationGroup] != ""
}

// healthChecked reports whether an entry's health is reported by its
// workload (Istio's IsEligibleForHealthStatusUpdates: the annotation is
// there, whatever its value).
func healthChecked(we *clientnetworking.WorkloadEntry) bool {
	_, ok := we.Annotations[AnnotationHealthChecks]
	return ok
}

// healthCondition is the index of an entry's Healthy condition, -1 when it
// has none.
func healthCondition(we *clientnetworking.WorkloadEntry) int {
	return slices.IndexFunc(we.Status.Conditions, func(c *metav1alpha1.IstioCondition) bool { return c.GetType() == istio.ConditionHealthy })
}

// withoutHealth is the entry without its Healthy condition (Istio's
// DeleteHealthCondition).
func withoutHealth(we *clientnetworking.WorkloadEntry) *clientnetworking.WorkloadEntry {
	out := we.DeepCopy()
	if i := healthCondition(out); i >= 0 {
		out.Status.Conditions = slices.Delete(out.Status.Conditions, i, i+1)
	}
	return out
}

// mayControl checks that a workload's identity may control an entry
// (Istio's ensureProxyCanControlEntry): of its namespace, and of its
// service account when the entry names one.
func mayControl(w *galleyv1.Workload, spec *networking.WorkloadEntry, namespace string) bool {
	if w.GetNamespace() != namespace {
		return false
	}
	return spec.GetServiceAccount() == "" || spec.GetServiceAccount() == w.GetServiceAccount()
}

// annotationTime parses one of the time annotations; the zero time when
// absent or malformed.
func annotationTime(we *clientnetworking.WorkloadEntry, key string) time.Time {
	t, err := time.Parse(timeFormat, we.Annotations[key])
	if err != nil {
		return time.Time{}
	}
	return t
}

// connectedBy returns what a connection makes of an entry, and whether it
// changes it (Istio's changeWorkloadEntryStateToConnected): nothing when
// the entry was disconnected after that connection began (a slow connect
// and its disconnect crossed), when a later connection took it over, or
// when that replica already controls it since then.
func connectedBy(we *clientnetworking.WorkloadEntry, replica string, at time.Time) (*clientnetworking.WorkloadEntry, bool) {
	if d := annotationTime(we, AnnotationDisconnectedAt); !d.IsZero() && at.Before(d) {
		return nil, false
	}
	last := annotationTime(we, AnnotationConnectedAt)
	if at.Before(last) {
		return nil, false
	}
	if we.Annotations[AnnotationController] == replica && !at.After(last) {
		return nil, false
	}
	out := we.DeepCopy()
	setConnected(out, replica, at)
	return out, true
}

// setConnected marks an entry connected to replica since at.
func setConnected(we *clientnetworking.WorkloadEntry, replica string, at time.Time) {
	if we.Annotations == nil {
		we.Annotations = map[string]string{}
	}
	we.Annotations[AnnotationController] = replica
	we.Annotations[AnnotationConnectedAt] = at.UTC().Format(timeFormat)
	delete(we.Annotations, AnnotationDisconnectedAt)
}

// disconnectedBy returns what the end of a connection makes of an entry,
// and whether it changes it (Istio's
// changeWorkloadEntryStateToDisconnected): nothing when a later
// connection took it over, when another replica controls it, or when it
// reconnected after that end.
func disconnectedBy(we *clientnetworking.WorkloadEntry, replica string, connectedAt, disconnectedAt time.Time) (*clientnetworking.WorkloadEntry, bool) {
	last := annotationTime(we, AnnotationConnectedAt)
	if last.After(connectedAt) || we.Annotations[AnnotationController] != replica || disconnectedAt.Before(last) {
		return nil, false
	}
	out := we.DeepCopy()
	delete(out.Annotations, AnnotationConnectedAt)
	out.Annotations[AnnotationDisconnectedAt] = disconnectedAt.UTC().Format(timeFormat)
	return out, true
}

// stale reports whether an auto-registered entry is to be removed, or a
// health-checked one's health (Istio's shouldCleanupEntry): disconnected
// for the grace period, or marked connected for longer than a connection
// lasts (its workload and its replica went down together, before the
// replica could say so).
func stale(we *clientnetworking.WorkloadEntry, now time.Time, grace, maxConnectionAge time.Duration) bool {
	if !autoRegistered(we) && (!healthChecked(we) || healthCondition(we) < 0) {
		return false
	}
	if _, ok := we.Annotations[AnnotationConnectedAt]; ok {
		c := annotationTime(we, AnnotationConnectedAt)
		return maxConnectionAge > 0 && !c.IsZero() && now.Sub(c) > maxConnectionAge
	}
	if _, ok := we.Annotations[AnnotationDisconnectedAt]; !ok {
		return false
	}
	d := annotationTime(we, AnnotationDisconnectedAt)
	return d.IsZero() || now.Sub(d) >= grace
}

// maxHealthMessage bounds the message of a Healthy condition.
const maxHealthMessage = 1024

// healthReportedBy returns what a workload's health report makes of its
// entry, and whether it changes it (Istio's Store.UpdateHealth): nothing
// when another replica controls the entry (the workload moved), when the
// condition was probed later than this report, or when it already says
// the same. The condition is Istio's: status True or False, the reason
// for False in its message, the probe time, and the transition time
// moved only when the status changes.
func healthReportedBy(we *clientnetworking.WorkloadEntry, replica string, healthy bool, message string, at time.Time) (*clientnetworking.WorkloadEntry, bool) {
	if we.Annotations[AnnotationController] != replica {
		return nil, false
	}
	st := "False"
	if healthy {
		st, message = "True", ""
	}
	i := healthCondition(we)
	var old *metav1alpha1.IstioCondition
	if i >= 0 {
		old = we.Status.Conditions[i]
		if old.GetLastProbeTime() != nil && old.GetLastProbeTime().AsTime().After(at) {
			return nil, false
		}
		if old.GetStatus() == st && old.GetMessage() == message {
			return nil, false
		}
	}
	probed := timestamppb.New(at)
	cond := &metav1alpha1.IstioCondition{Type: istio.ConditionHealthy, Status: st, Message: message, LastProbeTime: probed, LastTransitionTime: probed}
	if old != nil && old.GetStatus() == st {
		cond.LastTransitionTime = old.GetLastTransitionTime()
	}
	out := we.DeepCopy()
	if i >= 0 {
		out.Status.Conditions[i] = cond
	} else {
		out.Status.Conditions = append(out.Status.Conditions, cond)
	}
	return out, true
}
