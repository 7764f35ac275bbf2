package ingest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

type pushed struct {
	pc      *model.PushContext
	changes model.ChangeSet
	trace   trace.SpanContext // the span Push was given
}

func start(t *testing.T, quiet, maxWait time.Duration, types []string) (*Ingest, chan pushed) {
	t.Helper()
	return startWith(t, Options{First: quiet, Quiet: quiet, Max: maxWait, TypeURLs: types})
}

// startWith runs an Ingest with o (its log, meter and push are the
// test's) until the test ends.
func startWith(t *testing.T, o Options) (*Ingest, chan pushed) {
	t.Helper()
	ch := make(chan pushed, 100)
	o.Log, o.Meter = slog.New(slog.DiscardHandler), noop.NewMeterProvider().Meter("t")
	o.Push = func(ctx context.Context, pc *model.PushContext, cs model.ChangeSet, _ time.Time) {
		ch <- pushed{pc, cs, trace.SpanContextFromContext(ctx)}
	}
	in, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = in.Run(ctx) }()
	return in, ch
}

func svc(t *testing.T, name string) *mcp.Resource {
	t.Helper()
	r, err := mcp.NewResource("default/"+name, &registryv1.Service{Hostname: name, Namespace: "default"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func wait(t *testing.T, ch chan pushed) pushed {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no push")
	}
	return pushed{}
}

func none(t *testing.T, ch chan pushed, d time.Duration) {
	t.Helper()
	select {
	case p := <-ch:
		t.Fatalf("unexpected push %s (%+v)", p.pc.Version, p.changes)
	case <-time.After(d):
	}
}

func TestNothingIsPushedUntilEveryCollectionArrived(t *testing.T) {
	in, ch := start(t, 10*time.Millisecond, time.Hour, []string{registry.ServiceTypeURL, registry.EndpointSetTypeURL})
	if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "a")}, nil); err != nil {
		t.Fatal(err)
	}
	none(t, ch, 100*time.Millisecond)
	if err := in.Apply(registry.EndpointSetTypeURL, nil, nil); err != nil { // an empty collection counts
		t.Fatal(err)
	}
	p := wait(t, ch)
	if len(p.pc.Services()) != 1 || !p.changes.Full {
		t.Fatalf("first push: %d services, %+v", len(p.pc.Services()), p.changes)
	}
}

func TestABurstOfChangesIsOnePush(t *testing.T) {
	in, ch := start(t, 50*time.Millisecond, time.Hour, []string{registry.ServiceTypeURL})
	if err := in.Apply(registry.ServiceTypeURL, nil, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, ch)
	for i := range 20 {
		if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "s"+string(rune('a'+i)))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	p := wait(t, ch)
	if len(p.pc.Services()) != 20 {
		t.Fatalf("the push after a burst has %d services, want all 20", len(p.pc.Services()))
	}
	none(t, ch, 200*time.Millisecond)
}

// TestAChangeAfterAQuietMeshIsPushedWithoutWaitingForQuiet: with quiet
// an hour, only the short first wait can send it (batching_test.go tests
// the policy's waits).
func TestAChangeAfterAQuietMeshIsPushedWithoutWaitingForQuiet(t *testing.T) {
	in, ch := startWith(t, Options{Quiet: time.Hour, Max: time.Hour, TypeURLs: []string{registry.ServiceTypeURL}})
	if err := in.Apply(registry.ServiceTypeURL, nil, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, ch)
	if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "a")}, nil); err != nil {
		t.Fatal(err)
	}
	if p := wait(t, ch); len(p.pc.Services()) != 1 {
		t.Fatalf("the push after the change has %d services, want 1", len(p.pc.Services()))
	}
}

func TestChangesThatNeverStopArePushedAtTheMaximumWait(t *testing.T) {
	in, ch := start(t, time.Hour, 50*time.Millisecond, []string{registry.ServiceTypeURL})
	if err := in.Apply(registry.ServiceTypeURL, nil, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, ch)
	// Changes every 5 ms for up to 10 s: the quiet period (an hour) never
	// comes, yet pushes do.
	got := 0
	for i := 0; i < 2000 && got < 2; i++ {
		if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "s")}, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			got++
		case <-time.After(5 * time.Millisecond):
		}
	}
	if got < 2 {
		t.Fatal("no push while changes kept coming")
	}
}

