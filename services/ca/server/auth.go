package server

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

// ErrUnauthenticated is the kind of every authentication failure.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrAuthUnavailable means a credential could not be checked now (the apiserver
// did not answer); the caller should retry.
var ErrAuthUnavailable = errors.New("authentication unavailable")

// maxTokenBytes bounds a bearer token.
const maxTokenBytes = 16 << 10

// Authenticator tells who is calling.
type Authenticator interface {
	// Authenticate returns the caller's namespace and service account, or
	// an error wrapping ErrUnauthenticated. It returns ok=false when the
	// call carries no credential of its kind, so that another may try.
	Authenticate(ctx context.Context) (id authority.Identity, ok bool, err error)
}

// Bearer is the token of an "authorization: Bearer <token>" header.
func Bearer(ctx context.Context) (string, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", true, fmt.Errorf("%w: more than one authorization header", ErrUnauthenticated)
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || tok == "" {
		return "", true, fmt.Errorf("%w: authorization is not a bearer token", ErrUnauthenticated)
	}
	if len(tok) > maxTokenBytes {
		return "", true, fmt.Errorf("%w: token of %d bytes, more than %d", ErrUnauthenticated, len(tok), maxTokenBytes)
	}
	return tok, true, nil
}

// ServiceAccountSubject parses "system:serviceaccount:<ns>:<name>".
func ServiceAccountSubject(sub string) (ns, sa string, err error) {
	rest, ok := strings.CutPrefix(sub, "system:serviceaccount:")
	if !ok {
		return "", "", fmt.Errorf("%w: subject %q is not a service account", ErrUnauthenticated, sub)
	}
	ns, sa, ok = strings.Cut(rest, ":")
	if !ok || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return "", "", fmt.Errorf("%w: subject %q is not a service account", ErrUnauthenticated, sub)
	}
	return ns, sa, nil
}

// JWT authenticates service-account-style JWTs locally, against a JWKS
// file, for running without a cluster: issuer, audience, expiry and
// signature are checked, and the subject must be
// system:serviceaccount:<ns>:<sa>.
type JWT struct {
	keys        jose.JSONWebKeySet
	issuer      string
	audience    string
	trustDomain string
	now         func() time.Time
}

// NewJWT reads a JWKS file.
func NewJWT(jwksFile, issuer, audience, trustDomain string, now func() time.Time) (*JWT, error) {
	data, err := os.ReadFile(jwksFile)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	var keys jose.JSONWebKeySet
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, fmt.Errorf("jwks %s: %w", jwksFile, err)
	}
	if len(keys.Keys) == 0 {
		return nil, fmt.Errorf("jwks %s: no keys", jwksFile)
	}
	if issuer == "" || audience == "" {
		return nil, errors.New("jwt: issuer and audience are required")
	}
	return &JWT{keys: keys, issuer: issuer, audience: audience, trustDomain: trustDomain, now: now}, nil
}

var jwtAlgorithms = []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256, jose.RS384, jose.RS512, jose.PS256}

// Authenticate implements Authenticator.
func (j *JWT) Authenticate(ctx context.Context) (authority.Identity, bool, error) {
	raw, present, err := Bearer(ctx)
	if !present || err != nil {
		return authority.Identity{}, present, err
	}
	tok, err := jwt.ParseSigned(raw, jwtAlgorithms)
	if err != nil {
		return authority.Identity{}, true, fmt.Errorf("%w: token: %w", ErrUnauthenticated, err)
	}
	var claims jwt.Claims
	verified := false
	for _, h := range tok.Headers {
		for _, k := range j.keys.Key(h.KeyID) {
			if tok.Claims(k.Key, &claims) == nil {
				verified = true
				break
			}
		}
	}
	if !verified && len(tok.Headers) > 0 && tok.Headers[0].KeyID == "" {
		for _, k := range j.keys.Keys {
			if tok.Claims(k.Key, &claims) == nil {
				verified = true
				break
			}
		}
	}
	if !verified {
		return authority.Identity{}, true, fmt.Errorf("%w: token signature does not verify with any trusted key", ErrUnauthenticated)
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: j.issuer, AnyAudience: jwt.Audience{j.audience}, Time: j.now()}, 30*time.Second); err != nil {
		return authority.Identity{}, true, fmt.Errorf("%w: token: %w", ErrUnauthenticated, err)
	}
	if claims.Expiry == nil {
		return authority.Identity{}, true, fmt.Errorf("%w: token has no expiry", ErrUnauthenticated)
	}
	ns, sa, err := ServiceAccountSubject(claims.Subject)
	if err != nil {
		return authority.Identity{}, true, err
	}
	return authority.Identity{TrustDomain: j.trustDomain, Namespace: ns, ServiceAccount: sa}, true, nil
}

// ClientCert authenticates renewals: a client certificate this CA issued
// (or one of its trust bundle's) that is still valid carries its identity.
type ClientCert struct {
	CA  func() *authority.Authority
	Now func() time.Time
}

// Authenticate implements Authenticator.
func (c ClientCert) Authenticate(ctx context.Context) (authority.Identity, bool, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return authority.Identity{}, false, nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return authority.Identity{}, false, nil
	}
	ca := c.CA()
	if ca == nil {
		return authority.Identity{}, true, fmt.Errorf("%w: no signing authority loaded", ErrUnauthenticated)
	}
	certs := info.State.PeerCertificates
	id, err := ca.Verify(certs[0], slicesOrNil(certs[1:]), c.Now())
	if err != nil {
		return authority.Identity{}, true, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	}
	return id, true, nil
}

func slicesOrNil(c []*x509.Certificate) []*x509.Certificate {
	if len(c) == 0 {
		return nil
	}
	return c
}

// TokenExpiry reads a JWT's exp claim without verifying it: only to
// bound how long a review of the token (the apiserver's, or ca's for
// discovery) is reused. A token without one is not to be cached.
func TokenExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(*claims.Exp, 0), true
}
