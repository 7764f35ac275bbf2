package xds

import (
	"math/rand/v2"
	"time"
)

// This file ends a stream at its connection age. Proxies spread over
// replicas added by a scale-out only when their connections end (Istio
// ends them after 30 minutes). gRPC's connection age sends a GOAWAY and
// closes the connection a grace period later, whatever its stream is
// doing at that moment: with thousands of proxies a push always meets
// some of those closes, and the proxies cut off lose the response in
// flight until they have reconnected. Here the stream ends itself, at its
// first quiet moment past its age (no push waiting or being made, every
// response answered), so the proxy reconnects holding what was last
// sent; the connection's GOAWAY must have come before (discovery's app
// sets gRPC's age below this one), so that the proxy opens its next
// stream on a new connection, to any replica.

// DefaultConnectionAgeGrace is how long a stream past its age waits for a
// quiet moment before it ends anyway (a proxy that never answers, pushes
// that never pause): Istio's MaxServerConnectionAgeGrace.
const DefaultConnectionAgeGrace = 10 * time.Second

// retirement is a stream's end at its age.
type retirement struct {
	due    bool          // the age has passed
	done   chan struct{} // closed when the stream is to end
	ended  bool
	timers []*time.Timer
}

// startAge arms the stream's end after about age (±10 %, so streams
// started together do not end together), and at the latest grace later.
func (c *conn) startAge(age, grace time.Duration) {
	d := time.Duration(float64(age) * (0.9 + 0.2*rand.Float64())) //nolint:gosec // jitter, not a secret
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retire.timers = append(c.retire.timers,
		time.AfterFunc(d, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.retire.due = true
			c.retireIfQuiet()
		}),
		time.AfterFunc(d+grace, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.endForAge()
		}))
}

// retireIfQuiet ends a stream past its age when nothing is in flight.
// Called with mu held, whenever that may have become true: at the age,
// after an ACK or NACK, when a push has been made.
func (c *conn) retireIfQuiet() {
	if c.retire.due && !c.pushing && c.pending == nil && c.answered() {
		c.endForAge()
	}
}

// answered reports, with mu held, whether the proxy has answered (ACK or
// NACK) every response the stream sent it.
func (c *conn) answered() bool {
	for _, w := range c.watches {
		if w.started && w.sentNonce != "" && w.ackedNonce != w.sentNonce && (w.nack == nil || w.nack.Nonce != w.sentNonce) {
			return false
		}
	}
	return true
}

// endForAge ends the stream (with mu held; once).
func (c *conn) endForAge() {
	if c.retire.done != nil && !c.retire.ended {
		c.retire.ended = true
		close(c.retire.done)
		c.s.log.Debug("ending a proxy's stream at its connection age", "proxy", c.id, "quiet", c.answered() && !c.pushing && c.pending == nil)
	}
}

func (c *conn) stopAge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.retire.timers {
		t.Stop()
	}
}
