// Package wasm fetches the Wasm modules that ECDS resources load from a
// remote URL and rewrites the resources to load them from local files, as
// Istio's agent does (istio/pkg/wasm), so Envoy never fetches a module
// itself.
//
// The contract:
//   - A Cache keeps modules in one directory it owns, each in a file named
//     by its sha256 (an OCI image's manifest digest, an HTTP module's
//     content digest, as Istio names them) and written atomically.
//     Modules come from http://, https:// and oci:// URLs; a module whose
//     digest differs from the expected sha256 is refused.
//   - Get honours Istio's pull policies (IfNotPresent; Always, which pulls
//     again when the WasmPlugin's resource version changes; unspecified,
//     which is IfNotPresent except for OCI tags named latest). Concurrent
//     Gets of one URL (with the same expected sha256 and pull secret)
//     share one fetch, which ends when the last of them stops waiting, or
//     at its timeout.
//   - The cache holds at most MaxModules modules and MaxCacheBytes bytes:
//     the least recently used modules no resource refers to are evicted
//     to admit a new one. Run purges modules unused for ModuleExpiry.
//   - No connection is made to a link-local or cloud metadata address
//     (checked on the resolved address, at every dial, redirects and token
//     requests included); plain HTTP to a registry, and unverified TLS, only
//     for the hosts in InsecureRegistries.
//   - Convert rewrites ECDS resources (Istio's
//     MaybeConvertWasmExtensionConfig): remote code to the local file, the
//     control plane's ISTIO_META_ variables stripped, and on a fetch
//     failure the resource replaced by an RBAC filter of the same name that
//     allows (FAIL_OPEN) or denies (otherwise) everything.
//
// A Cache is safe for concurrent use.
package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Defaults, Istio's (pkg/wasm/options.go, MaxWasmBinarySizeBytes) where
// Istio has one.
const (
	DefaultPurgeInterval         = time.Hour
	DefaultModuleExpiry          = 24 * time.Hour
	DefaultHTTPRequestTimeout    = 15 * time.Second
	DefaultHTTPRequestMaxRetries = 5
	DefaultMaxModuleBytes        = 256 << 20
	DefaultMaxCacheBytes         = 1 << 30
	DefaultMaxModules            = 100
	DefaultConvertConcurrency    = 8
	// defaultFetchTimeout bounds a fetch whose http_uri has no timeout, as
	// in Istio's rewriteVMConfig.
	defaultFetchTimeout = 5 * time.Second
)

// ErrCacheFull is returned when a module does not fit in the cache even
// after evicting every module no resource refers to.
var ErrCacheFull = errors.New("the wasm module cache is full")

// Options configures a Cache. Zero fields take the defaults.
type Options struct {
	// Dir holds the modules; it is created if missing (a fetch fails while
	// it cannot be). The cache owns the files named <sha256>.wasm and
	// .tmp-* in it, and removes them at start.
	Dir string
	// InsecureRegistries are hosts (host or host:port; "*" for all) that
	// may be reached over plain HTTP or TLS without verification (Istio's
	// WASM_INSECURE_REGISTRIES).
	InsecureRegistries []string
	// BlockedCIDRs are refused at dial time on top of the link-local and
	// cloud metadata addresses (Istio's BLOCKED_CIDRS_IN_WASM_FETCH).
	BlockedCIDRs []netip.Prefix
	// PurgeInterval is how often Run looks for expired modules;
	// ModuleExpiry is how long a module may go unused.
	PurgeInterval, ModuleExpiry time.Duration
	// HTTPRequestTimeout bounds one HTTP request of an http(s) fetch;
	// HTTPRequestMaxRetries is the number of attempts in all.
	HTTPRequestTimeout    time.Duration
	HTTPRequestMaxRetries int
	// MaxModuleBytes bounds one module (and what is downloaded for it).
	MaxModuleBytes int64
	// MaxCacheBytes and MaxModules bound the cache.
	MaxCacheBytes int64
	MaxModules    int
	// ConvertConcurrency bounds the resources Convert converts at once.
	ConvertConcurrency int
	Log                *slog.Logger
	// IstioMeter records Istio's wasm_* metrics.
	IstioMeter metric.Meter

	// now and retryBackoff are for tests: the clock, and the first pause
	// between HTTP attempts (doubled after each).
	now          func() time.Time
	retryBackoff time.Duration
}

