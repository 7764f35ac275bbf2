package autoregister

import (
	"testing"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
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
