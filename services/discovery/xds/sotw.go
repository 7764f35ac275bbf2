package xds

// This file is the state-of-the-world protocol of a stream (conn.go holds
// what it shares with delta.go): requests, which subscribe anew to every
// name of a type, ACK or NACK a response by its nonce, or resume a
// version held from another stream; and responses, which hold every
// resource the proxy watches of a type (a load assignment push: the
// changed ones), versioned by the sum of what the proxy then holds.

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// onSotwRequest handles a state-of-the-world request: an ACK, a NACK, or
// a (changed) subscription, which is answered.
func (c *conn) onSotwRequest(ctx context.Context, req *sotwRequest) error {
	if err := checkNames(req.GetResourceNames()); err != nil {
		return err
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
	news := false
	if nonce := req.GetResponseNonce(); nonce != "" {
		if nonce != w.sentNonce {
			c.s.metrics.staleNonce(t)
			c.nothingNew(ctx)
			return nil // stale: answered by a later response already
		}
		if req.GetErrorDetail() != nil {
			if !c.nacked(t, w, req.GetVersionInfo(), nonce, req.GetErrorDetail().GetMessage()) {
				c.nothingNew(ctx)
			}
			return nil
		}
		news = c.acked(t, w, req.GetVersionInfo(), nonce)
	}
	names := req.GetResourceNames()
	wildcard := !req.asSubscribed && wildcardType(t) && (len(names) == 0 || slices.Contains(names, "*"))
	set := w.names
	if !req.asSubscribed && !set.sameAs(names) {
		set = makeNameSet(names)
	}
	changed := !w.started || wildcard != w.wildcard || set != w.names
	if !changed {
		if !news {
			c.nothingNew(ctx)
		}
		return nil
	}
	// A proxy's first request on a new stream that names the version it
	// holds (Envoy's after a reconnect, to this replica or another: the
	// versions are content hashes, the same on every replica) is answered
	// only when what it would get differs from that.
	resumed := !w.started && req.GetResponseNonce() == "" && req.GetVersionInfo() != ""
	c.mu.Lock()
	w.started, w.wildcard, w.names = true, wildcard, set
	if resumed {
		w.sentVersion, w.ackedVersion, w.ackedAt, w.resumed = req.GetVersionInfo(), req.GetVersionInfo(), time.Now(), true
	}
	c.mu.Unlock()
	if err := c.checkSubscribed(); err != nil {
		return err
	}
	return c.answer(t, w, !resumed)
}

// subscribed is what the stream is subscribed to of a type, for the
// codec to recognise a request that names it again (sotwRequest).
func (c *conn) subscribed(typeURL string) nameSet {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.watches[typeURL]; w != nil {
		return w.names
	}
	return nameSet{}
}

// respondSotw sends a type's resources as a state-of-the-world response
// (respond).
func (c *conn) respondSotw(t string, w *watch, gen *translate.Generator, seen time.Time, only []string, force bool, start time.Time) error {
	var res []*named
	if only != nil {
		c.s.offload(func() { res = c.generate(t, gen, only) })
		if !force && sameAsHeld(res, only, w.held) {
			return nil
		}
		if wildcardType(t) {
			// Every response of a state-of-the-world cluster (listener)
			// type holds all of them: one changed, all go.
			res, only = nil, nil
		}
	}
	if only == nil {
		c.s.offload(func() { res = c.generate(t, gen, w.watchedNames()) })
	}
	// What the proxy holds after this response; its version is the
	// response's (the sum of entrySum over what it holds). An
	// endpoint-only push sends, of the types whose responses need not hold
	// everything (load assignments), the changed resources only, as
	// Istio's incremental EDS does; the version is updated by what
	// changed.
	var send []*named
	var removed []string
	sum := w.heldSum
	if only != nil {
		built := make(map[string]bool, len(res))
		for _, r := range res {
			built[r.name] = true
			old, ok := w.held.version(r.name)
			if ok && old == r.version {
				continue
			}
			if ok {
				sum -= entrySum(r.name, old)
			}
			sum += entrySum(r.name, r.version)
			send = append(send, r)
		}
		for _, n := range only {
			if v, ok := w.held.version(n); ok && !built[n] {
				sum -= entrySum(n, v)
				removed = append(removed, n)
			}
		}
	} else {
		send, sum = res, versionSum(res)
	}
	version := formatSum(sum)
	if !force && version == w.sentVersion {
		if w.resumed {
			// It holds this already (a resumed stream): it holds what
			// was built, as if this replica had sent it and it had
			// ACKed it, and so the push it was served from.
			c.mu.Lock()
			w.held, w.heldSum, w.resumed = c.s.held.intern(heldOf(res)), sum, false
			w.sentCount, w.sentAt = len(res), time.Now()
			c.settle()
			c.mu.Unlock()
		}
		return nil // the proxy has (or rejected) exactly this
	}
	nonce := c.s.nextNonce()
	took, err := c.send(t, func() error {
		return c.sendSotw(&sotwResponse{head: &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: t, Nonce: nonce}, resources: send})
	})
	if err != nil {
		return err
	}
	held := heldOf(res)
	if only != nil {
		held = w.held.update(versions(send), removed)
	}
	c.mu.Lock()
	w.resumed, w.heldSum = false, sum
	c.sent(w, version, nonce, c.s.held.intern(held), seen)
	c.mu.Unlock()
	c.s.metrics.sent(t, len(send), wireSize(send, false), time.Since(start), took)
	return nil
}

// A state-of-the-world version (what respondSotw sends as version_info)
// is the sum of a hash of each resource held, name and version: it does
// not depend on order, and a response that changes a few resources
// updates it by those few (entrySum), however many the proxy holds.
func entrySum(name, version string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(version))
	return h.Sum64()
}

func formatSum(sum uint64) string { return strconv.FormatUint(sum, 36) }

// versionSum is the sum of entrySum over res.
func versionSum(res []*named) uint64 {
	var sum uint64
	for _, r := range res {
		sum += entrySum(r.name, r.version)
	}
	return sum
}

// sotwVersion is the state-of-the-world version of holding res.
func sotwVersion(res []*named) string { return formatSum(versionSum(res)) }
