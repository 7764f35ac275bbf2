package status

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/galley/kubesource"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

var vsGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}

// counting is a config sink counting what is published per object.
type counting struct {
	mu      sync.Mutex
	applied map[istio.ID]int
}

func (c *counting) Apply(_ context.Context, up []*istio.Object, del []istio.ID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range up {
		c.applied[o.ID()]++
	}
	for _, id := range del {
		c.applied[id]++
	}
	return nil
}

func (c *counting) count(id istio.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.applied[id]
}

// clients are the dynamic client of the test apiserver and a galley
// source on it (started by run), publishing into sink.
type clients struct {
	dyn  dynamic.Interface
	src  *kubesource.Source
	sink *counting
}

func newClients(t *testing.T, ns string) *clients {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	sink := &counting{applied: map[istio.ID]int{}}
	src := kubesource.New(kubesource.Options{
		Kube: env.Client, Istio: ic, Metadata: meta, SystemNamespace: ns,
		Log: slog.New(slog.DiscardHandler), DomainSuffix: "cluster.local",
	}, sink, noRegistry{})
	return &clients{dyn: dyn, src: src, sink: sink}
}

func (c *clients) run(ctx context.Context) { go func() { _ = c.src.Run(ctx) }() }

type noRegistry struct{}

func (noRegistry) Update(string, []*mcp.Resource, []string) (int, error) { return 0, nil }

