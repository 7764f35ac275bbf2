package galley_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestAVMThatJoinsWithAWorkloadGroupHasAnEntryWhileConnectedToAnyReplica
// runs galley on a real apiserver and two discovery replicas subscribed
// to it over mTLS, as separate processes. A proxy with a VM's identity
// that asks to join with a WorkloadGroup (AUTO_REGISTER_GROUP) gets a
// WorkloadEntry made from the group when it connects to the first
// replica; it moves to the second (connects there, then leaves the
// first), and the entry is the second's, connected; once it leaves that
// one too the entry is marked disconnected and removed after galley's
// grace period. Meanwhile the VM reports its health on its stream: the
// entry's Healthy condition follows, and the VM is an endpoint of a
// ServiceEntry selecting it only while healthy. A proxy naming a group that does not exist is refused.
func TestAVMThatJoinsWithAWorkloadGroupHasAnEntryWhileConnectedToAnyReplica(t *testing.T) {
	ctx := context.Background()
	m := newGatewayMesh(t, map[string]string{"vms": "unused"})
	ns := m.namespaces["vms"]
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	wg := &networkingv1.WorkloadGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Spec: networkingapi.WorkloadGroup{
			Metadata: &networkingapi.WorkloadGroup_ObjectMeta{Labels: map[string]string{"app": "legacy"}},
			Template: &networkingapi.WorkloadEntry{ServiceAccount: "legacy", Ports: map[string]uint32{"http": 8080}},
		},
	}
	if _, err := ic.NetworkingV1().WorkloadGroups(ns).Create(ctx, wg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.startDiscovery(t, "--replica-name", "discovery-a")
	secondSecure := proc.FreeAddr(t)
	m.startDiscovery(t, "--replica-name", "discovery-b", "--secure-xds-address", secondSecure)
	vm := m.ca.IssueFiles(t, "vm", "spiffe://cluster.local/ns/"+ns+"/sa/legacy")
	nodeID := "sidecar~10.9.0.5~legacy-vm." + ns + "~" + ns + ".svc.cluster.local"

	// join opens a stream of the VM's proxy on a replica and waits for
	// its first response.
	var streamB discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	join := func(addr, group string) (context.CancelFunc, error) {
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		md, err := structpb.NewStruct(map[string]any{
			"AUTO_REGISTER_GROUP": group, "LABELS": map[string]any{"version": "v2"},
			"PROXY_CONFIG": map[string]any{"readinessProbe": map[string]any{"httpGet": map[string]any{"port": 8080}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialMTLS(t, m.ca, addr, vm)).StreamAggregatedResources(sctx)
		if err != nil {
			return cancel, err
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: nodeID, Metadata: md}, TypeUrl: resourcev3.ClusterType}); err != nil {
			return cancel, err
		}
		_, err = st.Recv()
		if addr == secondSecure {
			streamB = st
		}
		return cancel, err
	}
	entry := func() *networkingv1.WorkloadEntry {
		we, err := ic.NetworkingV1().WorkloadEntries(ns).Get(ctx, "legacy-10.9.0.5", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return we
	}
	waitFor := func(what string, ok func(*networkingv1.WorkloadEntry) bool) *networkingv1.WorkloadEntry {
		t.Helper()
		var we *networkingv1.WorkloadEntry
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if we = entry(); ok(we) {
				return we
			}
		}
		t.Fatalf("%s within 60 s: the entry is %v", what, we)
		return nil
	}

	leaveA, err := join(m.secure, "legacy")
	if err != nil {
		t.Fatalf("the VM joining on discovery-a: %v", err)
	}
	we := waitFor("the entry, discovery-a's", func(we *networkingv1.WorkloadEntry) bool {
		return we != nil && we.Annotations["istio.io/workloadController"] == "discovery-a"
	})
	if we.Spec.GetAddress() != "10.9.0.5" || we.Spec.GetLabels()["app"] != "legacy" || we.Spec.GetLabels()["version"] != "v2" ||
		we.Annotations["istio.io/autoRegistrationGroup"] != "legacy" || we.Spec.GetServiceAccount() != "legacy" {
		t.Fatalf("entry %v %v", we.Annotations, &we.Spec)
	}

	// The VM moves: it connects to discovery-b, then leaves discovery-a.
	leaveB, err := join(secondSecure, "legacy")
	if err != nil {
		t.Fatalf("the VM joining on discovery-b: %v", err)
	}
	leaveA()
	waitFor("the entry, discovery-b's", func(we *networkingv1.WorkloadEntry) bool {
		return we != nil && we.Annotations["istio.io/workloadController"] == "discovery-b" && we.Annotations["istio.io/connectedAt"] != ""
	})
	time.Sleep(2 * time.Second) // discovery-a's report of the end, if any, comes meanwhile
	if we := entry(); we == nil || we.Annotations["istio.io/workloadController"] != "discovery-b" || we.Annotations["istio.io/disconnectedAt"] != "" {
		t.Fatalf("after discovery-a saw the VM leave, the entry is %v", we)
	}

	// The VM's agent reports its health on the stream (its readiness
	// probe, as Istio's agent sends HealthInformation): the entry's
	// Healthy condition follows, and a ServiceEntry selecting it has the
	// VM as an endpoint only while it is healthy.
	se := &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Spec: networkingapi.ServiceEntry{
			Hosts: []string{"legacy.vms.mesh"}, Ports: []*networkingapi.ServicePort{{Number: 8080, Name: "http", Protocol: "HTTP"}},
			Location: networkingapi.ServiceEntry_MESH_INTERNAL, Resolution: networkingapi.ServiceEntry_STATIC,
			WorkloadSelector: &networkingapi.WorkloadSelector{Labels: map[string]string{"app": "legacy"}},
		},
	}
	if _, err := ic.NetworkingV1().ServiceEntries(ns).Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	report := func(detail *statuspb.Status) {
		t.Helper()
		if err := streamB.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/istio.v1.HealthInformation", ErrorDetail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	healthOf := func(we *networkingv1.WorkloadEntry) *metav1alpha1.IstioCondition {
		for _, c := range we.Status.GetConditions() {
			if c.GetType() == "Healthy" {
				return c
			}
		}
		return nil
	}
	cluster := "outbound|8080||legacy.vms.mesh"
	if err := streamB.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}}); err != nil {
		t.Fatal(err)
	}
	// endpoints reads the stream, acknowledging each response, until an
	// assignment of the cluster has the VM or not, as wanted.
	endpoints := func(want bool) {
		t.Helper()
		for {
			resp, err := streamB.Recv()
			if err != nil {
				t.Fatalf("waiting for the VM's endpoint to be %v: %v", want, err)
			}
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			if resp.GetTypeUrl() == resourcev3.EndpointType {
				ack.ResourceNames = []string{cluster}
			}
			if err := streamB.Send(ack); err != nil {
				t.Fatal(err)
			}
			for _, r := range resp.GetResources() {
				var cla endpointv3.ClusterLoadAssignment
				if r.UnmarshalTo(&cla) != nil || cla.GetClusterName() != cluster {
					continue
				}
				has := false
				for _, l := range cla.GetEndpoints() {
					for _, e := range l.GetLbEndpoints() {
						has = has || e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == "10.9.0.5"
					}
				}
				if has == want {
					return
				}
			}
		}
	}
	report(&statuspb.Status{Code: int32(codes.Internal), Message: "HTTP probe: 503 Service Unavailable"})
	waitFor("the entry unhealthy", func(we *networkingv1.WorkloadEntry) bool {
		c := healthOf(we)
		return c.GetStatus() == "False" && c.GetMessage() == "HTTP probe: 503 Service Unavailable"
	})
	report(nil)
	waitFor("the entry healthy", func(we *networkingv1.WorkloadEntry) bool { return healthOf(we).GetStatus() == "True" })
	endpoints(true)
	report(&statuspb.Status{Code: int32(codes.Internal), Message: "HTTP probe: connection refused"})
	endpoints(false)
	if c := healthOf(entry()); c.GetStatus() != "False" {
		t.Fatalf("the VM's endpoint went away while the entry's health is %v", c)
	}

	leaveB()
	waitFor("the entry marked disconnected", func(we *networkingv1.WorkloadEntry) bool {
		return we == nil || we.Annotations["istio.io/disconnectedAt"] != ""
	})
	waitFor("the entry removed after the grace period", func(we *networkingv1.WorkloadEntry) bool { return we == nil })

	if _, err := join(m.secure, "missing"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot find WorkloadGroup "+ns+"/missing") {
		t.Fatalf("a VM naming a group that does not exist: %v", err)
	}
}