func (o *Options) setDefaults() {
	setDefault := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	setDefault(&o.PurgeInterval, DefaultPurgeInterval)
	setDefault(&o.ModuleExpiry, DefaultModuleExpiry)
	setDefault(&o.HTTPRequestTimeout, DefaultHTTPRequestTimeout)
	setDefault(&o.retryBackoff, 500*time.Millisecond)
	if o.HTTPRequestMaxRetries <= 0 {
		o.HTTPRequestMaxRetries = DefaultHTTPRequestMaxRetries
	}
	if o.MaxModuleBytes <= 0 {
		o.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if o.MaxCacheBytes <= 0 {
		o.MaxCacheBytes = DefaultMaxCacheBytes
	}
	if o.MaxModules <= 0 {
		o.MaxModules = DefaultMaxModules
	}
	if o.ConvertConcurrency <= 0 {
		o.ConvertConcurrency = DefaultConvertConcurrency
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.IstioMeter == nil {
		o.IstioMeter = noop.Meter{}
	}
	if o.now == nil {
		o.now = time.Now
	}
}

// PullPolicy is a WasmPlugin's imagePullPolicy.
type PullPolicy int

// The pull policies, as Istio's PullPolicyValues.
const (
	PullUnspecified PullPolicy = iota
	PullIfNotPresent
	PullAlways
)

// ParsePullPolicy reads ISTIO_META_WASM_IMAGE_PULL_POLICY's value;
// anything else is unspecified.
func ParsePullPolicy(s string) PullPolicy {
	switch s {
	case "IfNotPresent":
		return PullIfNotPresent
	case "Always":
		return PullAlways
	}
	return PullUnspecified
}

// GetOptions are one Get's, from the ECDS resource.
type GetOptions struct {
	// Checksum is the expected sha256 (hex; empty: any).
	Checksum string
	// ResourceName and ResourceVersion identify the WasmPlugin: with
	// PullAlways, a new version pulls the module again.
	ResourceName, ResourceVersion string
	// Timeout bounds the fetch (default 5s).
	Timeout time.Duration
	// PullSecret is a docker config JSON for the registry (nil: anonymous).
	PullSecret []byte
	PullPolicy PullPolicy
}

// Cache is the module cache.
type Cache struct {
	o       Options
	log     *slog.Logger
	metrics *metrics

	httpClient, insecureHTTPClient     *http.Client
	registryTransport, insecureTranspt http.RoundTripper

	mu      sync.Mutex
	modules map[string]*module // by sha256
	bytes   int64              // of modules
	// urls are the sha256 last fetched from a tagged OCI or an HTTP URL, and
	// the resource versions it was fetched for.
	urls map[string]*urlEntry
	// inUse is the module each resource was last given.
	inUse    map[string]string
	inflight map[string]*call
}

type module struct {
	path string
	size int64
	last time.Time
	urls map[string]bool // the urls entries naming it
}

type urlEntry struct {
	sha      string
	versions map[string]string // resource name → version
}

// call is a fetch shared by the Gets of the same URL.
type call struct {
	done    chan struct{}
	path    string
	err     error
	waiters int
	cancel  context.CancelFunc
}

// New returns the cache, with its directory made and emptied of the
// modules of a previous run; Run purges it.
func New(o Options) (*Cache, error) {
	o.setDefaults()
	if o.Dir == "" {
		return nil, errors.New("wasm cache: no directory")
	}
	log := o.Log.With("component", "wasm")
	// A directory that cannot be made now fails the fetches (and each
	// filter falls back by its policy), as in Istio, which makes it only
	// when it stores a module: the agent runs without modules meanwhile.
	if err := os.MkdirAll(o.Dir, 0o755); err != nil { //nolint:gosec // Envoy, another user in some images, reads the modules
		log.Warn("the wasm module directory cannot be made: fetches will fail", "dir", o.Dir, "error", err)
	} else if err := removeOwnFiles(o.Dir); err != nil {
		return nil, fmt.Errorf("wasm cache: %w", err)
	}
	m, err := newMetrics(o.IstioMeter)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		o: o, log: log, metrics: m,
		modules: map[string]*module{}, urls: map[string]*urlEntry{}, inUse: map[string]string{}, inflight: map[string]*call{},
	}
	dial := dialer(o.BlockedCIDRs)
	c.httpClient = c.newHTTPClient(dial, false)
	c.insecureHTTPClient = c.newHTTPClient(dial, true)
	c.registryTransport = c.newRegistryTransport(dial, false)
	c.insecureTranspt = c.newRegistryTransport(dial, true)
	c.metrics.entries.Record(context.Background(), 0)
	return c, nil
}

var ownFile = regexp.MustCompile(`^([0-9a-f]{64}\.wasm|\.tmp-.*)$`)

// removeOwnFiles removes the modules of a previous run, which this one
// does not know.
func removeOwnFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && ownFile.MatchString(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Run purges expired modules every PurgeInterval until ctx ends.
func (c *Cache) Run(ctx context.Context) error {
	t := time.NewTicker(c.o.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.purge()
		}
	}
}

// purge removes the modules unused for ModuleExpiry, referred to or not,
// as Istio's LocalFileCache.purge: a later Get fetches them again.
func (c *Cache) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.o.now()
	for sha, m := range c.modules {
		if now.Sub(m.last) > c.o.ModuleExpiry {
			c.log.Info("wasm module expired", "path", m.path)
			c.removeLocked(sha)
		}
	}
}

