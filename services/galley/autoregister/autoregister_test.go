package autoregister

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// fixture is a namespace with a WorkloadGroup, and a server over loopback
// gRPC whose caller check admits plaintext callers (the tests stand in
// for discovery).
type fixture struct {
	ns     string
	istio  istioclient.Interface
	server *Server
	client galleyv1.WorkloadEntryServiceClient
	group  *clientnetworking.WorkloadGroup
}

func newFixture(t *testing.T, name string, grace time.Duration) *fixture {
	t.Helper()
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	wg := &clientnetworking.WorkloadGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "vms"},
		Spec: networking.WorkloadGroup{
			Metadata: &networking.WorkloadGroup_ObjectMeta{Labels: map[string]string{"app": "legacy", "tier": "group"}, Annotations: map[string]string{"team": "payments"}},
			Template: &networking.WorkloadEntry{Ports: map[string]uint32{"http": 8080}, ServiceAccount: "legacy", Labels: map[string]string{"tier": "template", "from": "template"}},
		},
	}
	if wg, err = ic.NetworkingV1().WorkloadGroups(ns).Create(ctx, wg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := New(Options{
		Istio: ic, Caller: func(id string) bool { return id == "plaintext" }, Log: slog.New(slog.DiscardHandler), Now: time.Now,
		GracePeriod: grace,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fixture{ns: ns, istio: ic, server: s, client: galleyv1.NewWorkloadEntryServiceClient(conn), group: wg}
}

func (f *fixture) workload(address string) *galleyv1.Workload {
	return &galleyv1.Workload{
		Namespace: f.ns, Group: "vms", Address: address, Network: "vm-net", Locality: "us-east1/us-east1-b", ServiceAccount: "legacy",
		Labels: map[string]string{"tier": "proxy", "istio-locality": "us-east1.us-east1-b", "version": "v2"}, HealthChecked: true,
	}
}

func (f *fixture) entry(t *testing.T, name string) *clientnetworking.WorkloadEntry {
	t.Helper()
	we, err := f.istio.NetworkingV1().WorkloadEntries(f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return we
}

func (f *fixture) connect(replica string, w *galleyv1.Workload, at time.Time) (string, error) {
	resp, err := f.client.Connect(context.Background(), &galleyv1.ConnectRequest{Replica: replica, Workload: w, ConnectedAt: timestamppb.New(at)})
	return resp.GetEntry(), err
}

func (f *fixture) disconnect(replica, entry string, connected, disconnected time.Time) error {
	_, err := f.client.Disconnect(context.Background(), &galleyv1.DisconnectRequest{
		Replica: replica, Namespace: f.ns, Entry: entry, ConnectedAt: timestamppb.New(connected), DisconnectedAt: timestamppb.New(disconnected),
	})
	return err
}

func TestAWorkloadThatConnectsGetsAnEntryFromItsGroupAndLosesItAGracePeriodAfterItLeaves(t *testing.T) {
	f := newFixture(t, "autoreg-life", time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.server.Run(ctx) }()
	connected := time.Now().Truncate(time.Microsecond)
	name, err := f.connect("discovery-a", f.workload("10.9.0.7"), connected)
	if err != nil {
		t.Fatal(err)
	}
	if name != "vms-10.9.0.7-vm-net" {
		t.Fatalf("entry %q, want Istio's name vms-10.9.0.7-vm-net", name)
	}
	we := f.entry(t, name)
	if we == nil {
		t.Fatal("no entry")
	}
	wantLabels := map[string]string{"app": "legacy", "tier": "proxy", "from": "template", "version": "v2"}
	if !maps.Equal(we.Spec.GetLabels(), wantLabels) || !maps.Equal(we.Labels, wantLabels) {
		t.Errorf("labels %v (object %v), want %v: template < group < workload, no istio-locality", we.Spec.GetLabels(), we.Labels, wantLabels)
	}
	if we.Spec.GetAddress() != "10.9.0.7" || we.Spec.GetNetwork() != "vm-net" || we.Spec.GetLocality() != "us-east1/us-east1-b" ||
		we.Spec.GetServiceAccount() != "legacy" || we.Spec.GetPorts()["http"] != 8080 {
		t.Errorf("spec %v", &we.Spec)
	}
	wantAnnotations := map[string]string{
		AnnotationGroup: "vms", "team": "payments", AnnotationHealthChecks: "true",
		AnnotationController: "discovery-a", AnnotationConnectedAt: connected.UTC().Format(timeFormat),
	}
	if !maps.Equal(we.Annotations, wantAnnotations) {
		t.Errorf("annotations %v, want %v", we.Annotations, wantAnnotations)
	}
	if len(we.OwnerReferences) != 1 || we.OwnerReferences[0].UID != f.group.UID || we.OwnerReferences[0].Kind != "WorkloadGroup" || !*we.OwnerReferences[0].Controller {
		t.Errorf("owner references %v, want the group", we.OwnerReferences)
	}
	left := connected.Add(time.Second)
	if err := f.disconnect("discovery-a", name, connected, left); err != nil {
		t.Fatal(err)
	}
	we = f.entry(t, name)
	if we.Annotations[AnnotationDisconnectedAt] != left.UTC().Format(timeFormat) || we.Annotations[AnnotationConnectedAt] != "" {
		t.Errorf("after the disconnection: annotations %v", we.Annotations)
	}
	xdstest.EventuallyWithin(t, 30*time.Second, "the entry removed after the grace period", func() bool { return f.entry(t, name) == nil })
}

func TestReconnectsAcrossReplicasInAnyOrderLeaveOneEntryControlledByTheLastConnection(t *testing.T) {
	f := newFixture(t, "autoreg-storm", time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.server.Run(ctx) }()
	// A workload hops between two replicas 40 times; each connection's
	// connect and its end are reported concurrently with the others', so
	// galley sees them in any order (a replica slow to report an end, a
	// connect overtaking an older one).
	w := f.workload("fd00::17")
	base := time.Now().Truncate(time.Microsecond)
	const hops = 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*hops)
	for i := range hops {
		replica := []string{"discovery-a", "discovery-b"}[i%2]
		at := base.Add(time.Duration(i) * time.Millisecond)
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, err := f.connect(replica, w, at)
			if err != nil {
				errs <- fmt.Errorf("connect %d: %w", i, err)
				return
			}
			if i < hops-1 { // the last connection stays
				if err := f.disconnect(replica, name, at, at.Add(500*time.Microsecond)); err != nil {
					errs <- fmt.Errorf("disconnect %d: %w", i, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if status.Code(err) != codes.Aborted { // lost every retry to the storm: the caller retries
			t.Error(err)
		}
	}
	name := EntryName(w)
	if name != "vms-fd00--17-vm-net" {
		t.Fatalf("entry %q", name)
	}
	// Whatever order the calls took, the last connect wins once it is in:
	// report it again, as a retrying replica would.
	last := base.Add((hops - 1) * time.Millisecond)
	if _, err := f.connect("discovery-b", w, last); err != nil {
		t.Fatal(err)
	}
	list, err := f.istio.NetworkingV1().WorkloadEntries(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d entries, want 1", len(list.Items))
	}
	we := list.Items[0]
	if we.Annotations[AnnotationController] != "discovery-b" || we.Annotations[AnnotationConnectedAt] != last.UTC().Format(timeFormat) || we.Annotations[AnnotationDisconnectedAt] != "" {
		t.Fatalf("annotations %v: want connected to discovery-b since the last connection", we.Annotations)
	}
	// An old connection's end, reported late, changes nothing; nor does
	// the sweep.
	if err := f.disconnect("discovery-a", name, base, last.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the grace period
	f.server.Sweep(context.Background())
	if we := f.entry(t, name); we == nil || we.Annotations[AnnotationController] != "discovery-b" {
		t.Fatalf("a connected workload's entry was changed or removed: %v", we)
	}
	if err := f.disconnect("discovery-b", name, last, last.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 30*time.Second, "the entry removed after its last connection ended", func() bool { return f.entry(t, name) == nil })
}

func TestAnEntryAUserWroteIsTakenOverButNeverRemoved(t *testing.T) {
	f := newFixture(t, "autoreg-user", time.Millisecond)
	ctx := context.Background()
	w := f.workload("10.9.0.8")
	name := EntryName(w)
	mine := &clientnetworking.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networking.WorkloadEntry{Address: "10.9.0.8", ServiceAccount: "legacy"}}
	if _, err := f.istio.NetworkingV1().WorkloadEntries(f.ns).Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if _, err := f.connect("discovery-a", w, at); err != nil {
		t.Fatal(err)
	}
	if we := f.entry(t, name); we.Annotations[AnnotationController] != "discovery-a" || len(we.Spec.GetLabels()) != 0 {
		t.Fatalf("taken over as %v, %v: want the controller marked and the user's spec kept", we.Annotations, &we.Spec)
	}
	if err := f.disconnect("discovery-a", name, at, at.Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	f.server.Sweep(ctx)
	if f.entry(t, name) == nil {
		t.Fatal("the user's entry was removed")
	}
}

func TestCallsThatMayNotRegisterAreRefusedWithTheirReason(t *testing.T) {
	f := newFixture(t, "autoreg-refused", time.Second)
	now := timestamppb.Now()
	ok := func() *galleyv1.Workload { return f.workload("10.9.0.9") }
	with := func(change func(*galleyv1.Workload)) *galleyv1.Workload { w := ok(); change(w); return w }
	manyLabels := map[string]string{}
	for i := range maxLabels + 1 {
		manyLabels[fmt.Sprintf("l%d", i)] = "v"
	}
	for _, c := range []struct {
		name string
		req  *galleyv1.ConnectRequest
		code codes.Code
		want string
	}{
		{"no group", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Group = "missing" }), ConnectedAt: now}, codes.FailedPrecondition, "cannot find WorkloadGroup"},
		{"another service account", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.ServiceAccount = "intruder" }), ConnectedAt: now}, codes.PermissionDenied, "service account"},
		{"no replica", &galleyv1.ConnectRequest{Workload: ok(), ConnectedAt: now}, codes.InvalidArgument, "replica"},
		{"an oversized replica", &galleyv1.ConnectRequest{Replica: strings.Repeat("r", 254), Workload: ok(), ConnectedAt: now}, codes.InvalidArgument, "replica"},
		{"no workload", &galleyv1.ConnectRequest{Replica: "a", ConnectedAt: now}, codes.InvalidArgument, "workload is required"},
		{"no time", &galleyv1.ConnectRequest{Replica: "a", Workload: ok()}, codes.InvalidArgument, "connected_at"},
		{"a hostname for an address", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Address = "vm.example.com" }), ConnectedAt: now}, codes.InvalidArgument, "workload.address"},
		{"a group that is no name", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Group = "../x" }), ConnectedAt: now}, codes.InvalidArgument, "workload.group"},
		{"a bad label", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Labels = map[string]string{"app": "a b"} }), ConnectedAt: now}, codes.InvalidArgument, "workload.labels"},
		{"too many labels", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Labels = manyLabels }), ConnectedAt: now}, codes.InvalidArgument, "at most 256"},
		{"an address whose zone makes no object name", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Address = "fe80::1%eth0" }), ConnectedAt: now}, codes.InvalidArgument, "no object name"},
		{"a network with a slash", &galleyv1.ConnectRequest{Replica: "a", Workload: with(func(w *galleyv1.Workload) { w.Network = "a/b" }), ConnectedAt: now}, codes.InvalidArgument, "workload.network"},
	} {
		_, err := f.client.Connect(context.Background(), c.req)
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v containing %q", c.name, err, c.code, c.want)
		}
	}
	list, err := f.istio.NetworkingV1().WorkloadEntries(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("entries after refused calls: %v, %v", list, err)
	}
	if _, err := f.client.Disconnect(context.Background(), &galleyv1.DisconnectRequest{Replica: "a", Namespace: "Not A Namespace", Entry: "x", ConnectedAt: now, DisconnectedAt: now}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a malformed disconnect: %v", err)
	}
	for _, c := range []struct {
		name string
		req  *galleyv1.ReportHealthRequest
		want string
	}{
		{"no replica", &galleyv1.ReportHealthRequest{Namespace: f.ns, Entry: "x", ProbedAt: now}, "replica"},
		{"a malformed namespace", &galleyv1.ReportHealthRequest{Replica: "a", Namespace: "Not A Namespace", Entry: "x", ProbedAt: now}, "namespace"},
		{"an entry that is no name", &galleyv1.ReportHealthRequest{Replica: "a", Namespace: f.ns, Entry: "../x", ProbedAt: now}, "entry"},
		{"no time", &galleyv1.ReportHealthRequest{Replica: "a", Namespace: f.ns, Entry: "x"}, "probed_at"},
		{"an oversized message", &galleyv1.ReportHealthRequest{Replica: "a", Namespace: f.ns, Entry: "x", ProbedAt: now, Message: strings.Repeat("m", maxHealthMessage+1)}, "at most 1024"},
	} {
		if _, err := f.client.ReportHealth(context.Background(), c.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a health report with %s: %v, want InvalidArgument containing %q", c.name, err, c.want)
		}
	}
	refusing := New(Options{Istio: f.istio, Caller: func(string) bool { return false }, Log: slog.New(slog.DiscardHandler), Now: time.Now})
	if _, err := refusing.Connect(context.Background(), &galleyv1.ConnectRequest{Replica: "a", Workload: ok(), ConnectedAt: now}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a caller that is not discovery: %v", err)
	}
	if _, err := refusing.ReportHealth(context.Background(), &galleyv1.ReportHealthRequest{Replica: "a", Namespace: f.ns, Entry: "x", ProbedAt: now, Healthy: true}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a health report from a caller that is not discovery: %v", err)
	}
}

