package bootstrap

import (
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	metricsv3 "github.com/envoyproxy/go-control-plane/envoy/config/metrics/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/structpb"
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
// proxy config's proxyStatsMatcher prefixes, suffixes and regular
// expressions ("{pod_ip}" standing for the pod's address) with the
// required ones after them, then "component" and "istio".
func statsMatcher(pc *meshv1alpha1.ProxyConfig, podIP string) *metricsv3.StatsMatcher {
	m := pc.GetProxyStatsMatcher()
	sub := func(vs []string) []string {
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = strings.ReplaceAll(v, "{pod_ip}", podIP)
		}
		return out
	}
	var patterns []*matcherv3.StringMatcher
	prefix := func(p string) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}})
	}
	prefix("reporter=")
	for _, p := range sub(append(append([]string(nil), m.GetInclusionPrefixes()...), requiredStatPrefixes...)) {
		prefix(p)
	}
	for _, s := range sub(append(append([]string(nil), m.GetInclusionSuffixes()...), requiredStatSuffixes...)) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}})
	}
	for _, r := range sub(append(append([]string(nil), m.GetInclusionRegexps()...), requiredStatRegexps...)) {
		patterns = append(patterns, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: r}}})
	}
	prefix("component")
	prefix("istio")
	return &metricsv3.StatsMatcher{StatsMatcher: &metricsv3.StatsMatcher_InclusionList{InclusionList: &matcherv3.ListStringMatcher{Patterns: patterns}}}
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
