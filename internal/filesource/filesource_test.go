package filesource

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// sink records what the source applies and keeps the resulting state.
type sink struct {
	mu      sync.Mutex
	state   map[istio.ID]*istio.Object
	applies []string
	notify  chan struct{}
}

func newSink() *sink {
	return &sink{state: map[istio.ID]*istio.Object{}, notify: make(chan struct{}, 100)}
}

func (s *sink) Apply(_ context.Context, up []*istio.Object, del []istio.ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, o := range up {
		s.state[o.ID()] = o
		parts = append(parts, "+"+o.Kind.Kind+":"+o.Key())
	}
	for _, id := range del {
		delete(s.state, id)
		parts = append(parts, "-"+id.Kind+":"+id.Name)
	}
	slices.Sort(parts)
	s.applies = append(s.applies, strings.Join(parts, " "))
	s.notify <- struct{}{}
	return nil
}

func (s *sink) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.applies) == 0 {
		return ""
	}
	return s.applies[len(s.applies)-1]
}

func (s *sink) hosts(kind, name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.state[istio.ID{Kind: kind, Name: name}]
	if o == nil {
		return nil
	}
	return o.Spec.(*networking.VirtualService).GetHosts()
}

func (s *sink) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.state)
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func vsDoc(name string, hosts ...string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: %s}
spec:
  hosts: [%s]
  http: [{route: [{destination: {host: %s}}]}]
`, name, strings.Join(hosts, ", "), hosts[0])
}

const reviewsDR = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}]
`

func newSource(t *testing.T, dir string, s Sink) *Source {
	t.Helper()
	return New(Options{Dir: dir, DefaultNamespace: "default", Log: slog.New(slog.DiscardHandler)}, s)
}

func TestScanAppliesEveryFileAndThenOnlyWhatChanged(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", vsDoc("reviews", "reviews")+"---\n"+reviewsDR)
	write(t, dir, "b.yml", vsDoc("ratings", "ratings"))
	write(t, dir, "notes.txt", "not config")
	snk := newSink()
	src := newSource(t, dir, snk)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if got := snk.last(); got != "+DestinationRule:default/reviews +VirtualService:default/ratings +VirtualService:default/reviews" {
		t.Fatalf("first scan applied %q", got)
	}
	// Nothing changed: nothing applied.
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if len(snk.applies) != 1 {
		t.Fatalf("an unchanged directory was applied again: %v", snk.applies)
	}
	// One object changes, one goes away, in one file: one atomic apply.
	write(t, dir, "a.yaml", vsDoc("reviews", "reviews", "reviews.prod.svc.cluster.local"))
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if got := snk.last(); got != "+VirtualService:default/reviews -DestinationRule:default/reviews" {
		t.Fatalf("change applied %q", got)
	}
	// A removed file takes its objects with it.
	if err := os.Remove(filepath.Join(dir, "b.yml")); err != nil {
		t.Fatal(err)
	}
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if got := snk.last(); got != "-VirtualService:default/ratings" {
		t.Fatalf("removal applied %q", got)
	}
}

func TestAnInvalidDocumentKeepsTheLastValidStateAndSaysWhereAndWhy(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews")+"---\n"+vsDoc("ratings", "ratings"))
	snk := newSink()
	src := newSource(t, dir, snk)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	broken := vsDoc("reviews", "reviews") + `---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings}
spec:
  hosts: [ratings]
  http:
  - route:
    - {destination: {host: ratings}, weight: 60}
    - {destination: {host: ratings}, weight: 60}
`
	write(t, dir, "mesh.yaml", broken)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if len(snk.applies) != 1 {
		t.Fatalf("a rejected change was applied: %v", snk.applies)
	}
	if got := snk.hosts("VirtualService", "default/ratings"); fmt.Sprint(got) != "[ratings]" {
		t.Fatalf("ratings lost its last valid state: %v", got)
	}
	probs := src.Problems()
	want := filepath.Join(dir, "mesh.yaml") + ":14: VirtualService default/ratings: spec.http[0].route: destination weights must add up to 100, not 120 (60+60)"
	if len(probs) != 1 || probs[0].Message != want {
		t.Fatalf("problems %v, want [%s]", probs, want)
	}
	// The fix goes through.
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews")+"---\n"+vsDoc("ratings", "ratings", "ratings.prod.svc.cluster.local"))
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if len(src.Problems()) != 0 || len(snk.hosts("VirtualService", "default/ratings")) != 2 {
		t.Fatalf("fix not applied: %v %v", src.Problems(), snk.applies)
	}
}

