package ipallocate

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	sigsyaml "sigs.k8s.io/yaml"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/publish"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/galley/kubesource"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// services records the registry Services galley publishes, by hostname.
type services struct {
	mu  sync.Mutex
	svc map[string]*registryv1.Service
}

func (s *services) UpdateContext(_ context.Context, typeURL string, up []*mcp.Resource, del []string) (int, error) {
	if typeURL != registry.ServiceTypeURL {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range del {
		for h, svc := range s.svc {
			if registry.ServiceName(svc.GetNamespace(), svc.GetHostname()) == name {
				delete(s.svc, h)
			}
		}
	}
	for _, r := range up {
		svc := &registryv1.Service{}
		if err := r.Body.UnmarshalTo(svc); err != nil {
			return 0, err
		}
		s.svc[svc.GetHostname()] = svc
	}
	return len(up) + len(del), nil
}

func (s *services) allocated(host string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.svc[host].GetAutoAllocatedAddresses()
}

type noRegistry struct{}

func (noRegistry) Update(string, []*mcp.Resource, []string) (int, error) { return 0, nil }

// replica is one galley replica's source and allocator.
type replica struct {
	cancel context.CancelFunc
	done   chan struct{}
	pub    *services
}

func startReplica(ctx context.Context, t *testing.T, ns, identity string) *replica {
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
	pub := &services{svc: map[string]*registryv1.Service{}}
	var c *Controller
	src := kubesource.New(kubesource.Options{
		Kube: env.Client, Istio: ic, Metadata: meta, SystemNamespace: ns,
		Log: slog.New(slog.DiscardHandler), DomainSuffix: "cluster.local",
		ServiceEntriesChanged: func() { c.Changed() },
	}, publish.New(pub), noRegistry{})
	c, err = NewController(Options{
		Kube: env.Client, Dynamic: dyn, Log: slog.New(slog.DiscardHandler), Objects: src.Objects, Synced: src.Synced(),
		IPv4: netip.MustParsePrefix(DefaultIPv4Prefix), IPv6: netip.MustParsePrefix(DefaultIPv6Prefix),
		Identity: identity, LeaseNamespace: ns, LeaseName: "flotilla-galley-ipallocate",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &replica{cancel: cancel, done: make(chan struct{}), pub: pub}
	go func() { _ = src.Run(rctx) }()
	go func() {
		_ = c.Run(rctx)
		close(r.done)
	}()
	return r
}

func (r *replica) stop() {
	r.cancel()
	<-r.done
}

func serviceEntry(t *testing.T, ns, name, hosts string, extra string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	doc := `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  hosts: [` + hosts + `]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: DNS
` + extra
	if err := sigsyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// readAddresses reads status.addresses as "host=value".
func readAddresses(t *testing.T, dyn dynamic.Interface, ns, name string) []string {
	t.Helper()
	u, err := dyn.Resource(serviceEntries).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "addresses")
	var out []string
	for _, a := range list {
		m, _ := a.(map[string]any)
		h, _ := m["host"].(string)
		v, _ := m["value"].(string)
		out = append(out, h+"="+v)
	}
	return out
}

// TestTheLeaderWritesAddressesThatEveryReplicaPublishesAndKeepsThemAcrossFailover
// runs two galley replicas (source, publisher and allocator each) on a
// real apiserver.
func TestTheLeaderWritesAddressesThatEveryReplicaPublishesAndKeepsThemAcrossFailover(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "ipalloc")
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	se := dyn.Resource(serviceEntries).Namespace(ns)
	// One written before any galley runs, with a status condition of
	// someone else's that must stay.
	pg, err := se.Create(ctx, serviceEntry(t, ns, "pg", "pg.example.com", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(pg.Object, []any{map[string]any{"type": "Reconciled", "status": "True"}}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if _, err := se.UpdateStatus(ctx, pg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	a := startReplica(ctx, t, ns, "galley-a")
	b := startReplica(ctx, t, ns, "galley-b")
	defer func() { a.stop(); b.stop() }()

	pgWant := []string{"pg.example.com=240.240.0.1", "pg.example.com=2001:2::1"}
	xdstest.EventuallyWithin(t, 60*time.Second, "pg's addresses in its status", func() bool {
		return slices.Equal(readAddresses(t, dyn, ns, "pg"), pgWant)
	})
	cur, err := se.Get(ctx, "pg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions"); len(conds) != 1 {
		t.Errorf("status.conditions %v: the allocator must leave the rest of the status alone", conds)
	}
	// Both replicas publish the addresses in the registry (the leader
	// wrote them; the other read them).
	for name, r := range map[string]*replica{"a": a, "b": b} {
		xdstest.EventuallyWithin(t, 30*time.Second, "replica "+name+" publishing pg's addresses", func() bool {
			return slices.Equal(r.pub.allocated("pg.example.com"), []string{"240.240.0.1", "2001:2::1"})
		})
	}

	// A second ServiceEntry gets the next addresses; one that opts out
	// gets none.
	if _, err := se.Create(ctx, serviceEntry(t, ns, "mq", "mq.example.com, mq-2.example.com", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	optOut := serviceEntry(t, ns, "cache", "cache.example.com", "")
	optOut.SetLabels(map[string]string{"networking.istio.io/enable-autoallocate-ip": "false"})
	if _, err := se.Create(ctx, optOut, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mqWant := []string{"mq.example.com=240.240.0.2", "mq.example.com=2001:2::2", "mq-2.example.com=240.240.0.3", "mq-2.example.com=2001:2::3"}
	xdstest.EventuallyWithin(t, 60*time.Second, "mq's addresses", func() bool {
		return slices.Equal(readAddresses(t, dyn, ns, "mq"), mqWant)
	})

	// The leader goes away; the other replica leads and changes nothing
	// that is written, and allocates after what is.
	holder := func() string {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, "flotilla-galley-ipallocate", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	first := holder()
	switch first {
	case "galley-a":
		a.stop()
		a = startReplica(ctx, t, ns, "galley-a2")
	case "galley-b":
		b.stop()
		b = startReplica(ctx, t, ns, "galley-b2")
	default:
		t.Fatalf("lease holder %q is not a replica", first)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "a new leader", func() bool { h := holder(); return h != "" && h != first })
	if _, err := se.Create(ctx, serviceEntry(t, ns, "kafka", "kafka.example.com", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "kafka's addresses", func() bool {
		return slices.Equal(readAddresses(t, dyn, ns, "kafka"), []string{"kafka.example.com=240.240.0.4", "kafka.example.com=2001:2::4"})
	})
	// kafka's allocation came after the opt-out's creation: had the
	// opt-out been given addresses, they would be there now.
	if got := readAddresses(t, dyn, ns, "cache"); len(got) != 0 {
		t.Errorf("the ServiceEntry that opts out has addresses %q", got)
	}
	if got := readAddresses(t, dyn, ns, "pg"); !slices.Equal(got, pgWant) {
		t.Errorf("pg's addresses became %q after failover, want %q", got, pgWant)
	}
	if got := readAddresses(t, dyn, ns, "mq"); !slices.Equal(got, mqWant) {
		t.Errorf("mq's addresses became %q after failover, want %q", got, mqWant)
	}

	// A copy of pg's status made by hand into a younger ServiceEntry is a
	// conflict: the younger one is given new addresses.
	dup, err := se.Create(ctx, serviceEntry(t, ns, "dup", "dup.example.com", ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "dup's addresses", func() bool { return len(readAddresses(t, dyn, ns, "dup")) == 2 })
	dup, err = se.Get(ctx, dup.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copied := []any{}
	for _, a := range pgWant {
		_, v, _ := strings.Cut(a, "=")
		copied = append(copied, map[string]any{"host": "dup.example.com", "value": v})
	}
	if err := unstructured.SetNestedSlice(dup.Object, copied, "status", "addresses"); err != nil {
		t.Fatal(err)
	}
	if _, err := se.UpdateStatus(ctx, dup, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.EventuallyWithin(t, 60*time.Second, "dup reassigned away from pg's addresses", func() bool {
		got := readAddresses(t, dyn, ns, "dup")
		return len(got) == 2 && !slices.Contains(got, "dup.example.com=240.240.0.1") && !slices.Contains(got, "dup.example.com=2001:2::1")
	})
	if got := readAddresses(t, dyn, ns, "pg"); !slices.Equal(got, pgWant) {
		t.Errorf("pg's addresses became %q in a conflict it is the elder of, want %q", got, pgWant)
	}
}
