package xds

import (
	"context"
	"slices"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/translate"
)

// This file decides what a change means for one proxy: a full push of
// every type it watches, an endpoints-only push of the clusters whose
// services changed, or nothing. The hosts a watched resource depends on
// come from translate (Generator.DependsOn); nothing here knows how
// resource names are made.

// push generates and sends what ev changes for this proxy.
func (c *conn) push(ev *pushEvent) error {
	start := time.Now()
	gen := translate.NewGenerator(ev.pc, c.proxy)
	first, own := c.pcSeen == nil, c.inboundAffected(ev)
	// An endpoints-only change concerns no proxy as a whole (Concerns):
	// the hosts it watches are not worked out for it.
	full := first || own || ev.changes.Full && ev.changes.Concerns(c.watchedHosts(gen), c.proxy, ev.pc.RootNamespace)
	c.setPushContext(ev.pc, ev.seen)
	if full {
		defer c.tracePush(ev, start, "full")()
		c.s.metrics.decided("full")
		types := translate.Types()
		if !first && !own {
			types = translate.ConcernedTypes(ev.changes)
		}
		for _, t := range types {
			if w := c.watches[t]; w != nil && w.started {
				if err := c.respond(t, w, gen, ev.seen, nil, false); err != nil {
					return err
				}
			}
		}
		c.s.metrics.pushed(ev.seen)
		return nil
	}
	w := c.watches[resourcev3.EndpointType]
	var affected []string
	if w != nil && w.started {
		affected = ev.affectedClusters(gen, w.names)
	}
	if len(affected) == 0 {
		c.s.metrics.decided("skipped") // nothing this proxy watches changed
		return nil
	}
	defer c.tracePush(ev, start, "eds")()
	c.s.metrics.decided("eds")
	// A cluster's TLS settings are built from its endpoints too (the
	// identities its servers may present; whether a proxyless client's
	// auto mTLS applies): the clusters go again first, which sends nothing
	// when they came out the same.
	if cw := c.watches[resourcev3.ClusterType]; cw != nil && cw.started {
		if err := c.respond(resourcev3.ClusterType, cw, gen, ev.seen, affected, false); err != nil {
			return err
		}
	}
	if err := c.respond(resourcev3.EndpointType, w, gen, ev.seen, affected, false); err != nil {
		return err
	}
	c.s.metrics.pushed(ev.seen)
	return nil
}

// tracePush starts, when the push is traced, the proxy's span of it
// ("proxy.push", from start, with the decision), which the responses it
// sends are answered under; the returned func ends it. Skipped proxies
// have no span: nothing was sent to them.
func (c *conn) tracePush(ev *pushEvent, start time.Time, decision string) func() {
	if !ev.trace.IsValid() {
		return func() {}
	}
	_, span := c.s.tracer.Start(trace.ContextWithSpanContext(context.Background(), ev.trace), "proxy.push", trace.WithTimestamp(start),
		trace.WithAttributes(attribute.String("proxy", c.id), attribute.String("decision", decision)))
	c.pushTrace = span.SpanContext()
	return func() {
		c.pushTrace = trace.SpanContext{}
		span.End()
	}
}

// setPushContext records the push context the proxy's resources come
// from, and when its change was seen (read by the status endpoint under
// mu).
func (c *conn) setPushContext(pc *model.PushContext, seen time.Time) {
	c.mu.Lock()
	c.pcSeen, c.pushSeen = pc, seen
	c.mu.Unlock()
}

// watchedHosts are the hosts a proxy that names what it watches (a
// proxyless client) depends on, as translate tells for each name. It is
// nil, which every full change concerns, for a proxy that watches
// everything of some type (sidecars) or a resource that depends on more
// than can be listed.
func (c *conn) watchedHosts(gen *translate.Generator) map[string]bool {
	for _, w := range c.watches {
		if w.started && w.wildcard {
			return nil // before any name is looked at: a sidecar's EDS names a thousand
		}
	}
	hosts := map[string]bool{}
	for t, w := range c.watches {
		if !w.started {
			continue
		}
		for _, name := range w.names.list() {
			deps, all := gen.DependsOn(t, name)
			if all {
				return nil
			}
			for _, h := range deps {
				hosts[h] = true
			}
		}
	}
	return hosts
}

// inboundAffected: a change of the proxy's own endpoints (one at its
// address added to, removed from or changed in a service) changes its
// inbound clusters and listeners, not only endpoints. Other endpoints of
// the services it serves coming and going do not: as in Istio, whose
// sidecar inbound is built from the proxy's own service targets, a peer
// scaled up or down reaches it as load assignments only.
func (c *conn) inboundAffected(ev *pushEvent) bool {
	for key := range ev.changes.Endpoints {
		if !slices.EqualFunc(ev.prev.EndpointsAt(key, c.proxy.IPs), ev.pc.EndpointsAt(key, c.proxy.IPs), func(a, b *registryv1.Endpoint) bool {
			return proto.Equal(a, b)
		}) {
			return true
		}
	}
	return false
}

// affectedClusters are the watched EDS clusters (names) built from a
// service whose endpoints changed, shared with every stream watching the
// same names. A cluster whose hosts cannot be listed is left to full
// pushes (inbound endpoint changes are one, inboundAffected).
func (ev *pushEvent) affectedClusters(gen *translate.Generator, names nameSet) []string {
	if v, ok := ev.affected.Load(names); ok {
		return v.([]string)
	}
	hosts := map[string]bool{}
	for key := range ev.changes.Endpoints {
		if _, host, ok := strings.Cut(key, "/"); ok {
			hosts[host] = true
		}
	}
	var out []string
	for _, name := range names.list() {
		deps, _ := gen.DependsOn(resourcev3.EndpointType, name)
		if slices.ContainsFunc(deps, func(h string) bool { return hosts[h] }) {
			out = append(out, name)
		}
	}
	v, _ := ev.affected.LoadOrStore(names, out) // sorted, as the names are
	return v.([]string)
}