// TestConfigurationLabelledForAnotherRevisionIsNotThisRevisions: as
// istiod's revisions do, an object labelled istio.io/rev is used only by
// that revision's discovery, an unlabelled one by all; relabelling it away
// removes it.
func TestConfigurationLabelledForAnotherRevisionIsNotThisRevisions(t *testing.T) {
	kind, _ := istio.ByName(istio.VirtualService)
	vsType := kind.TypeURL()
	canary, ch := startWith(t, Options{Quiet: 10 * time.Millisecond, Max: time.Hour, TypeURLs: []string{vsType}, Revision: "canary"})
	def, defCh := startWith(t, Options{Quiet: 10 * time.Millisecond, Max: time.Hour, TypeURLs: []string{vsType}})
	vs := func(name, rev string) *mcp.Resource {
		var labels map[string]string
		if rev != "" {
			labels = map[string]string{"istio.io/rev": rev}
		}
		r, err := mcp.NewResource("default/"+name, &networking.VirtualService{Hosts: []string{name}}, labels, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	names := func(p pushed) []string {
		var out []string
		for _, v := range p.pc.VirtualServices() {
			out = append(out, v.Name)
		}
		slices.Sort(out)
		return out
	}
	all := []*mcp.Resource{vs("everyone", ""), vs("canary-only", "canary"), vs("default-only", "default")}
	for _, in := range []*Ingest{canary, def} {
		if err := in.Apply(vsType, all, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := names(wait(t, ch)); !slices.Equal(got, []string{"canary-only", "everyone"}) {
		t.Fatalf("revision canary uses %v", got)
	}
	if got := names(wait(t, defCh)); !slices.Equal(got, []string{"default-only", "everyone"}) {
		t.Fatalf("the default revision uses %v", got)
	}
	// Moved to the default revision: canary drops it.
	if err := canary.Apply(vsType, []*mcp.Resource{vs("canary-only", "default")}, nil); err != nil {
		t.Fatal(err)
	}
	if got := names(wait(t, ch)); !slices.Equal(got, []string{"everyone"}) {
		t.Fatalf("after relabelling, revision canary uses %v", got)
	}
}

func TestAResourceThatDoesNotDecodeIsRejectedWithItsNameAndTheRestApplied(t *testing.T) {
	in, ch := start(t, 10*time.Millisecond, time.Hour, []string{registry.ServiceTypeURL})
	bad := &mcp.Resource{Name: "default/bad", Body: &anypb.Any{TypeUrl: "type.googleapis.com/flotilla.registry.v1.Service", Value: []byte{0xff, 0x01}}}
	err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "good"), bad}, nil)
	if err == nil || !strings.Contains(err.Error(), "default/bad") || !strings.Contains(err.Error(), "1 of 2") {
		t.Fatalf("error %v, want the bad resource named", err)
	}
	p := wait(t, ch)
	if len(p.pc.Services()) != 1 || p.pc.Services()[0].GetHostname() != "good" {
		t.Fatalf("services %v, want the good one", p.pc.Services())
	}
}

// TestIstiosPushMetricsCountWhatGalleySentAndWhyEachPushWasMade reads
// the /metrics Prometheus scrapes after galley's updates of services and
// endpoints: pilot's inbound updates, push triggers, debounce and push
// context times and service count, under Istio's names.
func TestIstiosPushMetricsCountWhatGalleySentAndWhyEachPushWasMade(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-discovery"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	in, ch := startWith(t, Options{
		IstioMeter: tel.Istio.Meter("istio"),
		Quiet:      10 * time.Millisecond, Max: time.Hour, TypeURLs: []string{registry.ServiceTypeURL, registry.EndpointSetTypeURL},
	})
	if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "a"), svc(t, "b")}, nil); err != nil {
		t.Fatal(err)
	}
	es, err := mcp.NewResource("default/a/0", &registryv1.EndpointSet{ServiceHostname: "a", ServiceNamespace: "default", Shard: "0"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Apply(registry.EndpointSetTypeURL, []*mcp.Resource{es}, nil); err != nil {
		t.Fatal(err)
	}
	wait(t, ch) // the first push: both collections
	if err := in.Apply(registry.ServiceTypeURL, nil, []string{"default/b"}); err != nil {
		t.Fatal(err)
	}
	wait(t, ch)

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`pilot_inbound_updates{type="svc"} 2`,
		`pilot_inbound_updates{type="eds"} 1`,
		`pilot_inbound_updates{type="svcdelete"} 1`,
		`pilot_push_triggers{type="service"} 2`,
		`pilot_push_triggers{type="endpoint"} 1`,
		`pilot_debounce_time_count 2`,
		`pilot_debounce_time_bucket{le="0.01"}`,
		`pilot_pushcontext_init_seconds_count 2`,
		`pilot_pushcontext_init_seconds_bucket{le="0.5"}`,
		"pilot_services 1",
		"pilot_virt_services 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestAPushOfATracedChangeIsItsChildAndOthersAreNotFollowedToProxies: a
// push merging changes galley traced is a span under the first (linked to
// the others), with its debounce and push context, and Push gets it; a
// push of untraced changes is traced on its own but Push gets no span, so
// no span is made per proxy.
func TestAPushOfATracedChangeIsItsChildAndOthersAreNotFollowedToProxies(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	in, ch := startWith(t, Options{Quiet: 20 * time.Millisecond, Tracer: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))})
	wait(t, ch) // the first push
	change := func(n byte) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{n}, SpanID: trace.SpanID{n}, TraceFlags: trace.FlagsSampled, Remote: true})
	}
	a, b := svc(t, "a"), svc(t, "b")
	a.Trace, b.Trace = change(1), change(2)
	if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{a, b}, nil); err != nil {
		t.Fatal(err)
	}
	p := wait(t, ch)
	if p.trace.TraceID() != change(1).TraceID() {
		t.Fatalf("Push got span %v, want one in the first change's trace", p.trace)
	}
	// The push span ends once Push has returned, so it is exported a moment
	// after Push got it: wait for it (bounded) before reading its tree.
	push, ok := tracetest.SpanStub{}, false
	for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, s := range spans.GetSpans() {
			if s.SpanContext.Equal(p.trace) {
				push, ok = s, true
			}
		}
	}
	under := map[string]bool{}
	for _, s := range spans.GetSpans() {
		if s.Parent.Equal(p.trace) {
			under[s.Name] = true
		}
	}
	if push.Name != "discovery.push" || !push.Parent.Equal(change(1)) || len(push.Links) != 1 || !push.Links[0].SpanContext.Equal(change(2)) ||
		!under["debounce"] || !under["pushcontext"] {
		t.Fatalf("push span %q under %v, links %v; under it %v", push.Name, push.Parent, push.Links, under)
	}

	if err := in.Apply(registry.ServiceTypeURL, []*mcp.Resource{svc(t, "c")}, nil); err != nil {
		t.Fatal(err)
	}
	if p := wait(t, ch); p.trace.IsValid() {
		t.Fatalf("an untraced change's push gave Push span %v", p.trace)
	}
}
