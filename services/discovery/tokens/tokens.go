// Package tokens tells discovery who a proxy is that authenticates with a
// service-account token instead of a client certificate, as Istio's agent
// does when Istio injects it: TLS to istiod's port 15012, the pod's token
// (audience istio-ca) as "authorization: Bearer", no certificate
// (pilot/pkg/grpc/tls.go, getTLSDialOption; istiod authenticates it in
// pilot/pkg/xds's authenticate, with the Kubernetes JWT authenticator).
// discovery has no Kubernetes access, so it asks ca (TokenReviewService),
// which authenticates the same tokens for certificates, and remembers the
// answer for as long as ca allows — at most a few minutes, never past
// the token's expiry — in a cache bounded in entries.
package tokens

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
)

// The kinds of failure: a token ca refused, and a check that could not be
// made now (ca unreachable or busy; the proxy should retry).
var (
	ErrRefused     = errors.New("token refused")
	ErrUnavailable = errors.New("token could not be checked now")
)

// MaxTokenBytes bounds a token discovery passes on (ca's own bound).
const MaxTokenBytes = 16 << 10

// DefaultMaxEntries bounds the cache.
const DefaultMaxEntries = 10_000

// Options configures a Reviewer.
type Options struct {
	// Client is ca's TokenReviewService, over a connection with
	// discovery's own client certificate.
	Client cav1.TokenReviewServiceClient
	// Timeout bounds one review (default 5s).
	Timeout time.Duration
	// MaxEntries bounds the cache (default DefaultMaxEntries).
	MaxEntries int
	Now        func() time.Time
}

// Reviewer authenticates tokens with ca. Safe for concurrent use.
type Reviewer struct {
	o Options

	mu    sync.Mutex
	cache map[[32]byte]entry
}

type entry struct {
	id      spiffe.ID
	expires time.Time
}

// New returns a Reviewer.
func New(o Options) *Reviewer {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Reviewer{o: o, cache: map[[32]byte]entry{}}
}

// Authenticate returns the identity token proves, for a proxy at
// peerAddress (its IP: ca spends that address's budget of failures). The
// error wraps ErrRefused or ErrUnavailable. cached says the answer was
// remembered, not asked for.
func (r *Reviewer) Authenticate(ctx context.Context, token, peerAddress string) (id spiffe.ID, cached bool, err error) {
	if token == "" {
		return spiffe.ID{}, false, fmt.Errorf("%w: empty", ErrRefused)
	}
	if len(token) > MaxTokenBytes {
		return spiffe.ID{}, false, fmt.Errorf("%w: %d bytes, more than %d", ErrRefused, len(token), MaxTokenBytes)
	}
	key := sha256.Sum256([]byte(token))
	now := r.o.Now()
	r.mu.Lock()
	e, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.id, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	resp, err := r.o.Client.Review(ctx, &cav1.ReviewRequest{Token: token, PeerAddress: peerAddress})
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			return spiffe.ID{}, false, fmt.Errorf("%w: %s", ErrRefused, status.Convert(err).Message())
		}
		return spiffe.ID{}, false, fmt.Errorf("%w: ca: %w", ErrUnavailable, err)
	}
	id = spiffe.ID{TrustDomain: resp.GetTrustDomain(), Namespace: resp.GetNamespace(), ServiceAccount: resp.GetServiceAccount()}
	if id.TrustDomain == "" || id.Namespace == "" || id.ServiceAccount == "" {
		return spiffe.ID{}, false, fmt.Errorf("%w: ca answered an incomplete identity %q", ErrUnavailable, id)
	}
	if d := time.Duration(resp.GetCacheSeconds()) * time.Second; d > 0 {
		r.remember(key, entry{id: id, expires: now.Add(d)}, now)
	}
	return id, false, nil
}

func (r *Reviewer) remember(key [32]byte, e entry, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= r.o.MaxEntries {
		for k, old := range r.cache {
			if !now.Before(old.expires) {
				delete(r.cache, k)
			}
		}
		if len(r.cache) >= r.o.MaxEntries {
			clear(r.cache) // full of live entries: start over rather than grow
		}
	}
	r.cache[key] = e
}

// Len is the number of remembered answers.
func (r *Reviewer) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cache)
}
