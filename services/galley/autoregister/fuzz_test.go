package autoregister

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// FuzzConnectRequest: whatever a caller sends, checking it does not
// panic, and what it admits makes an entry Kubernetes accepts — an object
// name, valid labels — without the locality label.
func FuzzConnectRequest(f *testing.F) {
	seed := func(w *galleyv1.Workload) {
		b, err := proto.Marshal(&galleyv1.ConnectRequest{Replica: "a", Workload: w})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&galleyv1.Workload{Namespace: "ns", Group: "vms", Address: "10.0.0.1", Network: "net", Labels: map[string]string{"app": "a", "istio-locality": "r.z"}})
	seed(&galleyv1.Workload{Namespace: "ns", Group: "vms", Address: "fe80::1%eth0"})
	seed(&galleyv1.Workload{Namespace: "ns", Group: "vms", Address: "2001:db8::1", Network: "Net_1"})
	group := &clientnetworking.WorkloadGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "vms"},
		Spec:       networking.WorkloadGroup{Template: &networking.WorkloadEntry{Labels: map[string]string{"t": "x"}}},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &galleyv1.ConnectRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		w := req.GetWorkload()
		if checkWorkload(w) != nil {
			return
		}
		name := EntryName(w)
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			t.Fatalf("admitted %v, whose entry name %q is invalid: %v", w, name, msgs)
		}
		we := fromGroup(name, w, group)
		if _, ok := we.Labels[localityLabel]; ok {
			t.Fatalf("the entry keeps %s", localityLabel)
		}
		for k, v := range we.Labels {
			if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
				t.Fatalf("admitted %v, whose entry has the invalid label %q=%q", w, k, v)
			}
		}
	})
}

// FuzzHealthReport: whatever a caller reports on an entry, in any order,
// the entry ends with one Healthy condition, True or False, whose
// message galley's bound holds, and a report older than the condition
// never changes it.
func FuzzHealthReport(f *testing.F) {
	f.Add(true, "", int64(10), false, "503", int64(5))
	f.Add(false, "refused", int64(1), false, "refused", int64(2))
	f.Fuzz(func(t *testing.T, h1 bool, m1 string, t1 int64, h2 bool, m2 string, t2 int64) {
		for _, m := range []string{m1, m2} {
			if len(m) > maxHealthMessage {
				return // refused by ReportHealth before any entry is read
			}
		}
		we := &clientnetworking.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationController: "a"}}}
		at1, at2 := time.Unix(t1%1e10, 0), time.Unix(t2%1e10, 0)
		first, changed := healthReportedBy(we, "a", h1, m1, at1)
		if !changed {
			t.Fatal("the first report on an entry changed nothing")
		}
		second, changed := healthReportedBy(first, "a", h2, m2, at2)
		if !changed {
			second = first
		} else if at2.Before(at1) {
			t.Fatalf("a report probed at %v changed a condition probed at %v", at2, at1)
		}
		n := 0
		for _, c := range second.Status.Conditions {
			if c.GetType() != istio.ConditionHealthy {
				continue
			}
			n++
			if (c.GetStatus() != "True" && c.GetStatus() != "False") || len(c.GetMessage()) > maxHealthMessage || (c.GetStatus() == "True" && c.GetMessage() != "") {
				t.Fatalf("condition %v", c)
			}
		}
		if n != 1 {
			t.Fatalf("%d Healthy conditions", n)
		}
		if _, changed := healthReportedBy(second, "b", !h2, "other", at2.Add(time.Hour)); changed {
			t.Fatal("a replica that does not control the entry changed its health")
		}
	})
}
