// Package kube is ca's cluster mode: service account tokens checked with
// the apiserver's TokenReview, signing material in Secrets, and the root
// certificate published to every namespace.
package kube

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
	"github.com/flotilla-mesh/flotilla/services/ca/server"
)

// Cache bounds.
const (
	maxCached = 10_000
	maxAge    = 5 * time.Minute
)

// TokenReview authenticates Kubernetes service account tokens with the
// apiserver, for an audience (istio-ca). Successful reviews are cached,
// bounded in number and never past the token's own expiry.
type TokenReview struct {
	client   kubernetes.Interface
	keys     *issuerKeys
	audience string
	now      func() time.Time
	lookups  metric.Int64Counter

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	id      authority.Identity
	expires time.Time
}

// NewTokenReview returns the authenticator.
func NewTokenReview(client kubernetes.Interface, audience string, meter metric.Meter, now func() time.Time) (*TokenReview, error) {
	c, err := meter.Int64Counter("flotilla.ca.token_reviews",
		metric.WithDescription("Token authentications, by result: cache_hit, reviewed, refused or throttled (not reviewed: the address failed too often, and the apiserver's keys do not verify the token) (hit rate = cache_hit / all)."))
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	return &TokenReview{
		client: client, keys: &issuerKeys{client: client.Discovery().RESTClient()}, audience: audience, now: now, lookups: c,
		cache: map[[32]byte]cached{},
	}, nil
}

// Authenticate implements server.Authenticator.
func (r *TokenReview) Authenticate(ctx context.Context) (authority.Identity, bool, error) {
	tok, present, err := server.Bearer(ctx)
	if !present || err != nil {
		return authority.Identity{}, present, err
	}
	key := sha256.Sum256([]byte(tok))
	now := r.now()
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(c.expires) {
		r.count(ctx, "cache_hit")
		return c.id, true, nil
	}
	// From an address that has failed too often, only a token the
	// apiserver signed (checked here, against its published keys) is
	// reviewed: what is forged there costs the apiserver nothing, and a
	// genuine token is never refused for its neighbours' failures.
	if server.Throttled(ctx) && !r.keys.signed(ctx, tok, r.audience, now) {
		r.count(ctx, "throttled")
		return authority.Identity{}, true, server.ErrThrottled
	}
	review, err := r.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tok, Audiences: []string{r.audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return authority.Identity{}, true, fmt.Errorf("%w: token review: %w", server.ErrAuthUnavailable, err)
	}
	st := review.Status
	if !st.Authenticated {
		r.count(ctx, "refused")
		reason := st.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return authority.Identity{}, true, fmt.Errorf("%w: token: %s", server.ErrUnauthenticated, reason)
	}
	if !slices.Contains(st.Audiences, r.audience) {
		r.count(ctx, "refused")
		return authority.Identity{}, true, fmt.Errorf("%w: token is not for audience %q", server.ErrUnauthenticated, r.audience)
	}
	ns, sa, err := server.ServiceAccountSubject(st.User.Username)
	if err != nil {
		r.count(ctx, "refused")
		return authority.Identity{}, true, err
	}
	id := authority.Identity{Namespace: ns, ServiceAccount: sa}
	r.count(ctx, "reviewed")
	if exp, ok := server.TokenExpiry(tok); ok {
		if limit := now.Add(maxAge); limit.Before(exp) {
			exp = limit
		}
		r.remember(key, id, exp, now)
	}
	return id, true, nil
}

func (r *TokenReview) count(ctx context.Context, result string) {
	r.lookups.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
}

func (r *TokenReview) remember(key [32]byte, id authority.Identity, expires, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= maxCached {
		for k, c := range r.cache {
			if !now.Before(c.expires) {
				delete(r.cache, k)
			}
		}
		if len(r.cache) >= maxCached {
			r.cache = map[[32]byte]cached{} // still full of live entries: start over rather than grow
		}
	}
	r.cache[key] = cached{id: id, expires: expires}
}
