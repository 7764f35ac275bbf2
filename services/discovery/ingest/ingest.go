// Package ingest feeds discovery's store from galley's MCP subscription
// (or from a directory of YAML, through the same Apply path), and turns
// bursts of changes into push contexts: a change that comes alone goes out
// at once, a burst is merged until a quiet period after its last change
// (batching), and no push waits longer than a maximum after its first.
package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// PushFunc receives each push context with what changed and when the
// first change in it was seen, within the push's span (ctx's).
type PushFunc func(ctx context.Context, pc *model.PushContext, changes model.ChangeSet, seen time.Time)

// Options configures an Ingest.
type Options struct {
	Log   *slog.Logger
	Meter metric.Meter
	// IstioMeter is the meter of the metrics named as Istio's pilot names
	// them (telemetry.Providers.Istio); none when nil.
	IstioMeter metric.Meter
	// First is how long a change that comes after thirty Quiet periods
	// without any waits for others (default 1ms); each further change doubles the
	// wait, up to Quiet (default 100ms): how long no change must arrive
	// before a burst is pushed. Max bounds the wait after a push's first
	// change (default 10s). First equal to Quiet is a fixed window.
	First, Quiet, Max time.Duration
	DomainSuffix      string
	// TypeURLs must each have been applied once before the first push, so
	// that a restarted discovery never serves a half-read mesh.
	TypeURLs []string
	Push     PushFunc
	// JWKS gives push contexts the keys RequestAuthentications fetch
	// from their issuers (nil: none; their tokens are refused).
	JWKS model.JWKSSource
	// Tracer traces each push: a span "discovery.push" from the first
	// change seen, under the span of the first change galley traced
	// (linked to the others merged into it), with "debounce" and
	// "pushcontext" under it; none when nil. Push gets the span only for a
	// push of traced changes.
	Tracer trace.TracerProvider
	// Revision is this discovery's revision: Istio configuration labelled
	// istio.io/rev for another one is left out, as if deleted
	// (controlplane.InRevision).
	Revision string
}

// Ingest is the store, its writers and the debouncer.
type Ingest struct {
	o Options
	m *ingestMetrics

	mu        sync.Mutex
	store     *model.Store
	applied   map[string]bool
	synced    chan struct{}
	firstSeen time.Time
	events    int
	batch     batching
	reasons   map[string]bool // Istio's push triggers of the updates since the last push
	// changes are the spans of the traced changes since the last push
	// (the first maxLinks).
	changes []trace.SpanContext
	kick    chan struct{}
	tracer  trace.Tracer
}

// maxLinks bounds the changes a push's span names: a burst of thousands
// of endpoint changes is one push.
const maxLinks = 32

// New returns an Ingest.
func New(o Options) (*Ingest, error) {
	if o.Quiet <= 0 {
		o.Quiet = 100 * time.Millisecond
	}
	if o.Max <= 0 {
		o.Max = 10 * time.Second
	}
	if o.First <= 0 {
		o.First = min(time.Millisecond, o.Quiet)
	}
	if o.First > o.Quiet {
		return nil, fmt.Errorf("debounce: first %s is longer than quiet %s", o.First, o.Quiet)
	}
	m, err := newMetrics(o.Meter, cmp.Or[metric.Meter](o.IstioMeter, noop.Meter{}))
	if err != nil {
		return nil, err
	}
	i := &Ingest{
		o: o, m: m, store: model.NewStore(), applied: map[string]bool{}, reasons: map[string]bool{},
		batch:  batching{first: o.First, quiet: o.Quiet},
		synced: make(chan struct{}), kick: make(chan struct{}, 1),
		tracer: cmp.Or[trace.TracerProvider](o.Tracer, tracenoop.NewTracerProvider()).Tracer("flotilla/discovery"),
	}
	if len(o.TypeURLs) == 0 {
		close(i.synced)
	}
	return i, nil
}

// Synced is closed once every collection has been received once.
func (i *Ingest) Synced() <-chan struct{} { return i.synced }

// Apply stores one response of a collection (it is the MCP client's
// handler). Resources that do not decode are reported in the error, so
// the response is NACKed with the reason; the others are applied.
func (i *Ingest) Apply(typeURL string, updated []*mcp.Resource, removed []string) error {
	var bad []error
	i.mu.Lock()
	for _, r := range updated {
		if _, config := istio.ByTypeURL(typeURL); config && !controlplane.InRevision(r.Labels, i.o.Revision) {
			i.store.Delete(typeURL, r.Name) // relabelled away from this revision, or never its
			continue
		}
		if err := i.store.Put(typeURL, r.Name, model.Meta{Labels: r.Labels, Annotations: r.Annotations, Created: r.Created, Version: r.ObjectVersion()}, r.Body); err != nil {
			bad = append(bad, err)
		}
		if r.Trace.IsValid() && len(i.changes) < maxLinks && !slices.ContainsFunc(i.changes, r.Trace.Equal) {
			i.changes = append(i.changes, r.Trace)
		}
	}
	for _, n := range removed {
		i.store.Delete(typeURL, n)
	}
	i.changed(time.Now())
	i.reasons[trigger(typeURL)] = true
	if !i.applied[typeURL] {
		i.applied[typeURL] = true
		if i.allApplied() {
			close(i.synced)
		}
	}
	i.mu.Unlock()
	i.m.received(typeURL, len(updated), len(removed))
	select {
	case i.kick <- struct{}{}:
	default:
	}
	if len(bad) > 0 {
		i.m.rejected.Add(context.Background(), int64(len(bad)))
		return fmt.Errorf("%d of %d resources rejected: %w", len(bad), len(updated), errors.Join(bad...))
	}
	return nil
}

