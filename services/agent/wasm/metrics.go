package wasm

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The result label's values (Istio's pkg/wasm/monitoring.go): a fixed set,
// so no configuration can add series.
const (
	resultSuccess          = "success"
	resultDownloadFailure  = "download_failure"
	resultManifestFailure  = "manifest_failure"
	resultChecksumMismatch = "checksum_mismatched"
	resultFetchFailure     = "fetch_failure"

	resultNoRemoteLoad        = "no_remote_load"
	resultMarshalFailure      = "marshal_failure"
	resultUnmarshalFailure    = "unmarshal_failure"
	resultMissRemoteFetchHint = "miss_remote_fetch_hint"
)

// metrics are the agent's wasm_* metrics, named, labelled and bucketed as
// Istio's agent exports them (its registry prefixes istio_agent_:
// pilot-agent's initializeMonitoring).
type metrics struct {
	entries     metric.Float64Gauge     // wasm_cache_entries
	lookups     metric.Float64Counter   // wasm_cache_lookup_count{hit}
	fetches     metric.Float64Counter   // wasm_remote_fetch_count{result}
	conversions metric.Float64Counter   // wasm_config_conversion_count{result}
	duration    metric.Float64Histogram // wasm_config_conversion_duration, in ms as Istio's
}

func newMetrics(m metric.Meter) (*metrics, error) {
	var out metrics
	var err error
	wrap := func(name string, err error) error { return fmt.Errorf("metric %s: %w", name, err) }
	if out.entries, err = m.Float64Gauge("istio_agent_wasm_cache_entries",
		metric.WithDescription("number of Wasm remote fetch cache entries.")); err != nil {
		return nil, wrap("istio_agent_wasm_cache_entries", err)
	}
	if out.lookups, err = m.Float64Counter("istio_agent_wasm_cache_lookup_count",
		metric.WithDescription("number of Wasm remote fetch cache lookups.")); err != nil {
		return nil, wrap("istio_agent_wasm_cache_lookup_count", err)
	}
	if out.fetches, err = m.Float64Counter("istio_agent_wasm_remote_fetch_count",
		metric.WithDescription("number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.")); err != nil {
		return nil, wrap("istio_agent_wasm_remote_fetch_count", err)
	}
	if out.conversions, err = m.Float64Counter("istio_agent_wasm_config_conversion_count",
		metric.WithDescription("number of Wasm config conversions and results, including success, no remote load, marshal failure, remote fetch failure, miss remote fetch hint.")); err != nil {
		return nil, wrap("istio_agent_wasm_config_conversion_count", err)
	}
	if out.duration, err = m.Float64Histogram("istio_agent_wasm_config_conversion_duration", metric.WithUnit("ms"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
		metric.WithDescription("Total time in milliseconds istio-agent spends on converting remote load in Wasm config.")); err != nil {
		return nil, wrap("istio_agent_wasm_config_conversion_duration", err)
	}
	return &out, nil
}

func (m *metrics) lookup(hit bool) {
	m.lookups.Add(context.Background(), 1, metric.WithAttributes(attribute.String("hit", strconv.FormatBool(hit))))
}

func (m *metrics) fetch(result string) {
	m.fetches.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
}

func (m *metrics) conversion(result string) {
	m.conversions.Add(context.Background(), 1, metric.WithAttributes(attribute.String("result", result)))
}

func (m *metrics) converted(took time.Duration) {
	m.duration.Record(context.Background(), float64(took.Milliseconds()))
}