func vs(t *testing.T, ns string, weights string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	doc := `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: ` + ns + `}
spec:
  hosts: [reviews]
  http:
  - route:
    - {destination: {host: reviews, subset: v1}, weight: ` + strings.Split(weights, "/")[0] + `}
    - {destination: {host: reviews, subset: v2}, weight: ` + strings.Split(weights, "/")[1] + `}
`
	if err := sigsyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

func messages(t *testing.T, dyn dynamic.Interface, ns string) []any {
	t.Helper()
	u, err := dyn.Resource(vsGVR).Namespace(ns).Get(context.Background(), "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msgs, _, _ := unstructured.NestedSlice(u.Object, "status", "validationMessages")
	return msgs
}

func TestOneLeaderWritesValidationStatusAndStatusWritesPushNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "status")
	if err != nil {
		t.Fatal(err)
	}
	c := newClients(t, ns)
	dyn, src, sink := c.dyn, c.src, c.sink
	// No webhook: an invalid object gets into the cluster.
	if _, err := dyn.Resource(vsGVR).Namespace(ns).Create(ctx, vs(t, ns, "70/70"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.run(ctx)

	type running struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	writers := map[string]running{}
	start := func(identity string) {
		w := New(Options{
			Kube: env.Client, Dynamic: dyn, Log: slog.New(slog.DiscardHandler), Rejected: src.Rejected,
			Identity: identity, LeaseNamespace: ns, LeaseName: "flotilla-galley-status",
			Interval: 50 * time.Millisecond, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
		})
		wctx, wcancel := context.WithCancel(ctx)
		r := running{cancel: wcancel, done: make(chan struct{})}
		go func() {
			_ = w.Run(wctx)
			close(r.done)
		}()
		writers[identity] = r
	}
	stop := func(identity string) {
		writers[identity].cancel()
		<-writers[identity].done
		delete(writers, identity)
	}
	defer func() {
		for id := range writers {
			stop(id)
		}
	}()
	start("galley-a")
	start("galley-b")

	xdstest.EventuallyWithin(t, 60*time.Second, "the validation message", func() bool {
		m := messages(t, dyn, ns)
		return len(m) == 1 && strings.Contains(m[0].(map[string]any)["message"].(string), "destination weights must add up to 100, not 140")
	})
	holder := func() string {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, "flotilla-galley-status", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	first := holder()
	if _, ok := writers[first]; !ok {
		t.Fatalf("lease holder %q is not one of the writers", first)
	}
	// The leader goes away: the other takes over at once (the lease is released).
	stop(first)
	xdstest.EventuallyWithin(t, 60*time.Second, "a new leader", func() bool { h := holder(); return h != "" && h != first })

	// Fixing the object publishes it once; clearing its status publishes nothing.
	id := istio.ID{Kind: "VirtualService", Name: ns + "/reviews"}
	if n := sink.count(id); n != 0 {
		t.Fatalf("an invalid object was published %d times", n)
	}
	cur, err := dyn.Resource(vsGVR).Namespace(ns).Get(ctx, "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed := vs(t, ns, "50/50")
	fixed.SetResourceVersion(cur.GetResourceVersion())
	if _, err := dyn.Resource(vsGVR).Namespace(ns).Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "the status to clear", func() bool { return len(messages(t, dyn, ns)) == 0 })
	xdstest.EventuallyWithin(t, 60*time.Second, "the fix to be published", func() bool { return sink.count(id) == 1 })
	// The status write reaches the informer too; it must not be published.
	// A later change, of another VirtualService, comes through the same
	// watch after it: once that is published, the status write was seen.
	marker := vs(t, ns, "10/90")
	marker.SetName("marker")
	if _, err := dyn.Resource(vsGVR).Namespace(ns).Create(ctx, marker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "a later change published", func() bool {
		return sink.count(istio.ID{Kind: "VirtualService", Name: ns + "/marker"}) == 1
	})
	if n := sink.count(id); n != 1 {
		t.Fatalf("the object was published %d times; status writes must push nothing", n)
	}
}

// TestWhatDiscoveryFoundWrongWithAnEnvoyFilterIsInItsStatusUntilFixed:
// the findings galley takes from discovery (envoyfilterstatus) are
// written as a warning in the EnvoyFilter's status, without changing what
// is published, and cleared when no replica reports them.
func TestWhatDiscoveryFoundWrongWithAnEnvoyFilterIsInItsStatusUntilFixed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "efstatus")
	if err != nil {
		t.Fatal(err)
	}
	c := newClients(t, ns)
	k, _ := istio.ByName(istio.EnvoyFilter)
	gvr := schema.GroupVersionResource{Group: k.Group, Version: k.Version(), Resource: k.Plural}
	u := &unstructured.Unstructured{}
	if err := sigsyaml.Unmarshal([]byte(`apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: buffer}
spec:
  configPatches:
  - applyTo: CLUSTER
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 1024}}
`), &u.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := c.dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.run(ctx)
	id := istio.ID{Kind: istio.EnvoyFilter, Name: ns + "/buffer"}
	xdstest.EventuallyWithin(t, 60*time.Second, "the EnvoyFilter published", func() bool { return c.sink.count(id) == 1 })
	var mu sync.Mutex
	findings := map[istio.ID]string{id: "not applied in full to 2 proxies: EnvoyFilter " + ns + "/buffer patch 0 (CLUSTER MERGE): makes cluster x invalid"}
	w := New(Options{
		Kube: env.Client, Dynamic: c.dyn, Log: slog.New(slog.DiscardHandler), Rejected: c.src.Rejected,
		Findings: func() map[istio.ID]string {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(findings)
		},
		Identity: "galley-a", LeaseNamespace: ns, LeaseName: "flotilla-galley-status",
		Interval: 50 * time.Millisecond, LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	})
	go func() { _ = w.Run(ctx) }()
	messages := func() []any {
		got, err := c.dyn.Resource(gvr).Namespace(ns).Get(ctx, "buffer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		msgs, _, _ := unstructured.NestedSlice(got.Object, "status", "validationMessages")
		return msgs
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "the finding in the EnvoyFilter's status", func() bool {
		m := messages()
		if len(m) != 1 {
			return false
		}
		msg := m[0].(map[string]any)
		typ, _ := msg["type"].(map[string]any)
		return msg["level"] == "WARNING" && typ["name"] == FindingName && typ["code"] == FindingCode &&
			strings.Contains(msg["message"].(string), "patch 0 (CLUSTER MERGE): makes cluster x invalid")
	})
	mu.Lock()
	clear(findings)
	mu.Unlock()
	xdstest.EventuallyWithin(t, 60*time.Second, "the status cleared", func() bool { return len(messages()) == 0 })
	if n := c.sink.count(id); n != 1 {
		t.Errorf("the EnvoyFilter was published %d times: a status write publishes nothing", n)
	}
}