// Get returns the path of the module at rawURL, fetching it unless the
// pull policy lets a cached one serve (Istio's LocalFileCache.Get).
func (c *Cache) Get(ctx context.Context, rawURL string, o GetOptions) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("wasm module URL: %w", err)
	}
	switch u.Scheme {
	case "http", "https", "oci":
	default:
		return "", fmt.Errorf("wasm module URL %q: scheme %q is not http, https or oci", rawURL, u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("wasm module URL %q has no host", rawURL)
	}
	want := strings.ToLower(o.Checksum)
	if want == proxycontract.WasmNoDigest { // discovery's (and istiod's) stand-in for no checksum
		want = ""
	}
	if want != "" && !isSHA256(want) {
		return "", fmt.Errorf("wasm module sha256 %q is not a hex SHA-256", o.Checksum)
	}
	if path, ok := c.lookup(rawURL, u, want, o); ok {
		return path, nil
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = defaultFetchTimeout
	}
	secret := sha256.Sum256(o.PullSecret)
	key := strings.Join([]string{rawURL, want, hex.EncodeToString(secret[:])}, "\x00")
	return c.join(ctx, key, timeout, func(ctx context.Context) (string, error) {
		return c.fetch(ctx, rawURL, u, want, o)
	})
}

// lookup is Istio's getEntry: the module the URL names, by the expected
// sha256, the digest in the URL, or the sha256 last fetched from it when
// the pull policy allows.
func (c *Cache) lookup(rawURL string, u *url.URL, want string, o GetOptions) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sha := want
	if sha == "" && u.Scheme == "oci" {
		if d, err := name.NewDigest(u.Host + u.Path); err == nil {
			sha, _ = strings.CutPrefix(d.DigestStr(), "sha256:")
		}
	}
	if sha == "" {
		if e := c.urls[rawURL]; e != nil && (ignoresVersion(o.PullPolicy, u) || e.versions[o.ResourceName] == o.ResourceVersion) {
			sha = e.sha
		}
	}
	m := c.modules[sha]
	c.metrics.lookup(m != nil)
	if m == nil {
		return "", false
	}
	c.useLocked(sha, rawURL, o)
	return m.path, true
}

