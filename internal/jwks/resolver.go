package jwks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Defaults, as istiod's (PILOT_JWT_PUB_KEY_REFRESH_INTERVAL is 20
// minutes; a fetch times out after 5 seconds, JWTRule.timeout's default).
const (
	DefaultRefresh  = 20 * time.Minute
	DefaultTimeout  = 5 * time.Second
	DefaultMaxBytes = 1 << 20
	// maxLocations bounds how many locations are kept (the
	// configuration names them).
	maxLocations = 4096
	// retryFailed is how soon a location whose last fetch failed is tried
	// again, when that is sooner than the refresh interval.
	retryFailed = 30 * time.Second
)

// errPending is the state of a location whose first fetch has not ended.
var errPending = errors.New("keys not fetched yet")

// Options configures a Resolver.
type Options struct {
	Log *slog.Logger
	// Client makes the requests (default: a client without a timeout of
	// its own; each fetch is bounded by Timeout).
	Client *http.Client
	// Refresh is how often known locations are fetched again (default
	// 20 minutes); Timeout bounds one fetch, redirects and an OpenID
	// configuration's key set included (default 5 seconds); MaxBytes
	// bounds one response body (default 1 MiB).
	Refresh, Timeout time.Duration
	MaxBytes         int64
	// OnChange is called when the keys of a location change (first
	// fetched, rotated, or lost): the caller rebuilds what uses them.
	OnChange func()
}

// Resolver fetches and keeps key sets by location. It implements
// model.JWKSSource; Run does the fetching.
type Resolver struct {
	o    Options
	wake chan struct{}

	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	keys string
	err  error
	// fetched is when the last fetch ended (zero: never).
	fetched  time.Time
	inflight bool
	// logged is the last failure logged: a location failing the same way
	// at every retry is logged once.
	logged string
}

// New returns a Resolver.
func New(o Options) *Resolver {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	return &Resolver{o: o, wake: make(chan struct{}, 1), entries: map[string]*entry{}}
}

// Lookup returns what is known of each location, and starts fetching the
// ones not seen before. Each call names every location in use (a push
// context's): locations the previous call named and this one does not
// are forgotten.
func (r *Resolver) Lookup(locations []string) map[string]model.JWKS {
	out := make(map[string]model.JWKS, len(locations))
	fresh := false
	r.mu.Lock()
	inUse := make(map[string]bool, len(locations))
	for _, l := range locations {
		inUse[l] = true
	}
	for l := range r.entries {
		if !inUse[l] {
			delete(r.entries, l)
		}
	}
	for _, l := range locations {
		e := r.entries[l]
		if e == nil {
			if len(r.entries) >= maxLocations {
				out[l] = model.JWKS{Err: fmt.Errorf("more than %d JWKS locations are in use", maxLocations)}
				continue
			}
			e = &entry{err: errPending}
			r.entries[l] = e
			fresh = true
		}
		out[l] = model.JWKS{Keys: e.keys, Err: e.err}
	}
	r.mu.Unlock()
	if fresh {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return out
}

// Run fetches new locations as they are named and every location at the
// refresh interval (sooner after a failure), until ctx ends.
func (r *Resolver) Run(ctx context.Context) error {
	tick := time.NewTicker(min(r.o.Refresh, retryFailed))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		for _, l := range r.due(time.Now()) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.fetchInto(ctx, l)
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-tick.C:
		}
	}
}

// due marks and returns the locations to fetch now: never fetched, due
// for refresh, or failed and due for a retry.
func (r *Resolver) due(now time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for l, e := range r.entries {
		if e.inflight {
			continue
		}
		interval := r.o.Refresh
		if e.err != nil {
			interval = min(interval, retryFailed)
		}
		if e.fetched.IsZero() || now.Sub(e.fetched) >= interval {
			e.inflight = true
			out = append(out, l)
		}
	}
	return out
}

// fetchInto fetches one location and records the result: new keys
// replace the old; a failure keeps keys fetched before (and is logged),
// and is the location's state only if it never had keys.
func (r *Resolver) fetchInto(ctx context.Context, location string) {
	keys, err := r.fetch(ctx, location)
	r.mu.Lock()
	e := r.entries[location]
	if e == nil {
		r.mu.Unlock()
		return
	}
	e.inflight = false
	e.fetched = time.Now()
	changed, kept := false, err != nil && e.keys != ""
	logIt := false
	if err == nil {
		e.logged = ""
	} else if msg := err.Error(); msg != e.logged {
		e.logged, logIt = msg, true
	}
	switch {
	case err == nil:
		changed = keys != e.keys || e.err != nil
		e.keys, e.err = keys, nil
	case e.keys == "":
		changed = e.err == nil || e.err.Error() != err.Error()
		e.err = err
	}
	r.mu.Unlock()
	if logIt {
		r.o.Log.Warn("JWKS fetch failed", "location", location, "error", err, "keeping_previous_keys", kept)
	}
	if changed && r.o.OnChange != nil {
		r.o.OnChange()
	}
}

// fetch gets a key set, through the issuer's OpenID configuration when
// location is one.
func (r *Resolver) fetch(ctx context.Context, location string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	body, err := r.get(ctx, location)
	if err != nil {
		return "", err
	}
	if model.IsOpenIDConfiguration(location) {
		var doc struct {
			JWKSURI string `json:"jwks_uri"`
		}
		if err := json.Unmarshal(body, &doc); err != nil || doc.JWKSURI == "" {
			return "", fmt.Errorf("%s is not an OpenID configuration naming jwks_uri", location)
		}
		if body, err = r.get(ctx, doc.JWKSURI); err != nil {
			return "", err
		}
	}
	return Parse(body)
}

func (r *Resolver) get(ctx context.Context, raw string) ([]byte, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", raw)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, fmt.Errorf("request %s: %w", raw, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, r.o.MaxBytes))
		return nil, fmt.Errorf("fetch %s: HTTP %d", raw, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, r.o.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", raw, err)
	}
	if int64(len(body)) > r.o.MaxBytes {
		return nil, fmt.Errorf("fetch %s: the response is larger than %d bytes", raw, r.o.MaxBytes)
	}
	return body, nil
}
