package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newCache(tb testing.TB, edit func(*Options)) *Cache {
	tb.Helper()
	o := Options{Dir: tb.TempDir(), retryBackoff: time.Millisecond}
	if edit != nil {
		edit(&o)
	}
	c, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// moduleServer serves modules by path and counts the requests.
type moduleServer struct {
	*httptest.Server
	requests atomic.Int64
	mu       sync.Mutex
	bodies   map[string][]byte
	// status, when set, answers instead of the module.
	status func(n int64) int
}

func newModuleServer(t *testing.T) *moduleServer {
	t.Helper()
	s := &moduleServer{bodies: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.requests.Add(1)
		if s.status != nil {
			if code := s.status(n); code != http.StatusOK {
				w.WriteHeader(code)
				return
			}
		}
		s.mu.Lock()
		body, ok := s.bodies[r.URL.Path]
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *moduleServer) serve(path string, body []byte) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bodies[path] = body
	return s.URL + path
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func ctxOf(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAModuleFetchedOverHTTPIsStoredUnderItsSha256(t *testing.T) {
	srv := newModuleServer(t)
	module := wasmModule(t, 100)
	u := srv.serve("/m.wasm", module)
	c := newCache(t, nil)
	path, err := c.Get(ctxOf(t), u, GetOptions{Checksum: strings.ToUpper(sha(module))})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != sha(module)+".wasm" || filepath.Dir(path) != c.o.Dir {
		t.Fatalf("stored at %s", path)
	}
	if !bytes.Equal(mustRead(t, path), module) {
		t.Fatal("the file is not the module")
	}
	// No temporary file is left behind.
	entries, _ := os.ReadDir(c.o.Dir)
	if len(entries) != 1 {
		t.Fatalf("the directory holds %d files", len(entries))
	}
}

func TestAModuleWhoseDigestDiffersIsRefused(t *testing.T) {
	srv := newModuleServer(t)
	u := srv.serve("/m.wasm", wasmModule(t, 10))
	c := newCache(t, nil)
	_, err := c.Get(ctxOf(t), u, GetOptions{Checksum: sha([]byte("something else"))})
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("got %v, want a sha256 mismatch", err)
	}
	if len(c.modules) != 0 {
		t.Fatal("the module was kept")
	}
}

func TestABodyThatIsNotWasmIsRefused(t *testing.T) {
	srv := newModuleServer(t)
	u := srv.serve("/m.wasm", []byte("<html>login</html>"))
	if _, err := newCache(t, nil).Get(ctxOf(t), u, GetOptions{}); err == nil || !strings.Contains(err.Error(), "not a Wasm binary") {
		t.Fatalf("got %v", err)
	}
}

func TestAnOversizedModuleIsRefusedWithoutRetrying(t *testing.T) {
	srv := newModuleServer(t)
	u := srv.serve("/m.wasm", wasmModule(t, 2000))
	c := newCache(t, func(o *Options) { o.MaxModuleBytes = 1000 })
	_, err := c.Get(ctxOf(t), u, GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("got %v, want the size limit", err)
	}
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func TestServerErrorsAreRetriedABoundedNumberOfTimes(t *testing.T) {
	srv := newModuleServer(t)
	module := wasmModule(t, 10)
	u := srv.serve("/m.wasm", module)
	srv.status = func(int64) int { return http.StatusServiceUnavailable }
	c := newCache(t, func(o *Options) { o.HTTPRequestMaxRetries = 3 })
	if _, err := c.Get(ctxOf(t), u, GetOptions{}); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("got %v", err)
	}
	if n := srv.requests.Load(); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
	// Two failures, then the module.
	srv.requests.Store(0)
	srv.status = func(n int64) int {
		if n <= 2 {
			return http.StatusBadGateway
		}
		return http.StatusOK
	}
	path, err := c.Get(ctxOf(t), u, GetOptions{})
	if err != nil || !bytes.Equal(mustRead(t, path), module) {
		t.Fatalf("after retries: %v", err)
	}
	// A client error is final.
	srv.requests.Store(0)
	srv.status = func(int64) int { return http.StatusForbidden }
	if _, err := c.Get(ctxOf(t), srv.URL+"/other.wasm", GetOptions{}); err == nil || srv.requests.Load() != 1 {
		t.Fatalf("403: %v after %d requests", err, srv.requests.Load())
	}
}

func TestAModuleInATarGzIsUnpacked(t *testing.T) {
	srv := newModuleServer(t)
	module := wasmModule(t, 50)
	u := srv.serve("/m.tar.gz", tarGz(t, tarFile{"plugin.wasm", module}, tarFile{"README", []byte("hi")}))
	// The sha256 is the module's, as Istio checks it after unpacking.
	path, err := newCache(t, nil).Get(ctxOf(t), u, GetOptions{Checksum: sha(module)})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, path), module) {
		t.Fatal("not the module")
	}
}

