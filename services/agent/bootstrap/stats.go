package bootstrap

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"istio.io/api/annotation"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// The stats Envoy keeps whatever the proxy config says (Istio's
// requiredEnvoyStatsMatcherInclusionPrefixes, rbacEnvoyStatsMatcherInclusionSuffix
// and requiredEnvoyStatsMatcherInclusionRegexes), and those its bootstrap
// template always lists: Istio's standard metrics ("reporter="), its
// components' and the istio ones.
var (
	requiredStatPrefixes = []string{"cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm"}
	requiredStatSuffixes = []string{"rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied"}
	requiredStatRegexps  = []string{`vhost\..*\.route\..*`}
)

// statsMatcher is the stats Envoy keeps, as Istio's bootstrap writes it
// (getStatsOptions and the template's stats_matcher): "reporter=", the
// inclusion prefixes, suffixes and regular expressions ("{pod_ip}"
// standing for the pod's address) with the required ones after them, then
// "component" and "istio". Each inclusion list is the pod's annotation
// (sidecar.istio.io/statsInclusionPrefixes, …Suffixes, …Regexps, comma
// separated) when it has one, else the proxy config's proxyStatsMatcher:
// never both, as in Istio.
func statsMatcher(pc *meshv1alpha1.ProxyConfig, podIP string, annotations map[string]string) *metricsv3.StatsMatcher {
	m := pc.GetProxyStatsMatcher()
	option := func(anno string, fromConfig, required []string) []string {
		out := slices.Clone(fromConfig)
		if v := annotations[anno]; v != "" {
			out = strings.Split(v, ",")
		}
		out = append(out, required...)
		for i, v := range out {
			out[i] = strings.ReplaceAll(v, "{pod_ip}", podIP)
		}
		return out
	}
	var patterns []*matcherv3.StringMatcher
	prefix := func(p string) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}})
	}
	prefix("reporter=")
	for _, p := range option(annotation.SidecarStatsInclusionPrefixes.Name, m.GetInclusionPrefixes(), requiredStatPrefixes) {
		prefix(p)
	}
	for _, s := range option(annotation.SidecarStatsInclusionSuffixes.Name, m.GetInclusionSuffixes(), requiredStatSuffixes) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}})
	}
	for _, r := range option(annotation.SidecarStatsInclusionRegexps.Name, m.GetInclusionRegexps(), requiredStatRegexps) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: r}}})
	}
	prefix("component")
	prefix("istio")
	return &metricsv3.StatsMatcher{StatsMatcher: &metricsv3.StatsMatcher_InclusionList{InclusionList: &matcherv3.ListStringMatcher{Patterns: patterns}}}
}

// extraStatTags are the proxy config's extraStatTags and the pod's
// sidecar.istio.io/extraStatTags (comma separated), without empties or
// repeats (Istio's getStatsOptions).
func extraStatTags(pc *meshv1alpha1.ProxyConfig, annotations map[string]string) []string {
	var out []string
	for _, t := range slices.Concat(pc.GetExtraStatTags(), strings.Split(annotations[annotation.SidecarExtraStatTags.Name], ",")) {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// statsIntervals sets the bootstrap's stats flush interval
// (sidecar.istio.io/statsFlushInterval; Envoy's default 5 s) and
// eviction interval (sidecar.istio.io/statsEvictionInterval, a multiple
// of the flush interval), and the histogram buckets
// (sidecar.istio.io/statsHistogramBuckets: a JSON object of stat prefix
// to bucket bounds), as Istio's getStatsOptions; what does not parse is
// reported and left out, as Istio's agent logs it.
func statsIntervals(b *bootstrapv3.Bootstrap, annotations map[string]string) []string {
	var problems []string
	flush := 5 * time.Second
	if v, ok := annotations[annotation.SidecarStatsFlushInterval.Name]; ok {
		if d, err := time.ParseDuration(v); err != nil || d < time.Millisecond || d > 300*time.Second {
			problems = append(problems, fmt.Sprintf("annotation %s=%q is not a duration from 1ms to 300s (Envoy's bounds); Envoy's default is kept", annotation.SidecarStatsFlushInterval.Name, v))
		} else {
			flush = d
			b.StatsFlushInterval = durationpb.New(d)
		}
	}
	if v, ok := annotations[annotation.SidecarStatsEvictionInterval.Name]; ok {
		switch d, err := time.ParseDuration(v); {
		case err != nil || d < time.Second:
			problems = append(problems, fmt.Sprintf("annotation %s=%q is not a duration of a second or more; stats are not evicted", annotation.SidecarStatsEvictionInterval.Name, v))
		case d%flush != 0:
			problems = append(problems, fmt.Sprintf("annotation %s=%q is not a multiple of the stats flush interval %s; stats are not evicted", annotation.SidecarStatsEvictionInterval.Name, v, flush))
		default:
			b.StatsEviction = &bootstrapv3.Bootstrap_StatsEvictionInterval{StatsEvictionInterval: &durationpb.Duration{Seconds: int64(d / time.Second)}}
		}
	}
	if v, ok := annotations[annotation.SidecarStatsHistogramBuckets.Name]; ok {
		byPrefix := map[string][]float64{}
		if err := json.Unmarshal([]byte(v), &byPrefix); err != nil {
			problems = append(problems, fmt.Sprintf("annotation %s is not a JSON object of prefix to bucket bounds (%v); Envoy's buckets are kept", annotation.SidecarStatsHistogramBuckets.Name, err))
		} else {
			for _, prefix := range slices.Sorted(maps.Keys(byPrefix)) {
				b.StatsConfig.HistogramBucketSettings = append(b.StatsConfig.HistogramBucketSettings, &metricsv3.HistogramBucketSettings{
					Match:   &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}},
					Buckets: byPrefix[prefix],
				})
			}
		}
	}
	return problems
}

// runtime is Envoy's layered runtime as Istio's bootstrap writes it
// (extractRuntimeFlags): Istio's defaults and the proxy config's
// runtimeValues in a static layer ("" removes a default; "true" and
// "false" are booleans, as Envoy no longer takes them as strings), then
// the admin layer.
func runtime(pc *meshv1alpha1.ProxyConfig) (*bootstrapv3.LayeredRuntime, error) {
	flags := map[string]any{
		"re2.max_program_size.error_level": "32768",
		"envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": true,
		"envoy.reloadable_features.http_reject_path_with_fragment":                                             false,
		"envoy.reloadable_features.fixed_heap_use_allocated":                                                   true,
		"envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update":                                       false,
	}
	for k, v := range pc.GetRuntimeValues() {
		switch v {
		case "":
			delete(flags, k)
		case "true":
			flags[k] = true
		case "false":
			flags[k] = false
		default:
			flags[k] = v
		}
	}
	st, err := structpb.NewStruct(flags)
	if err != nil {
		return nil, err
	}
	return &bootstrapv3.LayeredRuntime{Layers: []*bootstrapv3.RuntimeLayer{
		{Name: "global config", LayerSpecifier: &bootstrapv3.RuntimeLayer_StaticLayer{StaticLayer: st}},
		{Name: "admin", LayerSpecifier: &bootstrapv3.RuntimeLayer_AdminLayer_{AdminLayer: &bootstrapv3.RuntimeLayer_AdminLayer{}}},
	}}, nil
}