// ignoresVersion is Istio's shouldIgnoreResourceVersion.
func ignoresVersion(p PullPolicy, u *url.URL) bool {
	switch p {
	case PullAlways:
		return false
	case PullIfNotPresent:
		return true
	}
	return u.Scheme != "oci" || !strings.HasSuffix(u.Path, ":latest")
}

// useLocked records that the resource was given the module sha from
// rawURL.
func (c *Cache) useLocked(sha, rawURL string, o GetOptions) {
	m := c.modules[sha]
	m.last = c.o.now()
	if o.ResourceName != "" {
		c.inUse[o.ResourceName] = sha
	}
	// As Istio's updateChecksum: digest URLs name their module already.
	if strings.HasPrefix(rawURL, "oci://") && strings.Contains(rawURL, "@") {
		return
	}
	e := c.urls[rawURL]
	if e == nil {
		e = &urlEntry{versions: map[string]string{}}
		c.urls[rawURL] = e
	}
	if e.sha != sha && e.sha != "" {
		if old := c.modules[e.sha]; old != nil {
			delete(old.urls, rawURL)
		}
	}
	e.sha = sha
	e.versions[o.ResourceName] = o.ResourceVersion
	m.urls[rawURL] = true
}

// join runs fetch once for the concurrent Gets of key: it ends when the
// last of them stops waiting, or after timeout.
func (c *Cache) join(ctx context.Context, key string, timeout time.Duration, fetch func(context.Context) (string, error)) (string, error) {
	c.mu.Lock()
	cl := c.inflight[key]
	if cl == nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		cl = &call{done: make(chan struct{}), cancel: cancel}
		c.inflight[key] = cl
		go func() {
			defer cancel()
			path, err := fetch(fctx)
			c.mu.Lock()
			if c.inflight[key] == cl {
				delete(c.inflight, key)
			}
			cl.path, cl.err = path, err
			c.mu.Unlock()
			close(cl.done)
		}()
	}
	cl.waiters++
	c.mu.Unlock()
	select {
	case <-cl.done:
		return cl.path, cl.err
	case <-ctx.Done():
		c.mu.Lock()
		if cl.waiters--; cl.waiters == 0 {
			cl.cancel()
			if c.inflight[key] == cl { // a later Get starts anew
				delete(c.inflight, key)
			}
		}
		c.mu.Unlock()
		return "", ctx.Err()
	}
}

// fetch gets the module and stores it (Istio's getOrFetch after the
// lookup).
func (c *Cache) fetch(ctx context.Context, rawURL string, u *url.URL, want string, o GetOptions) (string, error) {
	var (
		data     []byte
		sha      string
		download func() ([]byte, error)
	)
	insecure := c.insecure(u.Host)
	switch u.Scheme {
	case "oci":
		img, digest, err := c.resolveImage(ctx, u, o.PullSecret, insecure)
		if err != nil {
			c.metrics.fetch(resultManifestFailure)
			return "", fmt.Errorf("wasm module %s: %w", rawURL, err)
		}
		sha = digest
		download = func() ([]byte, error) { return c.extractImage(img) }
	default:
		var err error
		if data, err = c.fetchHTTP(ctx, rawURL, insecure); err != nil {
			c.metrics.fetch(resultDownloadFailure)
			return "", fmt.Errorf("wasm module %s: %w", rawURL, err)
		}
		sum := sha256.Sum256(data)
		sha = hex.EncodeToString(sum[:])
	}
	if want != "" && sha != want {
		c.metrics.fetch(resultChecksumMismatch)
		return "", fmt.Errorf("wasm module %s has sha256 %s, want %s", rawURL, sha, want)
	}
	// An image already held under another tag is not downloaded again.
	c.mu.Lock()
	if m := c.modules[sha]; m != nil {
		c.useLocked(sha, rawURL, o)
		c.mu.Unlock()
		return m.path, nil
	}
	c.mu.Unlock()
	if download != nil {
		var err error
		if data, err = download(); err != nil {
			c.metrics.fetch(resultDownloadFailure)
			return "", fmt.Errorf("wasm module %s: %w", rawURL, err)
		}
	}
	if !isWasm(data) {
		c.metrics.fetch(resultFetchFailure)
		return "", fmt.Errorf("wasm module %s is not a Wasm binary", rawURL)
	}
	path, err := c.store(sha, data, rawURL, o)
	if err != nil {
		c.metrics.fetch(resultFetchFailure)
		return "", fmt.Errorf("wasm module %s: %w", rawURL, err)
	}
	c.metrics.fetch(resultSuccess)
	c.log.Info("wasm module fetched", "resource", o.ResourceName, "sha256", sha, "bytes", len(data))
	return path, nil
}

