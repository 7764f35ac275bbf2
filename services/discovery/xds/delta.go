package xds

// This file is the incremental (delta) protocol of a stream (conn.go
// holds what it shares with sotw.go): requests, which subscribe to and
// unsubscribe from names, ACK or NACK a response by its nonce, and on a
// new stream name the versions the proxy holds; and responses, which
// carry the resources that changed, each with its own version, and the
// names of those removed.

import (
	"context"
	"slices"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// onDeltaRequest handles an incremental request: subscription changes are
// answered, ACKs and NACKs recorded.
func (c *conn) onDeltaRequest(ctx context.Context, req *discoveryv3.DeltaDiscoveryRequest) error {
	if err := checkNames(req.GetResourceNamesSubscribe()); err != nil {
		return err
	}
	if err := checkNames(req.GetResourceNamesUnsubscribe()); err != nil {
		return err
	}
	if len(req.GetInitialResourceVersions()) > maxResourceNames {
		return checkNames(make([]string, len(req.GetInitialResourceVersions())))
	}
	t := req.GetTypeUrl()
	if t == xdstype.HealthInfoType {
		c.reportHealth(req.GetErrorDetail())
		return nil
	}
	if !c.serves(t) {
		return c.answerNotServed(ctx, t, req.GetResponseNonce())
	}
	w := c.watch(t)
	if w.started && (len(req.GetResourceNamesSubscribe()) > 0 || len(req.GetResourceNamesUnsubscribe()) > 0) {
		// A change of subscriptions costs a walk of the stream's names
		// and may rebuild them: paced, so a stream changing them in a
		// loop (or "changing" them by unsubscribing what it never had)
		// costs itself time, and the server little.
		c.nothingNew(ctx)
	}
	news := false
	if nonce := req.GetResponseNonce(); nonce != "" && nonce != w.sentNonce {
		c.s.metrics.staleNonce(t)
	} else if nonce != "" {
		if req.GetErrorDetail() != nil {
			news = c.nacked(t, w, "", nonce, req.GetErrorDetail().GetMessage())
		} else {
			news = c.acked(t, w, w.sentVersion, nonce)
		}
	}
	first := !w.started
	var initial []*nameVersion
	if first {
		for n, v := range req.GetInitialResourceVersions() {
			if len(n) <= maxNameBytes {
				initial = append(initial, &nameVersion{name: n, version: v})
			}
		}
	}
	var subscribe, unsubscribe []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if n != "*" {
			subscribe = append(subscribe, n)
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n != "*" {
			unsubscribe = append(unsubscribe, n)
		}
	}
	// Newly asked for (after the first request): sent even if unchanged.
	forget := unsubscribe
	if !first {
		forget = append(slices.Clone(subscribe), unsubscribe...)
	}
	c.mu.Lock()
	if first {
		w.started = true
		w.wildcard = wildcardType(t) && (len(req.GetResourceNamesSubscribe()) == 0 || slices.Contains(req.GetResourceNamesSubscribe(), "*"))
		w.held = c.s.held.intern(w.held.update(initial, nil))
	}
	if slices.Contains(req.GetResourceNamesSubscribe(), "*") {
		w.wildcard = true
	}
	if slices.Contains(req.GetResourceNamesUnsubscribe(), "*") {
		w.wildcard = false
	}
	w.names = w.names.with(subscribe, unsubscribe)
	if w.held.holdsAny(forget) {
		w.held = c.s.held.intern(w.held.update(nil, forget))
	}
	c.mu.Unlock()
	if err := c.checkSubscribed(); err != nil {
		return err
	}
	if !first && len(req.GetResourceNamesSubscribe()) == 0 {
		if !news && len(req.GetResourceNamesUnsubscribe()) == 0 {
			c.nothingNew(ctx)
		}
		return nil
	}
	return c.answer(t, w, first)
}

// respondDelta sends what changed of a type's resources as a delta
// response (respond): those built at another version than the proxy
// holds, and the names held that are no longer built (of only, when
// set).
func (c *conn) respondDelta(t string, w *watch, gen *translate.Generator, seen time.Time, only []string, force bool, start time.Time) error {
	names := w.watchedNames()
	if only != nil {
		names = only
	}
	var res []*named
	c.s.offload(func() { res = c.generate(t, gen, names) })
	current := make(map[string]bool, len(res))
	var out []*named
	for _, r := range res {
		current[r.name] = true
		if v, ok := w.held.version(r.name); ok && v == r.version {
			continue
		}
		out = append(out, r)
	}
	var removed []string
	inScope := func(n string) bool { return only == nil || slices.Contains(only, n) }
	for h := range w.held.all() { // sorted by name: so is removed
		if !current[h.name] && inScope(h.name) {
			removed = append(removed, h.name)
		}
	}
	if len(out) == 0 && len(removed) == 0 && !force {
		return nil
	}
	nonce := c.s.nextNonce()
	took, err := c.send(t, func() error {
		return c.sendDelta(&deltaResponse{head: &discoveryv3.DeltaDiscoveryResponse{
			TypeUrl: t, RemovedResources: removed, Nonce: nonce, SystemVersionInfo: c.pcSeen.Version,
		}, resources: out})
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.sent(w, c.pcSeen.Version, nonce, c.s.held.intern(w.held.update(versions(out), removed)), seen)
	c.mu.Unlock()
	c.s.metrics.sent(t, len(out)+len(removed), wireSize(out, true), time.Since(start), took)
	return nil
}