// KeysChanged schedules a full push: the keys of a JWKS location
// changed (the JWKS resolver's OnChange).
func (i *Ingest) KeysChanged() {
	i.mu.Lock()
	i.store.KeysChanged()
	i.changed(time.Now())
	i.reasons["config"] = true // a RequestAuthentication's keys
	i.mu.Unlock()
	select {
	case i.kick <- struct{}{}:
	default:
	}
}

// changed counts a change seen at now. Must hold i.mu.
func (i *Ingest) changed(now time.Time) {
	if i.firstSeen.IsZero() {
		i.firstSeen = now
	}
	i.events++
	i.batch.changed(now)
}

// pushSpan starts a push's span: from the first change seen (the first
// push: from now), the child of the first traced change's span and linked
// to the others, with its debounce and push context build under it.
func (i *Ingest) pushSpan(changes []trace.SpanContext, seen, start, built time.Time, pc *model.PushContext, cs model.ChangeSet, events int) (context.Context, trace.Span) {
	ctx := context.Background()
	opts := []trace.SpanStartOption{trace.WithAttributes(
		attribute.String("version", pc.Version), attribute.Bool("full", cs.Full), attribute.Int("events", events),
		attribute.Int("endpoint_services", len(cs.Endpoints)),
	)}
	if !seen.IsZero() {
		opts = append(opts, trace.WithTimestamp(seen))
	}
	if len(changes) > 0 {
		ctx = trace.ContextWithRemoteSpanContext(ctx, changes[0])
		for _, sc := range changes[1:] {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := i.tracer.Start(ctx, "discovery.push", opts...)
	if !seen.IsZero() {
		_, d := i.tracer.Start(ctx, "debounce", trace.WithTimestamp(seen))
		d.End(trace.WithTimestamp(start))
	}
	_, b := i.tracer.Start(ctx, "pushcontext", trace.WithTimestamp(start))
	b.End(trace.WithTimestamp(built))
	return ctx, span
}

func (i *Ingest) allApplied() bool {
	select {
	case <-i.synced:
		return false // already closed
	default:
	}
	for _, t := range i.o.TypeURLs {
		if !i.applied[t] {
			return false
		}
	}
	return true
}

// Run debounces changes into pushes until ctx ends.
func (i *Ingest) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-i.synced:
	}
	var version uint64
	var last *model.PushContext
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	var deadline <-chan time.Time
	flush := func() {
		deadline = nil
		quiet.Stop()
		version++
		start := time.Now()
		i.mu.Lock()
		pc, changes := i.store.Build(model.BuildOptions{DomainSuffix: i.o.DomainSuffix, JWKS: i.o.JWKS}, last, version)
		seen, events, reasons, traced := i.firstSeen, i.events, i.reasons, i.changes
		i.firstSeen, i.events, i.reasons, i.changes = time.Time{}, 0, map[string]bool{}, nil
		i.batch.sent()
		i.mu.Unlock()
		built := time.Now()
		if last != nil && changes.Empty() {
			return
		}
		i.m.pushing(pc, built.Sub(start), events, time.Since(seen), changes.Full, reasons)
		i.o.Log.Debug("push", "version", pc.Version, "full", changes.Full, "endpoint_services", len(changes.Endpoints), "events", events)
		last = pc
		ctx, span := i.pushSpan(traced, seen, start, built, pc, changes, events)
		if len(traced) == 0 {
			// Only a change galley traced is followed to every proxy: a
			// push of untraced changes (the first, endpoint churn) would
			// otherwise make a span per proxy each time.
			ctx = context.Background()
		}
		i.o.Push(ctx, pc, changes, seen)
		span.End()
	}
	flush() // the first, full push once everything was received
	i.mu.Lock()
	if !i.batch.pending {
		i.batch.last = time.Time{} // the sync is not a burst: the first change after it goes out at once
	}
	i.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-i.kick:
			i.mu.Lock()
			due, pending := i.batch.due(), i.batch.pending
			i.mu.Unlock()
			if !pending {
				continue // sent with the push before
			}
			quiet.Reset(time.Until(due))
			if deadline == nil {
				deadline = time.After(i.o.Max)
			}
		case <-quiet.C:
			flush()
		case <-deadline:
			flush()
		}
	}
}
