package xds

// This file is the core of one proxy's stream, which both protocols
// share: what was sent and acknowledged per type, ACKs and NACKs (and
// their traces), how pushes are queued to a stream (latest wins, one
// goroutine at a time), and how a response is sent. The protocols are
// apart, as go-control-plane's server splits them: sotw.go is the
// state-of-the-world protocol, delta.go the incremental one. What a
// change means for the proxy is decided in targeting.go; resources are
// built and encoded in generation.go.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// pushEvent is a push waiting for a stream; later pushes merge into it.
type pushEvent struct {
	pc, prev *model.PushContext
	changes  model.ChangeSet
	seen     time.Time
	// trace is the push's span (invalid when not traced); a stream that
	// merges pushes keeps the latest's. fanout is its "fanout" span (nil
	// when not traced), which each stream given the push ends its part of
	// once: when it sent it, skipped it, merged it into a later push or
	// closed.
	trace  trace.SpanContext
	fanout *fanout

	// affected holds affectedClusters' answer for each set of load
	// assignment names a stream watches (nameSet → []string, never
	// changed): the proxies of one scope watch the same names, and a
	// load assignment's hosts follow from its name alone
	// (translate.Generator.DependsOn), so the change is matched against
	// them once. Every stream's copy of the event shares it, until a
	// stream merges another change into its copy (enqueue).
	affected *sync.Map
}

// fanout is a traced push's span from Push to the last stream's part of
// it: every proxy's targeting, generation and sends (pushes of untraced
// changes, endpoint churn, have none; the load tool measures them).
type fanout struct {
	left atomic.Int64
	span trace.Span
}

// done ends one stream's part; the last ends the span. Nil does nothing.
func (f *fanout) done() {
	if f != nil && f.left.Add(-1) == 0 {
		f.span.End()
	}
}

