package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/flotilla-mesh/flotilla/services/agent/wasm"
)

// wasmDataDir is where the modules are kept: under Istio's data directory
// (the istio-data emptyDir the injector mounts), which Envoy reads.
const wasmDataDir = "/var/lib/istio/data/wasm"

// WasmConfig is the cache of the Wasm modules that ECDS resources load
// remotely: the agent fetches them and Envoy loads them from its files,
// as Istio's agent does. Istio's variables are the defaults.
type WasmConfig struct {
	CacheDir           string        `yaml:"cacheDir" usage:"directory of the Wasm modules fetched for ECDS resources, which Envoy loads from there; empty: ECDS passes to Envoy unconverted (empty when $ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION=false)"`
	InsecureRegistries []string      `yaml:"insecureRegistries" usage:"registries and HTTP hosts (host or host:port, * for all) reached over plain HTTP or TLS without verification (default $WASM_INSECURE_REGISTRIES)"`
	BlockedCIDRs       []string      `yaml:"blockedCIDRs" usage:"address ranges no module is fetched from, on top of link-local and cloud metadata addresses (default $BLOCKED_CIDRS_IN_WASM_FETCH)"`
	ModuleExpiry       time.Duration `yaml:"moduleExpiry" usage:"a module unused this long is removed (default $WASM_MODULE_EXPIRY)"`
	PurgeInterval      time.Duration `yaml:"purgeInterval" usage:"how often expired modules are looked for (default $WASM_PURGE_INTERVAL)"`
	HTTPRequestTimeout time.Duration `yaml:"httpRequestTimeout" usage:"timeout of one HTTP request fetching a module over http(s) (default $WASM_HTTP_REQUEST_TIMEOUT)"`
	HTTPRequestRetries int           `yaml:"httpRequestRetries" usage:"attempts at fetching a module over http(s) (default $WASM_HTTP_REQUEST_MAX_RETRIES)"`
	MaxModuleBytes     int64         `yaml:"maxModuleBytes" usage:"largest module fetched (default $ISTIO_WASM_MAX_BINARY_SIZE_BYTES)"`
	CacheMaxBytes      int64         `yaml:"cacheMaxBytes" usage:"bytes of modules kept at most; the least recently used modules no resource uses are evicted (default $WASM_MODULE_CACHE_MAX_BYTES)"`
	CacheMaxModules    int           `yaml:"cacheMaxModules" usage:"modules kept at most (default $WASM_MODULE_CACHE_MAX_ENTRIES)"`

	// envErr is a variable of Istio's that does not parse.
	envErr error
}

// wasmDefaults reads Istio's agent variables.
func wasmDefaults() WasmConfig {
	var errs []error
	duration := func(k string, d time.Duration) time.Duration {
		v := os.Getenv(k)
		if v == "" {
			return d
		}
		out, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", k, v, err))
			return d
		}
		return out
	}
	integer := func(k string, d int64) int64 {
		v := os.Getenv(k)
		if v == "" {
			return d
		}
		out, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", k, v, err))
			return d
		}
		return out
	}
	list := func(k string) []string {
		var out []string
		for s := range strings.SplitSeq(os.Getenv(k), ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	c := WasmConfig{
		CacheDir:           wasmDataDir,
		InsecureRegistries: list("WASM_INSECURE_REGISTRIES"),
		BlockedCIDRs:       list("BLOCKED_CIDRS_IN_WASM_FETCH"),
		ModuleExpiry:       duration("WASM_MODULE_EXPIRY", wasm.DefaultModuleExpiry),
		PurgeInterval:      duration("WASM_PURGE_INTERVAL", wasm.DefaultPurgeInterval),
		HTTPRequestTimeout: duration("WASM_HTTP_REQUEST_TIMEOUT", wasm.DefaultHTTPRequestTimeout),
		HTTPRequestRetries: int(integer("WASM_HTTP_REQUEST_MAX_RETRIES", wasm.DefaultHTTPRequestMaxRetries)),
		MaxModuleBytes:     integer("ISTIO_WASM_MAX_BINARY_SIZE_BYTES", wasm.DefaultMaxModuleBytes),
		CacheMaxBytes:      integer("WASM_MODULE_CACHE_MAX_BYTES", wasm.DefaultMaxCacheBytes),
		CacheMaxModules:    int(integer("WASM_MODULE_CACHE_MAX_ENTRIES", wasm.DefaultMaxModules)),
	}
	if v := os.Getenv("ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION"); v != "" {
		if on, err := strconv.ParseBool(v); err != nil {
			errs = append(errs, fmt.Errorf("ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION=%q: %w", v, err))
		} else if !on {
			c.CacheDir = ""
		}
	}
	c.envErr = errors.Join(errs...)
	return c
}

// Validate checks the configuration.
func (c WasmConfig) Validate() error {
	errs := []error{c.envErr}
	if _, err := c.blocked(); err != nil {
		errs = append(errs, err)
	}
	for name, v := range map[string]int64{
		"moduleExpiry": int64(c.ModuleExpiry), "purgeInterval": int64(c.PurgeInterval), "httpRequestTimeout": int64(c.HTTPRequestTimeout),
		"httpRequestRetries": int64(c.HTTPRequestRetries), "maxModuleBytes": c.MaxModuleBytes, "cacheMaxBytes": c.CacheMaxBytes,
		"cacheMaxModules": int64(c.CacheMaxModules),
	} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("wasm.%s must be positive", name))
		}
	}
	return errors.Join(errs...)
}

func (c WasmConfig) blocked() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(c.BlockedCIDRs))
	for _, s := range c.BlockedCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("wasm.blockedCIDRs: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// cache is the module cache, nil when conversion is off.
func (c WasmConfig) cache(log *slog.Logger, istio metric.Meter) (*wasm.Cache, error) {
	if c.CacheDir == "" {
		return nil, nil
	}
	blocked, err := c.blocked()
	if err != nil {
		return nil, err
	}
	return wasm.New(wasm.Options{
		Dir: c.CacheDir, InsecureRegistries: c.InsecureRegistries, BlockedCIDRs: blocked,
		PurgeInterval: c.PurgeInterval, ModuleExpiry: c.ModuleExpiry,
		HTTPRequestTimeout: c.HTTPRequestTimeout, HTTPRequestMaxRetries: c.HTTPRequestRetries,
		MaxModuleBytes: c.MaxModuleBytes, MaxCacheBytes: c.CacheMaxBytes, MaxModules: c.CacheMaxModules,
		Log: log, IstioMeter: istio,
	})
}