func (f *fixture) report(replica, entry string, healthy bool, message string, at time.Time) error {
	_, err := f.client.ReportHealth(context.Background(), &galleyv1.ReportHealthRequest{
		Replica: replica, Namespace: f.ns, Entry: entry, Healthy: healthy, Message: message, ProbedAt: timestamppb.New(at),
	})
	return err
}

// healthCondition is the entry's Healthy condition as the apiserver holds
// it, nil when it has none.
func (f *fixture) healthCondition(t *testing.T, name string) *metav1alpha1.IstioCondition {
	t.Helper()
	for _, c := range f.entry(t, name).Status.GetConditions() {
		if c.GetType() == istio.ConditionHealthy {
			return c
		}
	}
	return nil
}

func TestAWorkloadsHealthReportsBecomeItsEntrysHealthyConditionFromTheReplicaThatControlsIt(t *testing.T) {
	f := newFixture(t, "autoreg-health", time.Second)
	connected := time.Now().Truncate(time.Second)
	name, err := f.connect("discovery-a", f.workload("10.9.0.11"), connected)
	if err != nil {
		t.Fatal(err)
	}
	if c := f.healthCondition(t, name); c != nil {
		t.Fatalf("a new entry has a Healthy condition %v before any probe", c)
	}
	probed := connected.Add(time.Second)
	if err := f.report("discovery-a", name, false, "HTTP probe: 503 Service Unavailable", probed); err != nil {
		t.Fatal(err)
	}
	c := f.healthCondition(t, name)
	if c.GetStatus() != "False" || c.GetMessage() != "HTTP probe: 503 Service Unavailable" || !c.GetLastProbeTime().AsTime().Equal(probed) || !c.GetLastTransitionTime().AsTime().Equal(probed) {
		t.Fatalf("after an unhealthy report: %v", c)
	}
	healthyAt := probed.Add(time.Second)
	if err := f.report("discovery-a", name, true, "ignored when healthy", healthyAt); err != nil {
		t.Fatal(err)
	}
	if c := f.healthCondition(t, name); c.GetStatus() != "True" || c.GetMessage() != "" || !c.GetLastTransitionTime().AsTime().Equal(healthyAt) {
		t.Fatalf("after a healthy report: %v", c)
	}
	// A report older than the condition (a replica slow to relay it), one
	// from a replica that no longer controls the entry, and the same
	// verdict again change nothing.
	rv := f.entry(t, name).ResourceVersion
	if err := f.report("discovery-a", name, false, "late", probed.Add(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := f.report("discovery-b", name, false, "not the controller", healthyAt.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := f.report("discovery-a", name, true, "", healthyAt.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := f.entry(t, name).ResourceVersion; got != rv {
		t.Fatalf("the entry was written (resourceVersion %s → %s) by reports that change nothing: %v", rv, got, f.healthCondition(t, name))
	}
	// The workload moves to discovery-b: its reports are written now, and
	// the transition time moves only with the status.
	if _, err := f.connect("discovery-b", f.workload("10.9.0.11"), healthyAt.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := f.report("discovery-b", name, true, "", healthyAt.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := f.report("discovery-b", name, false, "connection refused", healthyAt.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if c := f.healthCondition(t, name); c.GetStatus() != "False" || c.GetMessage() != "connection refused" || !c.GetLastTransitionTime().AsTime().Equal(healthyAt.Add(5*time.Second)) {
		t.Fatalf("after the move: %v", c)
	}
	if err := f.report("discovery-b", "vms-10.9.0.99-vm-net", true, "", time.Now()); status.Code(err) != codes.NotFound {
		t.Errorf("a report for an entry that does not exist: %v, want NotFound", err)
	}
}

func TestEntryNamesAreIstiosAndFitAnObjectName(t *testing.T) {
	for _, c := range []struct {
		w    *galleyv1.Workload
		want string
	}{
		{&galleyv1.Workload{Group: "vms", Address: "10.0.0.1"}, "vms-10.0.0.1"},
		{&galleyv1.Workload{Group: "vms", Address: "2001:db8::1", Network: "net1"}, "vms-2001-db8--1-net1"},
	} {
		if got := EntryName(c.w); got != c.want {
			t.Errorf("EntryName(%v) = %q, want %q", c.w, got, c.want)
		}
	}
	long := EntryName(&galleyv1.Workload{Group: strings.Repeat("g", 250), Address: "10.0.0.1"})
	if len(long) != maxNameLength || !strings.HasSuffix(long, "-10.0.0.1") {
		t.Errorf("a long name is cut from the front to 253: %q (%d)", long, len(long))
	}
}

func TestWhichEntriesAreStale(t *testing.T) {
	now := time.Unix(1e9, 0)
	entry := func(annotations map[string]string) *clientnetworking.WorkloadEntry {
		return &clientnetworking.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Annotations: annotations}}
	}
	ts := func(d time.Duration) string { return now.Add(-d).Format(timeFormat) }
	withHealth := func(we *clientnetworking.WorkloadEntry) *clientnetworking.WorkloadEntry {
		we.Status.Conditions = []*metav1alpha1.IstioCondition{{Type: istio.ConditionHealthy, Status: "True"}}
		return we
	}
	for _, c := range []struct {
		name string
		we   *clientnetworking.WorkloadEntry
		want bool
	}{
		{"a user's", entry(map[string]string{AnnotationDisconnectedAt: ts(time.Hour)}), false},
		{"connected", entry(map[string]string{AnnotationGroup: "g", AnnotationConnectedAt: ts(time.Minute)}), false},
		{"connected longer than a connection lasts", entry(map[string]string{AnnotationGroup: "g", AnnotationConnectedAt: ts(time.Hour)}), true},
		{"disconnected within the grace period", entry(map[string]string{AnnotationGroup: "g", AnnotationDisconnectedAt: ts(5 * time.Second)}), false},
		{"disconnected for the grace period", entry(map[string]string{AnnotationGroup: "g", AnnotationDisconnectedAt: ts(10 * time.Second)}), true},
		{"disconnected at a time that does not parse", entry(map[string]string{AnnotationGroup: "g", AnnotationDisconnectedAt: "yesterday"}), true},
		{"neither", entry(map[string]string{AnnotationGroup: "g"}), false},
		{"a user's, health-checked, with no health, disconnected", entry(map[string]string{AnnotationHealthChecks: "true", AnnotationDisconnectedAt: ts(time.Hour)}), false},
		{"a user's, health-checked, with its health, disconnected", withHealth(entry(map[string]string{AnnotationHealthChecks: "true", AnnotationDisconnectedAt: ts(time.Hour)})), true},
		{"a user's, health-checked, with its health, connected", withHealth(entry(map[string]string{AnnotationHealthChecks: "true", AnnotationConnectedAt: ts(time.Minute)})), false},
	} {
		if got := stale(c.we, now, 10*time.Second, 30*time.Minute); got != c.want {
			t.Errorf("%s: stale = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAWorkloadNamingItsHealthCheckedEntryControlsItReportsIntoItAndLosesItsHealthAfterLeaving(t *testing.T) {
	f := newFixture(t, "autoreg-named", time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.server.Run(ctx) }()
	entries := f.istio.NetworkingV1().WorkloadEntries(f.ns)
	for name, annotations := range map[string]map[string]string{
		"checked": {AnnotationHealthChecks: "true"},
		"plain":   nil,
	} {
		we := &clientnetworking.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}, Spec: networking.WorkloadEntry{Address: "10.9.0.20", ServiceAccount: "legacy"}}
		if _, err := entries.Create(context.Background(), we, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	named := func(entry string) *galleyv1.Workload {
		return &galleyv1.Workload{Namespace: f.ns, Entry: entry, ServiceAccount: "legacy", HealthChecked: true}
	}
	// An entry whose health is not checked is not controlled.
	if name, err := f.connect("discovery-a", named("plain"), time.Now()); err != nil || name != "" {
		t.Fatalf("a plain entry: %q, %v; want none controlled", name, err)
	}
	if we := f.entry(t, "plain"); we.Annotations[AnnotationController] != "" {
		t.Fatalf("a plain entry was marked: %v", we.Annotations)
	}
	connected := time.Now().Truncate(time.Second)
	name, err := f.connect("discovery-a", named("checked"), connected)
	if err != nil || name != "checked" {
		t.Fatalf("the checked entry: %q, %v", name, err)
	}
	if err := f.report("discovery-a", name, true, "", connected.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if c := f.healthCondition(t, name); c.GetStatus() != "True" {
		t.Fatalf("after a healthy report: %v", c)
	}
	// The workload leaves: after the grace period its health is no longer
	// known, so the condition goes (the entry stays, a user's).
	if err := f.disconnect("discovery-a", name, connected, connected.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 30*time.Second, "the Healthy condition removed after the grace period", func() bool { return f.healthCondition(t, name) == nil })
	if f.entry(t, name) == nil {
		t.Fatal("a user's entry was removed")
	}
	// Refused: an entry that does not exist, one of another service
	// account, a workload naming both a group and an entry.
	if _, err := f.connect("discovery-a", named("missing"), time.Now()); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a missing entry: %v", err)
	}
	intruder := named("checked")
	intruder.ServiceAccount = "intruder"
	if _, err := f.connect("discovery-a", intruder, time.Now()); status.Code(err) != codes.PermissionDenied {
		t.Errorf("another service account: %v", err)
	}
	both := named("checked")
	both.Group = "vms"
	if _, err := f.connect("discovery-a", both, time.Now()); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a group and an entry: %v", err)
	}
}
