package app

import (
	"strings"
	"testing"
	"time"
)

func TestIstiosWasmVariablesAreTheDefaults(t *testing.T) {
	t.Setenv("WASM_INSECURE_REGISTRIES", "localhost:5000, registry.shop:5000")
	t.Setenv("WASM_MODULE_EXPIRY", "2h")
	t.Setenv("WASM_HTTP_REQUEST_MAX_RETRIES", "2")
	t.Setenv("BLOCKED_CIDRS_IN_WASM_FETCH", "10.0.0.0/8")
	c := wasmDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.InsecureRegistries, ",") != "localhost:5000,registry.shop:5000" || c.ModuleExpiry != 2*time.Hour ||
		c.HTTPRequestRetries != 2 || len(c.BlockedCIDRs) != 1 || c.CacheDir != wasmDataDir {
		t.Fatalf("got %+v", c)
	}
	t.Setenv("ISTIO_AGENT_ENABLE_WASM_REMOTE_LOAD_CONVERSION", "false")
	if c := wasmDefaults(); c.CacheDir != "" {
		t.Fatalf("conversion off: cache dir %q", c.CacheDir)
	}
}

func TestAWasmVariableThatDoesNotParseIsReported(t *testing.T) {
	t.Setenv("WASM_PURGE_INTERVAL", "hourly")
	t.Setenv("BLOCKED_CIDRS_IN_WASM_FETCH", "10.0.0.0/33")
	err := wasmDefaults().Validate()
	if err == nil || !strings.Contains(err.Error(), "WASM_PURGE_INTERVAL") || !strings.Contains(err.Error(), "blockedCIDRs") {
		t.Fatalf("got %v", err)
	}
}