// store writes the module (a temporary file renamed into place) and adds
// it, evicting what it must.
func (c *Cache) store(sha string, data []byte, rawURL string, o GetOptions) (string, error) {
	if int64(len(data)) > c.o.MaxCacheBytes {
		return "", fmt.Errorf("%w: the module's %d bytes exceed its %d", ErrCacheFull, len(data), c.o.MaxCacheBytes)
	}
	tmp, err := writeTemp(c.o.Dir, data)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp) // gone once renamed
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.modules[sha]; m != nil { // a concurrent fetch under another key
		c.useLocked(sha, rawURL, o)
		return m.path, nil
	}
	if err := c.makeRoomLocked(int64(len(data)), o.ResourceName); err != nil {
		return "", err
	}
	path := filepath.Join(c.o.Dir, sha+".wasm")
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("store module: %w", err)
	}
	c.modules[sha] = &module{path: path, size: int64(len(data)), urls: map[string]bool{}}
	c.bytes += int64(len(data))
	c.useLocked(sha, rawURL, o)
	c.metrics.entries.Record(context.Background(), float64(len(c.modules)))
	return path, nil
}

func writeTemp(dir string, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // Envoy reads it
		return "", fmt.Errorf("store module: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("store module: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644) //nolint:gosec // Envoy reads it
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("store module: %w", err)
	}
	return f.Name(), nil
}

// makeRoomLocked evicts the least recently used modules no resource
// refers to (but the one being given a new module) until size more bytes
// and one more module fit.
func (c *Cache) makeRoomLocked(size int64, resource string) error {
	for len(c.modules)+1 > c.o.MaxModules || c.bytes+size > c.o.MaxCacheBytes {
		referred := map[string]bool{}
		for r, sha := range c.inUse {
			if r != resource {
				referred[sha] = true
			}
		}
		victim := ""
		for sha, m := range c.modules {
			if !referred[sha] && (victim == "" || m.last.Before(c.modules[victim].last)) {
				victim = sha
			}
		}
		if victim == "" {
			return fmt.Errorf("%w: %d modules, %d bytes, all in use", ErrCacheFull, len(c.modules), c.bytes)
		}
		c.log.Info("wasm module evicted", "path", c.modules[victim].path)
		c.removeLocked(victim)
	}
	return nil
}

// removeLocked forgets a module and removes its file.
func (c *Cache) removeLocked(sha string) {
	m := c.modules[sha]
	if err := os.Remove(m.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Warn("removing a wasm module", "path", m.path, "error", err)
	}
	for u := range m.urls {
		delete(c.urls, u)
	}
	for r, s := range c.inUse {
		if s == sha {
			delete(c.inUse, r)
		}
	}
	delete(c.modules, sha)
	c.bytes -= m.size
	c.metrics.entries.Record(context.Background(), float64(len(c.modules)))
}

// insecure reports whether host (host:port) is one of InsecureRegistries.
func (c *Cache) insecure(host string) bool {
	hostname := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hostname = h
	}
	for _, r := range c.o.InsecureRegistries {
		if r == "*" || r == host || r == hostname {
			return true
		}
	}
	return false
}

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// isWasm checks the header: the magic number and a version (Istio's
// isValidWasmBinary).
func isWasm(b []byte) bool {
	return len(b) >= 8 && string(b[:4]) == "\x00asm"
}
