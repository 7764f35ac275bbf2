package xds

// This file tracks the distribution of Istio objects (flotilla wait): for
// each object, the pushes in which its last few versions first appeared;
// for each proxy, the latest push it holds all of (conn.heldPush). The
// Distribution debug type answers from both.

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
)

// Bounds on what the ledger keeps: versions per object, and deleted
// objects (a mesh that creates and deletes objects under new names must
// not grow it for ever). Forgetting a deletion is safe: an object the
// replica does not know counts as deleted.
const (
	maxObjectHistory = 8
	maxDeletedKept   = 4096
)

// ledger is the objects' versions by push. Safe for concurrent use.
type ledger struct {
	mu      sync.Mutex
	objects map[string][]debugapi.ObjectVersion // model.ObjectKey → oldest first
	deleted []string                            // keys deleted, oldest first (some since recreated)
}

// record notes the objects that changed in push.
func (l *ledger) record(push uint64, changes map[string]model.ObjectChange) {
	if len(changes) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.objects == nil {
		l.objects = map[string][]debugapi.ObjectVersion{}
	}
	for key, c := range changes {
		h := append(l.objects[key], debugapi.ObjectVersion{Version: c.Version, Deleted: c.Deleted, Push: push})
		if len(h) > maxObjectHistory {
			h = slices.Delete(h, 0, len(h)-maxObjectHistory)
		}
		l.objects[key] = h
		if c.Deleted {
			l.deleted = append(l.deleted, key)
		}
	}
	for len(l.deleted) > maxDeletedKept {
		key := l.deleted[0]
		l.deleted = l.deleted[1:]
		if h := l.objects[key]; len(h) > 0 && h[len(h)-1].Deleted {
			delete(l.objects, key)
		}
	}
}

// history is an object's versions, oldest first (a copy).
func (l *ledger) history(key string) []debugapi.ObjectVersion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.objects[key])
}

// settle records, when every response the proxy was sent has been
// acknowledged, that it holds the push context it was last served from.
// It is called with mu held, by work's holder, after a push was decided
// and after each acknowledgement.
func (c *conn) settle() {
	if c.pcSeen == nil {
		return
	}
	for _, w := range c.watches {
		if w.started && w.sentNonce != "" && w.ackedNonce != w.sentNonce {
			return
		}
	}
	c.heldPush = c.pcSeen.Seq
}

// distribution answers the Distribution debug type for one object, with
// the proxies scope lets the caller see.
func (s *Server) distribution(names []string, scope string) (*anypb.Any, error) {
	if len(names) != 1 {
		return nil, status.Errorf(codes.InvalidArgument, "%s names one object (Kind/namespace/name), not %d", debugapi.Distribution, len(names))
	}
	key := names[0]
	if parts := strings.SplitN(key, "/", 3); scope != "" && (len(parts) != 3 || parts[1] != scope) {
		// An object's history tells when it changed and to what version:
		// a caller scoped to its namespace sees its namespace's objects
		// only, as it sees only its namespace's proxies.
		return nil, status.Errorf(codes.PermissionDenied, "%s of an object outside namespace %s is not served to a caller of that namespace", debugapi.Distribution, scope)
	}
	d := debugapi.ObjectDistribution{Object: clip.String(key, 300), History: s.ledger.history(key)}
	if pc, _ := s.current(); pc != nil {
		d.Push = pc.Seq
	}
	for _, c := range s.Conns() {
		if scope != "" && c.proxy.Namespace != scope {
			continue
		}
		c.mu.Lock()
		d.Proxies = append(d.Proxies, debugapi.ProxyPush{ID: c.id, Namespace: c.proxy.Namespace, Push: c.heldPush})
		c.mu.Unlock()
	}
	slices.SortFunc(d.Proxies, func(a, b debugapi.ProxyPush) int { return cmp.Compare(a.ID, b.ID) })
	st, err := d.Struct()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	a, err := anypb.New(st)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return a, nil
}