func TestIfNotPresentServesTheCachedModuleWhateverTheVersion(t *testing.T) {
	srv := newModuleServer(t)
	u := srv.serve("/m.wasm", wasmModule(t, 10))
	c := newCache(t, nil)
	for _, v := range []string{"1", "2", "3"} {
		if _, err := c.Get(ctxOf(t), u, GetOptions{ResourceName: "ns.plugin", ResourceVersion: v, PullPolicy: PullIfNotPresent}); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func TestAlwaysPullsAgainOnANewResourceVersionOnly(t *testing.T) {
	srv := newModuleServer(t)
	first := wasmModule(t, 10)
	u := srv.serve("/m.wasm", first)
	c := newCache(t, nil)
	get := func(version string) string {
		t.Helper()
		p, err := c.Get(ctxOf(t), u, GetOptions{ResourceName: "ns.plugin", ResourceVersion: version, PullPolicy: PullAlways})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	get("1")
	get("1")
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("%d requests for one version, want 1", n)
	}
	second := wasmModule(t, 10)
	srv.serve("/m.wasm", second)
	if p := get("2"); !bytes.Equal(mustRead(t, p), second) || srv.requests.Load() != 2 {
		t.Fatalf("a new version did not pull the new module (%d requests)", srv.requests.Load())
	}
}

func TestConcurrentGetsOfOneURLFetchOnce(t *testing.T) {
	module := wasmModule(t, 10)
	release := make(chan struct{})
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = w.Write(module)
	}))
	t.Cleanup(srv.Close)
	c := newCache(t, nil)
	const n = 8
	errs := make(chan error, n)
	paths := make(chan string, n)
	for range n {
		go func() {
			p, err := c.Get(ctxOf(t), srv.URL+"/m.wasm", GetOptions{})
			errs <- err
			paths <- p
		}()
	}
	// Wait until all have joined the one fetch.
	for joined := 0; joined < n; {
		time.Sleep(time.Millisecond)
		c.mu.Lock()
		joined = 0
		for _, cl := range c.inflight {
			joined = cl.waiters
		}
		c.mu.Unlock()
	}
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if p := <-paths; !bytes.Equal(mustRead(t, p), module) {
			t.Fatal("not the module")
		}
	}
	if requests.Load() != 1 {
		t.Fatalf("%d requests, want 1", requests.Load())
	}
}

func TestAFetchEndsWhenItsLastCallerGivesUp(t *testing.T) {
	arrived, gone := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(gone)
	}))
	t.Cleanup(srv.Close)
	c := newCache(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, srv.URL+"/m.wasm", GetOptions{Timeout: time.Minute})
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	<-gone // the server saw the request cancelled
	for c.inflightCount() != 0 {
		time.Sleep(time.Millisecond)
	}
}

func (c *Cache) inflightCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.inflight)
}

func TestTheLeastRecentlyUsedModuleNoResourceUsesIsEvicted(t *testing.T) {
	srv := newModuleServer(t)
	now := time.Unix(1000, 0)
	c := newCache(t, func(o *Options) {
		o.MaxModules = 2
		o.now = func() time.Time { return now }
	})
	get := func(path, resource string) (string, error) {
		t.Helper()
		now = now.Add(time.Second)
		return c.Get(ctxOf(t), srv.serve(path, wasmModule(t, 10)), GetOptions{ResourceName: resource})
	}
	a, _ := get("/a.wasm", "r1")
	b, _ := get("/b.wasm", "r2")
	// r1 moves to c: a is used by no resource and is evicted.
	if _, err := get("/c.wasm", "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a was not evicted: %v", err)
	}
	if _, err := os.Stat(b); err != nil {
		t.Fatalf("b, in use, was evicted: %v", err)
	}
	// Both modules held are in use by other resources: a third does not fit.
	if _, err := get("/d.wasm", "r3"); !errors.Is(err, ErrCacheFull) {
		t.Fatalf("got %v, want ErrCacheFull", err)
	}
}