// Nack is the last rejection of a type by a proxy.
type Nack struct {
	Version string    `json:"version"`
	Nonce   string    `json:"nonce"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
	// Repeats counts the same rejection again (the same response NACKed
	// once more): not logged or counted again.
	Repeats int `json:"repeats,omitempty"`
}

// watch is one xDS type on one stream.
type watch struct {
	started  bool
	wildcard bool
	names    nameSet

	// What was last sent: state-of-the-world version and nonce; for delta
	// the version of each resource the proxy holds (as far as the server
	// knows: a NACKed resource counts as held, so it is not sent again
	// until it changes).
	sentVersion, sentNonce string
	sentAt                 time.Time
	sentCount              int
	held                   heldSet
	// heldSum is, for state of the world, the version sum of held.
	heldSum uint64
	// resumed marks a state-of-the-world watch whose first request
	// named the version it holds, until a response is decided.
	resumed bool

	ackedVersion string
	ackedNonce   string
	ackedAt      time.Time
	nack         *Nack
	// pendingSeen is when the change behind the last unacknowledged
	// response was seen, for convergence time; pendingTrace the span of
	// the proxy's push that sent it, which its ACK is traced under.
	pendingSeen  time.Time
	pendingTrace trace.SpanContext
}

// conn is one proxy's stream.
type conn struct {
	s        *Server
	id       string
	identity string // the SPIFFE ID of its client certificate, if any
	// registration is the WorkloadEntry the stream registered (auto-
	// registration), nil if none.
	registration *registration
	proxy        *model.Proxy
	delta        bool
	connectedAt  time.Time
	sendSotw     func(*sotwResponse) error
	sendDelta    func(*deltaResponse) error

	// work serializes what reads or changes the watches and sends: the
	// stream's requests and its pushes.
	work sync.Mutex

	mu      sync.Mutex // guards pending, pushing, closed, failed, retire, and watches for readers other than work's holder
	retire  retirement
	pending *pushEvent
	pushing bool
	closed  bool
	failed  error
	// aborted is closed when a send timed out (failed says why): the
	// stream's handler then ends the stream.
	aborted chan struct{}
	// idle paces requests that carry nothing new (a repeated NACK, a
	// stale nonce, an unchanged subscription): a proxy sending them in a
	// loop is slowed down, and costs the server little.
	idle    *rate.Limiter
	watches map[string]*watch
	pcSeen  *model.PushContext // the push context the proxy's resources come from
	// pushSeen is when the change behind the last push to the proxy was
	// first seen (from galley).
	pushSeen time.Time
	// problems are what translation dropped or degraded building the
	// proxy's resources, by the type of the response that built them
	// (keepProblems), and efProblems the EnvoyFilters' among them, by
	// EnvoyFilter key (namespace/name): a response of one type replaces
	// only what that type found.
	problems   map[string][]string
	efProblems map[string]map[string][]string
	// heldPush is the latest push the proxy holds all of (settle).
	heldPush uint64
	// pushTrace is the span of the push being sent (set by push, with
	// work held), which its responses' ACKs are traced under.
	pushTrace trace.SpanContext
}

// A stream's requests that carry nothing new are served at this rate
// (with this burst) at most; Envoy sends a few per push.
const (
	idleRequestsPerSecond = 50
	idleRequestsBurst     = 100
)

// nothingNew waits, when the stream has sent too many requests that carry
// nothing new, until it may be served again.
func (c *conn) nothingNew(ctx context.Context) {
	_ = c.idle.Wait(ctx) // an error: the stream is ending
}

func newConn(s *Server, p *model.Proxy, id string, delta bool) *conn {
	return &conn{
		s: s, id: id, proxy: p, delta: delta, connectedAt: time.Now(),
		watches: map[string]*watch{},
		idle:    rate.NewLimiter(idleRequestsPerSecond, idleRequestsBurst),
	}
}

// enqueue merges a push into the one waiting and, unless a push goroutine
// is already working for this stream, starts one. No goroutine waits for
// pushes per stream: with thousands of mostly idle streams, that is memory.
func (c *conn) enqueue(ev *pushEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		ev.fanout.done()
		return
	}
	if c.pending == nil {
		cp := *ev
		cp.changes = model.ChangeSet{}
		cp.changes.Merge(ev.changes)
		c.pending = &cp
	} else {
		c.pending.fanout.done() // sent with this one
		c.pending.pc, c.pending.trace, c.pending.fanout = ev.pc, ev.trace, ev.fanout
		c.pending.changes.Merge(ev.changes)
		c.pending.affected = new(sync.Map) // answers for the change alone no longer hold
	}
	if !c.pushing {
		c.pushing = true
		go c.drain()
	}
}

// drain sends pending pushes until there are none (generating them takes
// a slot of the server's, sending does not).
func (c *conn) drain() {
	for {
		c.mu.Lock()
		ev := c.pending
		c.pending = nil
		if ev == nil || c.closed {
			if ev != nil {
				ev.fanout.done()
			}
			c.pushing = false
			c.retireIfQuiet()
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.work.Lock()
		err := c.push(ev)
		ev.fanout.done()
		if err == nil {
			c.mu.Lock()
			c.settle()
			c.mu.Unlock()
		}
		c.work.Unlock()
		if err != nil {
			c.s.log.Warn("push failed; closing the stream", "proxy", c.id, "error", err)
			c.mu.Lock()
			c.failed, c.closed, c.pushing = err, true, false
			if c.pending != nil {
				c.pending.fanout.done()
				c.pending = nil
			}
			c.mu.Unlock()
			return
		}
	}
}

// handle runs a request's handling with the stream's work lock; a push
// that failed ends the stream here.
func (c *conn) handle(f func() error) error {
	c.mu.Lock()
	failed := c.failed
	c.mu.Unlock()
	if failed != nil {
		return failed
	}
	c.work.Lock()
	defer c.work.Unlock()
	return f()
}

func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// send writes one response of type t, and tells how long the proxy took
// it. While the proxy takes more than a second to make room for it, it
// counts as behind; past the server's send timeout the stream is aborted.
func (c *conn) send(t string, f func() error) (time.Duration, error) {
	sending := time.Now()
	behind := false
	slow := time.AfterFunc(time.Second, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !behind {
			behind = true
			c.s.metrics.behind.Add(context.Background(), 1)
		}
	})
	var timeout *time.Timer
	if d := c.s.sendTimeout; d > 0 {
		timeout = time.AfterFunc(d, func() {
			c.abort(status.Errorf(codes.DeadlineExceeded, "the proxy took no response for %s (it reads too slowly or not at all): closing its stream", d))
		})
	}
	err := f()
	slow.Stop()
	if timeout != nil {
		timeout.Stop()
	}
	c.mu.Lock()
	if behind {
		behind = false
		c.s.metrics.behind.Add(context.Background(), -1)
	}
	c.mu.Unlock()
	if err != nil {
		c.s.metrics.sendFailed(t, err)
	}
	return time.Since(sending), err
}

// abort ends the stream with err (once), whatever it is doing.
func (c *conn) abort(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted == nil || c.failed != nil {
		return
	}
	c.failed, c.closed = err, true
	close(c.aborted)
	c.s.metrics.timedOut()
	c.s.log.Warn("closing a proxy's stream", "proxy", c.id, "reason", err)
}

// abortedWith is why the stream was aborted.
func (c *conn) abortedWith() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

func (c *conn) watch(t string) *watch {
	w := c.watches[t]
	if w == nil {
		w = &watch{}
		c.mu.Lock()
		c.watches[t] = w
		c.mu.Unlock()
	}
	return w
}

// watchedNames are the names a watch asks for; nil for wildcard.
func (w *watch) watchedNames() []string {
	if w.wildcard {
		return nil
	}
	return w.names.list()
}

// serves reports whether the server serves type t.
func (c *conn) serves(t string) bool { return slices.Contains(translate.Types(), t) }

// answerNotServed answers a request for a type the server does not serve
// (Istio's agent asks for NDS, PCDS and health information; Envoy for
// ECDS): the first request, with no response nonce, gets an empty
// response of that type, as istiod's fallback generator answers a type it
// has nothing for (pilot/pkg/xds/xdsgen.go findGenerator, apigen), so a
// client waiting on the type is not held up. Any later request of the
// type (its acknowledgement) is let be. Nothing is kept per type: a peer
// asking for many types costs a response each, paced as its other
// requests that bring nothing new, and is counted as "other".
func (c *conn) answerNotServed(ctx context.Context, t, responseNonce string) error {
	c.s.log.Debug("a request for a type not served", "proxy", c.id, "type_url", clip.String(t, 200), "answered", responseNonce == "")
	if responseNonce != "" {
		return nil
	}
	c.nothingNew(ctx)
	version := ""
	c.mu.Lock()
	if c.pcSeen != nil {
		version = c.pcSeen.Version
	}
	c.mu.Unlock()
	nonce := c.s.nextNonce()
	_, err := c.send(t, func() error {
		if c.delta {
			return c.sendDelta(&deltaResponse{head: &discoveryv3.DeltaDiscoveryResponse{TypeUrl: t, Nonce: nonce, SystemVersionInfo: version}})
		}
		return c.sendSotw(&sotwResponse{head: &discoveryv3.DiscoveryResponse{TypeUrl: t, Nonce: nonce, VersionInfo: version}})
	})
	return err
}

// respond sends a type's resources, by the stream's protocol. only limits
// the response to some names (an endpoint-only push); force sends even
// when nothing changed (a request must be answered).
func (c *conn) respond(t string, w *watch, gen *translate.Generator, seen time.Time, only []string, force bool) error {
	start := time.Now()
	if t == resourcev3.SecretType {
		c.authorizeSecrets()
	}
	defer c.keepProblems(t, gen, only != nil)
	if c.delta {
		return c.respondDelta(t, w, gen, seen, only, force, start)
	}
	return c.respondSotw(t, w, gen, seen, only, force, start)
}

// sent records, with mu held, a response sent on w: its nonce and
// version, that the proxy now holds held, and what its answer is timed
// (seen: when the change behind it was) and traced by.
func (c *conn) sent(w *watch, version, nonce string, held heldSet, seen time.Time) {
	w.held = held
	w.sentVersion, w.sentNonce, w.sentAt, w.sentCount = version, nonce, time.Now(), held.len()
	if !seen.IsZero() && w.pendingSeen.IsZero() {
		w.pendingSeen = seen
	}
	w.pendingTrace = c.pushTrace // the push that sent the latest response (none: not a push's)
}

// answer responds to a request with the current push context, if there is
// one yet (otherwise the first push will); force sends even an unchanged
// or empty response.
func (c *conn) answer(t string, w *watch, force bool) error {
	pc, seen := c.s.current()
	if pc == nil {
		return nil
	}
	if c.pcSeen == nil {
		c.setPushContext(pc, seen)
	}
	gen := translate.NewGenerator(c.pcSeen, c.proxy)
	return c.respond(t, w, gen, time.Time{}, nil, force)
}

// secretAccessTimeout bounds asking galley whether a proxy may have its
// credentials; past it the proxy gets none this time.
const secretAccessTimeout = 5 * time.Second

// authorizeSecrets asks, before the proxy's credentials are built,
// whether its verified service account may read its namespace's Secrets
// (Istio's pilot asks before it serves them; galley reviews and caches),
// and records the refusal, if any, on the proxy, logged when it changes.
// Without an answer the proxy gets no credentials: fail closed. Called
// with work held.
func (c *conn) authorizeSecrets() {
	p := c.proxy
	if c.s.secretAccess == nil || p.VerifiedNamespace == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), secretAccessTimeout)
	defer cancel()
	allowed, reason, err := c.s.secretAccess(ctx, p.VerifiedNamespace, p.VerifiedServiceAccount)
	switch {
	case err != nil:
		reason = fmt.Sprintf("could not tell whether %s/%s may read its namespace's Secrets: %v", p.VerifiedNamespace, p.VerifiedServiceAccount, err)
	case allowed:
		reason = ""
	case reason == "":
		reason = p.VerifiedNamespace + "/" + p.VerifiedServiceAccount + " may not read its namespace's Secrets"
	}
	reason = clip.String(reason, 512)
	if reason != p.SecretsRefused() && reason != "" {
		c.s.log.Warn("withholding a proxy's credentials", "proxy", c.id, "reason", reason)
	}
	p.SetSecretsRefused(reason)
}

// acked records an ACK; it reports false for one already recorded.
func (c *conn) acked(t string, w *watch, version, nonce string) bool {
	c.mu.Lock()
	if w.ackedNonce == nonce && w.ackedVersion == version {
		c.mu.Unlock()
		return false
	}
	w.ackedVersion, w.ackedNonce, w.ackedAt = version, nonce, time.Now()
	seen, traced, sentAt := w.pendingSeen, w.pendingTrace, w.sentAt
	w.pendingSeen, w.pendingTrace = time.Time{}, trace.SpanContext{}
	c.settle()
	c.retireIfQuiet()
	c.mu.Unlock()
	if !seen.IsZero() {
		c.s.metrics.converged(t, time.Since(seen))
	}
	c.traceAnswer(traced, t, sentAt, version, "")
	return true
}

// traceAnswer records, under the span of the push that sent it, a
// response's answer: a span "proxy.ack" from the send to the answer, an
// error with the proxy's reason for a NACK.
func (c *conn) traceAnswer(push trace.SpanContext, t string, sentAt time.Time, version, nack string) {
	if !push.IsValid() {
		return
	}
	_, span := c.s.tracer.Start(trace.ContextWithSpanContext(context.Background(), push), "proxy.ack", trace.WithTimestamp(sentAt),
		trace.WithAttributes(attribute.String("proxy", c.id), attribute.String("type", xdstype.Short(t)), attribute.String("version", version)))
	if nack != "" {
		span.SetStatus(otelcodes.Error, clip.String(nack, 512))
	}
	span.End()
}

// nacked records a NACK. The first rejection of a response is counted
// and logged (the reason cut short); the same response rejected again
// (a proxy NACKing in a loop) is only counted on the Nack, and nacked
// reports false.
func (c *conn) nacked(t string, w *watch, version, nonce, msg string) bool {
	c.mu.Lock()
	if w.nack != nil && w.nack.Nonce == nonce && w.nack.Version == w.sentVersion {
		w.nack.Repeats++
		c.mu.Unlock()
		return false
	}
	w.nack = &Nack{Version: w.sentVersion, Nonce: nonce, Message: clip.String(msg, 4096), At: time.Now()}
	traced, sentAt, rejected := w.pendingTrace, w.sentAt, w.sentVersion
	w.pendingSeen, w.pendingTrace = time.Time{}, trace.SpanContext{}
	c.retireIfQuiet()
	c.mu.Unlock()
	c.traceAnswer(traced, t, sentAt, rejected, cmp.Or(msg, "rejected"))
	c.s.metrics.rejected(t)
	c.s.log.Warn("proxy rejected a response", "proxy", c.id, "type", xdstype.Short(t), "rejected_version", w.sentVersion, "kept_version", version, "reason", clip.String(msg, 512))
	return true
}

// checkSubscribed refuses a stream that has subscribed to more names, or
// to names of more bytes, over all its types and requests, than one
// request may name: a delta stream could otherwise grow its subscriptions
// without bound, request by request. Called with work held.
func (c *conn) checkSubscribed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, size := 0, 0
	for _, w := range c.watches {
		n += w.names.len()
		size += w.names.bytes()
	}
	if n > maxResourceNames {
		return status.Errorf(codes.InvalidArgument, "the stream subscribes to %d resource names, more than %d", n, maxResourceNames)
	}
	if size > maxSubscribedBytes {
		return status.Errorf(codes.InvalidArgument, "the stream subscribes to %d bytes of resource names, more than %d", size, maxSubscribedBytes)
	}
	return nil
}

// wireSize is the size of resources as a response carries them.
func wireSize(resources []*named, delta bool) int {
	n := 0
	for _, r := range resources {
		if delta {
			n += r.deltaHead.Len() + r.anyPart.Len()
		} else {
			n += r.sotw.Len()
		}
	}
	return n
}
