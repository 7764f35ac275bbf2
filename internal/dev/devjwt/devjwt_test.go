package devjwt_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
)

// A token verifies with the issuer's JWKS (as ca verifies it) and names
// the service account, the issuer, the audience and the lifetime asked for.
func TestTokensVerifyWithTheJWKS(t *testing.T) {
	iss, err := devjwt.New("https://flotilla.local/devrun")
	if err != nil {
		t.Fatal(err)
	}
	data, err := iss.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 || !set.Keys[0].IsPublic() || set.Keys[0].Algorithm != "ES256" {
		t.Fatalf("JWKS %s: want one public ES256 key", data)
	}
	now := time.Now()
	raw, err := iss.Token("istio-system", "flotilla-galley", "istio-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	keys := set.Key(tok.Headers[0].KeyID)
	if len(keys) != 1 {
		t.Fatalf("the token's kid %q is not in the JWKS", tok.Headers[0].KeyID)
	}
	var c jwt.Claims
	if err := tok.Claims(keys[0].Key, &c); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if err := c.Validate(jwt.Expected{Issuer: "https://flotilla.local/devrun", AnyAudience: jwt.Audience{"istio-ca"}, Time: now.Add(59 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if c.Subject != "system:serviceaccount:istio-system:flotilla-galley" {
		t.Fatalf("subject %q", c.Subject)
	}
	if err := c.Validate(jwt.Expected{Time: now.Add(61 * time.Minute)}); err == nil {
		t.Fatal("the token is valid past its lifetime")
	}

	// Another issuer's key does not verify it.
	other, err := devjwt.New("other")
	if err != nil {
		t.Fatal(err)
	}
	otherSet, _ := other.JWKS()
	var otherKeys jose.JSONWebKeySet
	if err := json.Unmarshal(otherSet, &otherKeys); err != nil {
		t.Fatal(err)
	}
	if err := tok.Claims(otherKeys.Keys[0].Key, &c); err == nil {
		t.Fatal("another issuer's key verified the token")
	}
}

func TestBadRequestsAreRefused(t *testing.T) {
	if _, err := devjwt.New(""); err == nil {
		t.Error("an issuer without a name")
	}
	iss, err := devjwt.New("x")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns, sa, aud string
		ttl         time.Duration
	}{
		{"", "sa", "aud", time.Hour},
		{"ns", "", "aud", time.Hour},
		{"ns", "sa", "", time.Hour},
		{"ns", "sa", "aud", 0},
		{"ns", "sa", "aud", -time.Second},
	} {
		if _, err := iss.Token(c.ns, c.sa, c.aud, time.Now(), c.ttl); err == nil || !strings.Contains(err.Error(), "needs") {
			t.Errorf("Token(%q, %q, %q, %s): %v", c.ns, c.sa, c.aud, c.ttl, err)
		}
	}
}
