package jwks

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

// rsaKey is a usable RSA public key (a 2048-bit modulus) with kid.
func rsaKey(kid string) string {
	return `{"kty":"RSA","kid":"` + kid + `","e":"AQAB","n":"` + strings.Repeat("x8E9n9bfsCVWNnBCjFGrj6oT5NH", 13) + `"}`
}

// issuer is an HTTP server on loopback serving a key set (changeable),
// an OpenID configuration pointing at it, and misbehaving paths.
type issuer struct {
	*httptest.Server
	mu    sync.Mutex
	keys  string
	fails atomic.Bool
	hits  atomic.Int64
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	is := &issuer{keys: `{"keys":[` + rsaKey("one") + `]}`}
	mux := http.NewServeMux()
	mux.HandleFunc("/keys", func(w http.ResponseWriter, _ *http.Request) {
		is.hits.Add(1)
		if is.fails.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		is.mu.Lock()
		defer is.mu.Unlock()
		_, _ = w.Write([]byte(is.keys))
	})
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"issuer":%q,"jwks_uri":%q}`, is.URL, is.URL+"/keys")
	})
	mux.HandleFunc("/huge", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"keys":[` + rsaKey("a") + `],"pad":"` + strings.Repeat("x", 2<<20) + `"}`))
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	})
	mux.HandleFunc("/garbage", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>not json")) })
	mux.HandleFunc("/no-usable-key", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"keys":[{"kty":"RSA","n":"AAAA","e":"AQAB"}]}`))
	})
	is.Server = httptest.NewServer(mux)
	t.Cleanup(is.Close)
	return is
}

func (is *issuer) rotate(keys string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys = keys
}

// running starts a resolver; changes counts its OnChange calls.
func running(t *testing.T, o Options) (*Resolver, *atomic.Int64) {
	t.Helper()
	var changes atomic.Int64
	o.OnChange = func() { changes.Add(1) }
	r := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r, &changes
}

func settled(t *testing.T, r *Resolver, loc string) model.JWKS {
	t.Helper()
	var got model.JWKS
	xdstest.Eventually(t, "the first fetch of "+loc+" ends", func() bool {
		got = r.Lookup([]string{loc})[loc]
		return got.Err == nil || !strings.Contains(got.Err.Error(), errPending.Error())
	})
	return got
}

func TestKeysAreFetchedWhenFirstNamedAndTheChangeIsAnnounced(t *testing.T) {
	is := newIssuer(t)
	r, changes := running(t, Options{})
	first := r.Lookup([]string{is.URL + "/keys"})[is.URL+"/keys"]
	if first.Err == nil {
		t.Fatal("keys before any fetch")
	}
	got := settled(t, r, is.URL+"/keys")
	if got.Err != nil || !strings.Contains(got.Keys, `"kid":"one"`) {
		t.Fatalf("keys: %+v", got)
	}
	if changes.Load() != 1 {
		t.Fatalf("%d change announcements, want 1", changes.Load())
	}
}

func TestAnIssuersOpenIDConfigurationLeadsToItsKeys(t *testing.T) {
	is := newIssuer(t)
	r, _ := running(t, Options{})
	loc := model.JWKSLocation(&security.JWTRule{Issuer: is.URL})
	if got := settled(t, r, loc); got.Err != nil || !strings.Contains(got.Keys, `"kid":"one"`) {
		t.Fatalf("keys through %s: %+v", loc, got)
	}
}

func TestRotatedKeysReplaceTheOldAndAFailedRefreshKeepsThem(t *testing.T) {
	is := newIssuer(t)
	r, changes := running(t, Options{Refresh: 50 * time.Millisecond})
	loc := is.URL + "/keys"
	settled(t, r, loc)
	is.rotate(`{"keys":[` + rsaKey("two") + `]}`)
	xdstest.Eventually(t, "the rotated key", func() bool {
		return strings.Contains(r.Lookup([]string{loc})[loc].Keys, `"kid":"two"`)
	})
	before := changes.Load()
	is.fails.Store(true)
	hits := is.hits.Load()
	xdstest.Eventually(t, "failed refreshes", func() bool { return is.hits.Load() > hits+2 })
	if got := r.Lookup([]string{loc})[loc]; got.Err != nil || !strings.Contains(got.Keys, `"kid":"two"`) {
		t.Fatalf("after failed refreshes: %+v", got)
	}
	if changes.Load() != before {
		t.Fatal("a failed refresh announced a change")
	}
}

func TestHostileIssuersGiveAnErrorAndNoKeys(t *testing.T) {
	is := newIssuer(t)
	r, _ := running(t, Options{Timeout: 500 * time.Millisecond, MaxBytes: 1 << 20})
	for path, want := range map[string]string{
		"/huge":                 "larger than 1048576 bytes",
		"/slow":                 "context deadline exceeded",
		"/garbage":              "not a JSON Web Key Set",
		"/no-usable-key":        "n is too short",
		"/missing":              "HTTP 404",
		"/keys-not-an-oidc-doc": "HTTP 404",
	} {
		got := settled(t, r, is.URL+path)
		if got.Err == nil || !strings.Contains(got.Err.Error(), want) || got.Keys != "" {
			t.Errorf("%s: %+v, want an error with %q", path, got, want)
		}
	}
	for _, loc := range []string{"file:///etc/passwd", "ftp://example.com/keys", "not a url"} {
		if got := settled(t, r, loc); got.Err == nil || !strings.Contains(got.Err.Error(), "not an http(s) URL") {
			t.Errorf("%s: %+v", loc, got)
		}
	}
}

func TestLocationsTheLatestLookupDoesNotNameAreForgotten(t *testing.T) {
	r := New(Options{})
	r.Lookup([]string{"https://a.example/keys", "https://b.example/keys"})
	r.Lookup([]string{"https://b.example/keys"})
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) != 1 || r.entries["https://b.example/keys"] == nil {
		t.Fatalf("entries after the second lookup: %v", r.entries)
	}
}

func TestParseKeepsOnlyKeysEnvoyCanUse(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{`{"keys":[` + rsaKey("a") + `]}`, `"kid":"a"`, ""},
		{`{"keys":[{"kty":"EC","crv":"P-256","x":"TtS_bPIeQidctIa95USvElsk3p55WhdmVyJb9QeT5Hk","y":"TtS_bPIeQidctIa95USvElsk3p55WhdmVyJb9QeT5Hk"},{"kty":"EC","crv":"P-192","x":"AA","y":"AA"}]}`, `"crv":"P-256"`, ""},
		{`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`, `"Ed25519"`, ""},
		{`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`, `"oct"`, ""},
		{`{"keys":[]}`, "", "the key set is empty"},
		{`{"keys":[{"kty":"RSA","n":"` + strings.Repeat("A", 200) + `","e":"AQ"}]}`, "", "e is not a usable RSA exponent"},
		{`{"keys":[{"kty":"RSA","n":"!!","e":"AQAB"}]}`, "", "n is not base64url"},
		{`[1,2]`, "", "not a JSON Web Key Set"},
		{`{"keys":[17]}`, "", "key 0"},
	} {
		got, err := Parse([]byte(tc.in))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %q, %v; want error %q", tc.in, got, err, tc.err)
		case tc.err == "" && (err != nil || !strings.Contains(got, tc.want)):
			t.Errorf("%s: %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParse: any input gives an error or a key set that parses again to
// itself (what proxies get is stable and well formed).
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"keys":[` + rsaKey("a") + `]}`))
	f.Add([]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"},{"kty":"EC"}]}`))
	f.Add([]byte(`{"keys":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Parse(in)
		if err != nil {
			return
		}
		again, err := Parse([]byte(out))
		if err != nil || again != out {
			t.Fatalf("%q parsed to %q, which parses to %q, %v", in, out, again, err)
		}
	})
}

func TestAnIssuerFailingTheSameWayIsLoggedOnce(t *testing.T) {
	is := newIssuer(t)
	is.fails.Store(true)
	var logs testenv.SyncBuffer
	r, _ := running(t, Options{Refresh: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	r.Lookup([]string{is.URL + "/keys"})
	xdstest.Eventually(t, "ten failed fetches", func() bool {
		r.Lookup([]string{is.URL + "/keys"})
		return is.hits.Load() >= 10
	})
	if n := strings.Count(logs.String(), "JWKS fetch failed"); n != 1 {
		t.Fatalf("%d log lines for one failure repeated %d times", n, is.hits.Load())
	}
	is.fails.Store(false)
	xdstest.Eventually(t, "the keys once the issuer is back", func() bool {
		return r.Lookup([]string{is.URL + "/keys"})[is.URL+"/keys"].Err == nil
	})
}
