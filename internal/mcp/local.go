package mcp

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// Local hands what a publisher publishes straight to a Handler in the same
// process, as a Client would after receiving it from a Server: the same
// collections, the same content-hash versions, nothing handed on twice.
// discovery uses it to serve a directory of YAML through galley's own file
// source and publisher, so that the same directory yields the same
// resources with or without galley in between.
//
// Update has Server.Update's contract, and the handler's error is returned
// from it (a subscriber would NACK). Complete marks the end of the first
// full read: every collection not yet handed on is handed on empty, as a
// Client receives every collection it subscribed to once.
type Local struct {
	h Handler

	mu     sync.Mutex
	hashes map[string]map[string]string // type URL → name → content hash
}

// NewLocal returns a Local serving typeURLs to h.
func NewLocal(h Handler, typeURLs []string) *Local {
	l := &Local{h: h, hashes: map[string]map[string]string{}}
	for _, t := range typeURLs {
		l.hashes[t] = nil // known, not yet handed on
	}
	return l
}

// Update hands the changed resources of one collection to the handler;
// resources whose content is unchanged and deletions of unknown names are
// left out, and nothing is handed on when nothing is left. It returns how
// many resources changed.
func (l *Local) Update(typeURL string, upserts []*Resource, deletes []string) (int, error) {
	return l.UpdateContext(context.Background(), typeURL, upserts, deletes)
}

// UpdateContext is Update within a change's span (ctx's), which the
// changed resources carry to the handler (Resource.Trace), as a Client's
// would.
func (l *Local) UpdateContext(ctx context.Context, typeURL string, upserts []*Resource, deletes []string) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, ok := l.hashes[typeURL]
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownType, typeURL)
	}
	first := held == nil
	if first {
		held = map[string]string{}
		l.hashes[typeURL] = held
	}
	var changed []*Resource
	for _, r := range upserts {
		enc, err := marshal(r.toProto())
		if err != nil {
			return 0, fmt.Errorf("encode %s %s: %w", typeURL, r.Name, err)
		}
		h := contentHash(enc)
		if held[r.Name] == h {
			continue
		}
		held[r.Name] = h
		c := *r
		c.Version, c.Trace = h, trace.SpanContextFromContext(ctx)
		changed = append(changed, &c)
	}
	var removed []string
	for _, name := range deletes {
		if _, ok := held[name]; ok {
			delete(held, name)
			removed = append(removed, name)
		}
	}
	if len(changed) == 0 && len(removed) == 0 && !first {
		return 0, nil
	}
	slices.Sort(removed)
	if err := l.h.Apply(typeURL, changed, removed); err != nil {
		return 0, fmt.Errorf("apply %s: %w", typeURL, err)
	}
	return len(changed) + len(removed), nil
}

// Complete hands every collection that has not been handed on yet to the
// handler, empty.
func (l *Local) Complete() error {
	l.mu.Lock()
	var pending []string
	for t, held := range l.hashes {
		if held == nil {
			pending = append(pending, t)
		}
	}
	l.mu.Unlock()
	slices.Sort(pending)
	for _, t := range pending {
		if _, err := l.Update(t, nil, nil); err != nil {
			return err
		}
	}
	return nil
}