func TestTheCacheKeepsToItsByteBound(t *testing.T) {
	srv := newModuleServer(t)
	c := newCache(t, func(o *Options) { o.MaxCacheBytes = 250 })
	for i, p := range []string{"/a.wasm", "/b.wasm", "/c.wasm", "/d.wasm"} {
		if _, err := c.Get(ctxOf(t), srv.serve(p, wasmModule(t, 92)), GetOptions{ResourceName: "r"}); err != nil {
			t.Fatalf("module %d: %v", i, err)
		}
		if c.bytes > 250 {
			t.Fatalf("%d bytes held", c.bytes)
		}
	}
	if _, err := c.Get(ctxOf(t), srv.serve("/big.wasm", wasmModule(t, 300)), GetOptions{}); !errors.Is(err, ErrCacheFull) {
		t.Fatalf("a module larger than the cache: %v", err)
	}
}

func TestModulesUnusedPastTheExpiryArePurged(t *testing.T) {
	srv := newModuleServer(t)
	now := time.Unix(1000, 0)
	c := newCache(t, func(o *Options) {
		o.ModuleExpiry = time.Hour
		o.now = func() time.Time { return now }
	})
	u := srv.serve("/m.wasm", wasmModule(t, 10))
	path, err := c.Get(ctxOf(t), u, GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(59 * time.Minute)
	c.purge()
	if _, err := os.Stat(path); err != nil {
		t.Fatal("purged before its expiry")
	}
	if _, err := c.Get(ctxOf(t), u, GetOptions{}); err != nil || srv.requests.Load() != 1 {
		t.Fatalf("the cached module was not used: %v", err)
	}
	now = now.Add(61 * time.Minute)
	c.purge()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("not purged: %v", err)
	}
	if _, err := c.Get(ctxOf(t), u, GetOptions{}); err != nil || srv.requests.Load() != 2 {
		t.Fatalf("not fetched again: %v", err)
	}
}

func TestAModuleOfAPreviousRunIsRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, strings.Repeat("a", 64)+".wasm")
	other := filepath.Join(dir, "cert-chain.pem")
	for _, f := range []string{stale, other, filepath.Join(dir, ".tmp-123")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newCache(t, func(o *Options) { o.Dir = dir })
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "cert-chain.pem" {
		t.Fatalf("left %v", entries)
	}
}

func TestALinkLocalAddressIsRefused(t *testing.T) {
	c := newCache(t, nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data", "http://[fe80::1]/m.wasm", "http://100.100.100.200/m.wasm"} {
		if _, err := c.Get(ctxOf(t), u, GetOptions{}); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("%s: %v", u, err)
		}
	}
	// Nor through a redirect.
	srv := httptest.NewServer(http.RedirectHandler("http://169.254.169.254/latest/meta-data", http.StatusFound))
	t.Cleanup(srv.Close)
	if _, err := c.Get(ctxOf(t), srv.URL+"/m.wasm", GetOptions{}); err == nil || !strings.Contains(err.Error(), "link-local") {
		t.Fatalf("redirect: %v", err)
	}
}

// countingListener counts the connections accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func TestABlockedAddressIsRefusedBeforeAnyConnection(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("\x00asm\x01\x00\x00\x00"))
	}))
	lis := &countingListener{Listener: srv.Listener}
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)
	c := newCache(t, func(o *Options) { o.BlockedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} })
	if _, err := c.Get(ctxOf(t), srv.URL+"/m.wasm", GetOptions{}); err == nil || !strings.Contains(err.Error(), "blocked range") {
		t.Fatalf("got %v", err)
	}
	if lis.n.Load() != 0 {
		t.Fatalf("%d connections reached the server", lis.n.Load())
	}
}

func TestABearerRealmOnAPrivateAddressIsRefused(t *testing.T) {
	for challenge, ok := range map[string]bool{
		`Bearer realm="https://auth.example.com/token",service="r"`:   true,
		`Basic realm="registry"`:                                      true,
		`Bearer realm="http://169.254.169.254/latest",service="r"`:    false,
		`Bearer realm="http://10.0.0.1/token"`:                        false,
		`Bearer realm="http://localhost:8080/token"`:                  false,
		`Bearer realm="file:///etc/passwd"`:                           false,
		`Bearer service="r",realm="https://metadata.google.internal"`: false,
	} {
		if err := checkBearerRealm(challenge); (err == nil) != ok {
			t.Errorf("%s: %v", challenge, err)
		}
	}
}
