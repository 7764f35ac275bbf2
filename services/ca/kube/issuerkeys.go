package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/client-go/rest"
)

// jwksPath is where the apiserver publishes the public keys it signs
// service account tokens with (service account issuer discovery).
const jwksPath = "/openid/v1/jwks"

// keysRefresh bounds how often the keys are fetched again for a token
// that names a key not held (the apiserver's keys rotated).
const keysRefresh = 30 * time.Second

// tokenAlgorithms are the algorithms the apiserver signs tokens with.
var tokenAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512, jose.PS256}

// issuerKeys tells, without asking the apiserver to review it, whether a
// token was signed by the apiserver and is still good for an audience:
// what a forged or garbage token never is. It lets a caller at an address
// that has failed too often (server.Throttled) still have its genuine
// token reviewed, while what its neighbours forge costs the apiserver
// nothing.
type issuerKeys struct {
	client rest.Interface

	mu      sync.Mutex
	keys    jose.JSONWebKeySet
	fetched time.Time
}

// signed reports whether tok is a JWT signed with one of the apiserver's
// keys, unexpired at now, for audience.
func (k *issuerKeys) signed(ctx context.Context, tok, audience string, now time.Time) bool {
	parsed, err := jwt.ParseSigned(tok, tokenAlgorithms)
	if err != nil || len(parsed.Headers) != 1 {
		return false
	}
	kid := parsed.Headers[0].KeyID
	key, ok := k.key(ctx, kid, now)
	if !ok {
		return false
	}
	var claims jwt.Claims
	if err := parsed.Claims(key.Key, &claims); err != nil {
		return false
	}
	return claims.ValidateWithLeeway(jwt.Expected{Time: now}, time.Minute) == nil && slices.Contains(claims.Audience, audience)
}

// key is the apiserver's key kid, fetched (at most once per keysRefresh)
// when not held.
func (k *issuerKeys) key(ctx context.Context, kid string, now time.Time) (jose.JSONWebKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ks := k.keys.Key(kid); len(ks) == 1 {
		return ks[0], true
	}
	if !k.fetched.IsZero() && now.Sub(k.fetched) < keysRefresh {
		return jose.JSONWebKey{}, false
	}
	k.fetched = now
	if err := k.fetch(ctx); err != nil {
		return jose.JSONWebKey{}, false
	}
	if ks := k.keys.Key(kid); len(ks) == 1 {
		return ks[0], true
	}
	return jose.JSONWebKey{}, false
}

func (k *issuerKeys) fetch(ctx context.Context) error {
	raw, err := k.client.Get().AbsPath(jwksPath).Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("service account issuer keys: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		return fmt.Errorf("service account issuer keys: %w", err)
	}
	k.keys = set
	return nil
}
