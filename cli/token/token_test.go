package token_test

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/flotilla-mesh/flotilla/cli/token"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := token.NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestATokenVerifiesAgainstTheJWKSOfTheSameKeyFile(t *testing.T) {
	key := filepath.Join(t.TempDir(), "token.key")
	tok, err := run(t, "create", "--key-file", key, "-n", "istio-system", "--service-account", "flotilla-cli", "--duration", "10m")
	if err != nil {
		t.Fatal(err)
	}
	jwksOut, err := run(t, "jwks", "--key-file", key)
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal([]byte(jwksOut), &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("jwks %q: %v", jwksOut, err)
	}
	parsed, err := jwt.ParseSigned(strings.TrimSpace(tok), []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	var claims jwt.Claims
	if err := parsed.Claims(set.Keys[0].Key, &claims); err != nil {
		t.Fatalf("the token does not verify against the key file's JWKS: %v", err)
	}
	if err := claims.Validate(jwt.Expected{Issuer: token.DefaultIssuer, Subject: "system:serviceaccount:istio-system:flotilla-cli", AnyAudience: jwt.Audience{"istio-ca"}, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if d := claims.Expiry.Time().Sub(claims.IssuedAt.Time()); d != 10*time.Minute {
		t.Fatalf("lifetime %s", d)
	}
}

func TestATokenNeedsAnAccountAKeyFileAndASaneLifetime(t *testing.T) {
	key := filepath.Join(t.TempDir(), "token.key")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no key file":     {[]string{"create", "-n", "a", "--service-account", "b"}, `"key-file" not set`},
		"no account":      {[]string{"create", "--key-file", key, "-n", "a"}, "--namespace and --service-account"},
		"a year":          {[]string{"create", "--key-file", key, "-n", "a", "--service-account", "b", "--duration", "8760h"}, "at most 168h0m0s"},
		"a garbage key":   {[]string{"jwks", "--key-file", "token_test.go"}, "devjwt"},
		"a negative life": {[]string{"create", "--key-file", key, "-n", "a", "--service-account", "b", "--duration", "-1s"}, "want more than 0"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