func TestAnUnreadableDocumentDeletesNothing(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews")+"---\n"+vsDoc("ratings", "ratings"))
	snk := newSink()
	src := newSource(t, dir, snk)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	// The second document is now a YAML syntax error: it might have been
	// ratings, so ratings stays.
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews")+"---\nkind: [unclosed\n")
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if snk.size() != 2 || len(snk.applies) != 1 {
		t.Fatalf("state %d objects after %v", snk.size(), snk.applies)
	}
	if p := src.Problems(); len(p) != 1 || !strings.Contains(p[0].Message, "mesh.yaml:8: invalid YAML") {
		t.Fatalf("problems %v", p)
	}
}

func TestTheSameObjectInTwoFilesIsRejectedInTheLaterFile(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", vsDoc("reviews", "reviews"))
	write(t, dir, "b.yaml", vsDoc("reviews", "other"))
	snk := newSink()
	src := newSource(t, dir, snk)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if got := snk.hosts("VirtualService", "default/reviews"); fmt.Sprint(got) != "[reviews]" {
		t.Fatalf("hosts %v", got)
	}
	p := src.Problems()
	if len(p) != 1 || !strings.Contains(p[0].Message, "b.yaml:1: VirtualService default/reviews: already defined in") {
		t.Fatalf("problems %v", p)
	}
}

func TestWatchingPicksUpEdits(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews"))
	snk := newSink()
	src := New(Options{Dir: dir, DefaultNamespace: "default", Log: slog.New(slog.DiscardHandler), Debounce: 20 * time.Millisecond}, snk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-src.Loaded():
	case <-time.After(20 * time.Second):
		t.Fatal("never loaded")
	}
	write(t, dir, "mesh.yaml", vsDoc("reviews", "reviews", "reviews.prod.svc.cluster.local"))
	deadline := time.After(20 * time.Second)
	for len(snk.hosts("VirtualService", "default/reviews")) != 2 {
		select {
		case <-snk.notify:
		case <-deadline:
			t.Fatalf("edit not picked up: %v", snk.applies)
		}
	}
}

func TestSubsetLookupsResolveShortNamesInTheirNamespace(t *testing.T) {
	docs := istio.Decode("x.yaml", []byte(reviewsDR), "default")
	idx := validation.NewSubsetIndex([]*istio.Object{docs[0].Object}, "cluster.local")
	if names, ok := idx.Subsets("default", "reviews.default.svc.cluster.local"); !ok || fmt.Sprint(names) != "[v1]" {
		t.Fatalf("fqdn lookup: %v %v", names, ok)
	}
	if _, ok := idx.Subsets("other", "reviews"); ok {
		t.Fatal("a short name in another namespace matched")
	}
}

func TestARejectedDuplicateIsTakenOnceTheOtherFileLetsGo(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", vsDoc("reviews", "reviews"))
	write(t, dir, "b.yaml", vsDoc("reviews", "other"))
	snk := newSink()
	src := newSource(t, dir, snk)
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	// a.yaml drops the object; b.yaml, unchanged, now provides it.
	write(t, dir, "a.yaml", vsDoc("ratings", "ratings"))
	if err := src.Scan(); err != nil {
		t.Fatal(err)
	}
	if got := snk.hosts("VirtualService", "default/reviews"); fmt.Sprint(got) != "[other]" {
		t.Fatalf("hosts %v, want b.yaml's [other]", got)
	}
	if p := src.Problems(); len(p) != 0 {
		t.Fatalf("problems %v", p)
	}
}
