package model

import (
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	telemetry "istio.io/api/telemetry/v1alpha1"
)

// Telemetry is a telemetry.istio.io Telemetry resource.
type Telemetry struct {
	Name, Namespace string
	Spec            *telemetry.Telemetry
}

// AppliedTelemetry is what the Telemetry resources say of one proxy,
// before merging: the root namespace's namespace-wide Telemetry, then the
// proxy namespace's, then those of its namespace whose selector matches
// it (Istio's applicableTelemetries). Later entries override earlier
// ones.
type AppliedTelemetry struct {
	Metrics []*telemetry.Metrics
	// Logging keeps each Telemetry's rules apart: mergeLogs reads them
	// level by level.
	Logging [][]*telemetry.AccessLogging
	Tracing []*telemetry.Tracing
}

// ProxyTelemetry returns the Telemetries that apply to a proxy in
// namespace with labels, as Istio's applicableTelemetries decides for
// sidecars and gateways: the oldest Telemetry without a selector or
// targetRef in the root namespace (mesh-wide), then the oldest such in
// the proxy's namespace (namespace-wide), then, oldest first, every
// Telemetry of the proxy's namespace that attaches to it: by its selector,
// or, with targetRefs, to the Gateway API gateways they name (attaches,
// Istio's ShouldAttachPolicy).
func (pc *PushContext) ProxyTelemetry(namespace string, labels map[string]string) *AppliedTelemetry {
	out := &AppliedTelemetry{}
	add := func(t *Telemetry) {
		out.Metrics = append(out.Metrics, t.Spec.GetMetrics()...)
		if len(t.Spec.GetAccessLogging()) > 0 {
			out.Logging = append(out.Logging, t.Spec.GetAccessLogging())
		}
		out.Tracing = append(out.Tracing, t.Spec.GetTracing()...)
	}
	if t := pc.namespaceWideTelemetry(pc.RootNamespace); t != nil {
		add(t)
	}
	if namespace != pc.RootNamespace {
		if t := pc.namespaceWideTelemetry(namespace); t != nil {
			add(t)
		}
	}
	for _, t := range pc.cfg.telemetries[namespace] {
		if namespaceWide(t) {
			continue
		}
		if attaches(t.Spec.GetSelector().GetMatchLabels(), targetRefs(t.Spec.GetTargetRef(), t.Spec.GetTargetRefs()), namespace, namespace, labels) {
			add(t)
		}
	}
	return out
}

// TelemetryReadsLabels reports whether a Telemetry selects workloads by
// label or by targetRefs (a gateway's pods by their Gateway's name):
// only then can two proxies of one namespace get different telemetry.
func (pc *PushContext) TelemetryReadsLabels() bool {
	for _, ts := range pc.cfg.telemetries {
		for _, t := range ts {
			if !namespaceWide(t) {
				return true
			}
		}
	}
	return false
}

func namespaceWide(t *Telemetry) bool {
	return len(t.Spec.GetSelector().GetMatchLabels()) == 0 && !hasTargetRefs(t)
}

func hasTargetRefs(t *Telemetry) bool {
	return t.Spec.GetTargetRef() != nil || len(t.Spec.GetTargetRefs()) > 0
}

func (pc *PushContext) namespaceWideTelemetry(namespace string) *Telemetry {
	for _, t := range pc.cfg.telemetries[namespace] {
		if namespaceWide(t) {
			return t
		}
	}
	return nil
}

// ExtensionProvider returns the mesh's extension provider of a name,
// compared without case (Istio's fetchProvider); nil when there is none.
func (pc *PushContext) ExtensionProvider(name string) *meshv1alpha1.MeshConfig_ExtensionProvider {
	for _, p := range pc.Mesh.GetExtensionProviders() {
		if strings.EqualFold(name, p.GetName()) {
			return p
		}
	}
	return nil
}

// WorkloadMode is the side of a connection a proxy's listener is on:
// CLIENT for outbound listeners and gateways, SERVER for inbound ones
// (Istio's workloadMode).
type WorkloadMode = telemetry.WorkloadMode

// Workload modes.
const (
	ClientMode = telemetry.WorkloadMode_CLIENT
	ServerMode = telemetry.WorkloadMode_SERVER
)

// LoggingSpec is one access-log provider's merged setting.
type LoggingSpec struct {
	Disabled bool
	Filter   *telemetry.AccessLogging_Filter
}

// MergeLogs merges the access-logging rules of the Telemetries
// that apply, for one mode, into a setting per provider name, as Istio's
// mergeLogs: without rules, the mesh's default providers; otherwise the
// providers the last level that names any (for the mode) names, each with
// the filter its last rule gives, or disabled by a later rule that says
// so. A rule without providers speaks for the providers of the rule
// before it (at first the mesh's defaults). ok is false when no rule and
// no default provider exists: then the mesh's accessLogFile applies
// (Istio's fallback to the legacy settings).
func (at *AppliedTelemetry) MergeLogs(mesh *meshv1alpha1.MeshConfig, mode WorkloadMode) (providers map[string]LoggingSpec, ok bool) {
	defaults := mesh.GetDefaultProviders().GetAccessLogging()
	if len(at.Logging) == 0 && len(defaults) == 0 {
		return nil, false
	}
	providers = map[string]LoggingSpec{}
	if len(at.Logging) == 0 {
		for _, p := range defaults {
			providers[p] = LoggingSpec{}
		}
		return providers, true
	}
	names := defaults
	filters := map[string]LoggingSpec{}
	for _, level := range at.Logging {
		var named []string
		for _, l := range level {
			if !modeMatches(l.GetMatch().GetMode(), l.GetMatch() != nil, mode) {
				continue
			}
			for _, p := range providerNames(l.GetProviders()) {
				named = append(named, p)
				filters[p] = LoggingSpec{Filter: l.GetFilter()}
			}
		}
		if len(named) > 0 {
			names = named
		}
	}
	inScope := map[string]bool{}
	for _, n := range names {
		inScope[n] = true
	}
	parent := defaults
	for _, level := range at.Logging {
		for _, l := range level {
			ps := providerNames(l.GetProviders())
			if len(ps) == 0 {
				ps = parent
			}
			parent = ps
			if !modeMatches(l.GetMatch().GetMode(), l.GetMatch() != nil, mode) {
				continue
			}
			for _, p := range ps {
				if !inScope[p] {
					continue
				}
				if l.GetDisabled().GetValue() {
					providers[p] = LoggingSpec{Disabled: true}
					continue
				}
				providers[p] = filters[p]
			}
		}
	}
	return providers, true
}

// modeMatches reports whether a rule's match mode covers mode; a rule
// without a match covers both (Istio's matchWorkloadMode).
func modeMatches(m telemetry.WorkloadMode, set bool, mode WorkloadMode) bool {
	return !set || m == telemetry.WorkloadMode_CLIENT_AND_SERVER || m == mode
}

func providerNames(ps []*telemetry.ProviderRef) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.GetName())
	}
	return out
}

// TracingSpec is the tracing one side of a proxy gets.
type TracingSpec struct {
	// Provider is nil when none is configured or the one named does
	// not exist; Disabled is then true.
	Provider                     *meshv1alpha1.MeshConfig_ExtensionProvider
	Disabled                     bool
	RandomSamplingPercentage     *float64
	CustomTags                   map[string]*telemetry.Tracing_CustomTag
	UseRequestIDForTraceSampling bool
	EnableIstioTags              bool
	DisableContextPropagation    bool
}

// TracingConfig is a proxy's tracing, client side and server side.
type TracingConfig struct{ Client, Server TracingSpec }

// MergeTracing merges the tracing rules of the Telemetries that apply, as
// Istio's Telemetries.Tracing: nil when there are none and the mesh has no
// default tracing provider (then the mesh's legacy settings apply);
// otherwise the first default provider, replaced by the first provider of
// each later rule that names one, every field a rule sets overriding the
// earlier value for the modes its match covers (custom tags replaced as a
// whole, not merged). A side without a provider is disabled.
func (at *AppliedTelemetry) MergeTracing(pc *PushContext) *TracingConfig {
	defaults := pc.Mesh.GetDefaultProviders().GetTracing()
	if len(at.Tracing) == 0 && len(defaults) == 0 {
		return nil
	}
	client := TracingSpec{UseRequestIDForTraceSampling: true, EnableIstioTags: true}
	server := client
	if len(defaults) > 0 {
		client.Provider = pc.ExtensionProvider(defaults[0])
		server.Provider = client.Provider
	}
	for _, t := range at.Tracing {
		specs := []*TracingSpec{&client, &server}
		if t.GetMatch() != nil {
			switch t.GetMatch().GetMode() {
			case telemetry.WorkloadMode_CLIENT:
				specs = specs[:1]
			case telemetry.WorkloadMode_SERVER:
				specs = specs[1:]
			}
		}
		for _, s := range specs {
			if names := providerNames(t.GetProviders()); len(names) > 0 {
				s.Provider = pc.ExtensionProvider(names[0])
			}
			if v := t.GetDisableSpanReporting(); v != nil {
				s.Disabled = v.GetValue()
			}
			if t.GetCustomTags() != nil {
				s.CustomTags = t.GetCustomTags()
			}
			if v := t.GetRandomSamplingPercentage(); v != nil {
				p := v.GetValue()
				s.RandomSamplingPercentage = &p
			}
			if v := t.GetUseRequestIdForTraceSampling(); v != nil {
				s.UseRequestIDForTraceSampling = v.GetValue()
			}
			if v := t.GetEnableIstioTags(); v != nil {
				s.EnableIstioTags = v.GetValue()
			}
			if v := t.GetDisableContextPropagation(); v != nil {
				s.DisableContextPropagation = v.GetValue()
			}
		}
	}
	for _, s := range []*TracingSpec{&client, &server} {
		if s.Provider == nil {
			s.Disabled = true
		}
	}
	return &TracingConfig{Client: client, Server: server}
}

// MetricsConfig is one metrics provider's merged setting.
type MetricsConfig struct {
	Client, Server    MetricsSide
	ReportingInterval *durationpb.Duration
}

// MetricsSide is a metrics provider's setting for one side.
type MetricsSide struct {
	// Disabled: no metrics at all on this side (the filter left out).
	Disabled  bool
	Overrides []MetricOverride
}

// MetricOverride changes one metric: Name is an IstioMetric's name
// (REQUEST_COUNT) or a custom metric's.
type MetricOverride struct {
	Name     string
	Disabled bool
	Tags     []TagOverride
}

// TagOverride upserts a tag's value (a CEL expression) or removes it.
type TagOverride struct {
	Name   string
	Remove bool
	Value  string
}

// Side returns the setting of the side mode names.
func (m MetricsConfig) Side(mode WorkloadMode) MetricsSide {
	if mode == ServerMode {
		return m.Server
	}
	return m.Client
}

// allMetrics are the standard metrics ALL_METRICS stands for, by name.
func allMetrics() []string {
	var out []string
	for name, v := range telemetry.MetricSelector_IstioMetric_value {
		if v != int32(telemetry.MetricSelector_ALL_METRICS) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// MergeMetrics merges the metrics rules of the Telemetries that apply into a
// setting per provider, as Istio's mergeMetrics: the providers of the
// last rule that names any (else the mesh's default metrics providers);
// each rule (or, naming none, its parent's providers) applies its
// overrides on top of the earlier ones, per mode; disabling ALL_METRICS
// drops the side's filter until a later rule enables a metric again.
func (at *AppliedTelemetry) MergeMetrics(mesh *meshv1alpha1.MeshConfig) map[string]MetricsConfig {
	type override struct {
		disabled *bool
		tags     map[string]*telemetry.MetricsOverrides_TagOverride
	}
	defaults := mesh.GetDefaultProviders().GetMetrics()
	providers := map[string]map[WorkloadMode]map[string]override{}
	if len(at.Metrics) == 0 {
		for _, p := range defaults {
			providers[p] = map[WorkloadMode]map[string]override{}
		}
	}
	names := defaults
	for _, m := range at.Metrics {
		if ps := providerNames(m.GetProviders()); len(ps) > 0 {
			names = ps
		}
	}
	inScope := map[string]bool{}
	for _, n := range names {
		inScope[n] = true
	}
	parent := defaults
	disabledAll := map[string]bool{} // provider/mode
	intervals := map[string]*durationpb.Duration{}
	key := func(p string, mode WorkloadMode) string { return p + "/" + mode.String() }
	for _, m := range at.Metrics {
		ps := providerNames(m.GetProviders())
		if len(ps) == 0 {
			ps = parent
		}
		parent = ps
		for _, p := range ps {
			if !inScope[p] {
				continue
			}
			if m.GetReportingInterval() != nil {
				intervals[p] = m.GetReportingInterval()
			}
			if providers[p] == nil {
				providers[p] = map[WorkloadMode]map[string]override{ClientMode: {}, ServerMode: {}}
			}
			mp := providers[p]
			for _, o := range m.GetOverrides() {
				modes := metricModes(o.GetMatch().GetMode())
				if isAllMetrics(o.GetMatch()) && o.GetDisabled().GetValue() {
					for _, mode := range modes {
						disabledAll[key(p, mode)] = true
					}
					continue
				}
				for _, mode := range modes {
					delete(disabledAll, key(p, mode))
					if mp[mode] == nil {
						mp[mode] = map[string]override{}
					}
					for _, metric := range metricMatches(o.GetMatch()) {
						ov := mp[mode][metric]
						if o.GetDisabled() != nil {
							d := o.GetDisabled().GetValue()
							ov.disabled = &d
						}
						for k, v := range o.GetTagOverrides() {
							if ov.tags == nil {
								ov.tags = map[string]*telemetry.MetricsOverrides_TagOverride{}
							}
							ov.tags[k] = v
						}
						mp[mode][metric] = ov
					}
				}
			}
		}
	}
	out := map[string]MetricsConfig{}
	for p, modes := range providers {
		cfg := MetricsConfig{ReportingInterval: intervals[p]}
		for mode, metrics := range modes {
			side := &cfg.Client
			if mode == ServerMode {
				side = &cfg.Server
			}
			if disabledAll[key(p, mode)] {
				side.Disabled = true
				continue
			}
			for _, name := range slices.Sorted(maps.Keys(metrics)) {
				ov := metrics[name]
				mo := MetricOverride{Name: name, Disabled: ov.disabled != nil && *ov.disabled}
				for _, tag := range slices.Sorted(maps.Keys(ov.tags)) {
					t := ov.tags[tag]
					if t.GetOperation() == telemetry.MetricsOverrides_TagOverride_REMOVE {
						mo.Tags = append(mo.Tags, TagOverride{Name: tag, Remove: true})
					} else {
						mo.Tags = append(mo.Tags, TagOverride{Name: tag, Value: t.GetValue()})
					}
				}
				side.Overrides = append(side.Overrides, mo)
			}
		}
		out[p] = cfg
	}
	return out
}

func metricModes(m telemetry.WorkloadMode) []WorkloadMode {
	if m == ClientMode || m == ServerMode {
		return []WorkloadMode{m}
	}
	return []WorkloadMode{ClientMode, ServerMode}
}

// isAllMetrics: no match, or ALL_METRICS (Istio's isAllMetrics).
func isAllMetrics(s *telemetry.MetricSelector) bool {
	switch m := s.GetMetricMatch().(type) {
	case *telemetry.MetricSelector_CustomMetric:
		return false
	case *telemetry.MetricSelector_Metric:
		return m.Metric == telemetry.MetricSelector_ALL_METRICS
	default:
		return true
	}
}

func metricMatches(s *telemetry.MetricSelector) []string {
	switch m := s.GetMetricMatch().(type) {
	case *telemetry.MetricSelector_CustomMetric:
		return []string{m.CustomMetric}
	case *telemetry.MetricSelector_Metric:
		if m.Metric != telemetry.MetricSelector_ALL_METRICS {
			return []string{m.Metric.String()}
		}
	}
	return allMetrics()
}

// LoggingConfig is one access-log provider a listener gets.
type LoggingConfig struct {
	Provider *meshv1alpha1.MeshConfig_ExtensionProvider
	Disabled bool
	Filter   *telemetry.AccessLogging_Filter
}

// AccessLogging is the access logs a listener of mode gets from the
// Telemetry API, by provider name, as Istio's Telemetries.AccessLogging:
// nil when no Telemetry configures access logging and the mesh has no
// default provider (the mesh's accessLogFile applies); otherwise the
// merged providers (MergeLogs) that exist in the mesh and write access
// logs (a file, or Envoy's HTTP, TCP or OpenTelemetry log services;
// stackdriver's logs come with its metrics filter), disabled ones
// included. An empty result also leaves the legacy settings in force,
// as in Istio.
func (at *AppliedTelemetry) AccessLogging(pc *PushContext, mode WorkloadMode) []LoggingConfig {
	merged, ok := at.MergeLogs(pc.Mesh, mode)
	if !ok {
		return nil
	}
	out := []LoggingConfig{}
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		p := pc.ExtensionProvider(name)
		if !writesAccessLogs(p) {
			continue
		}
		out = append(out, LoggingConfig{Provider: p, Disabled: merged[name].Disabled, Filter: merged[name].Filter})
	}
	slices.SortStableFunc(out, func(a, b LoggingConfig) int { return strings.Compare(a.Provider.GetName(), b.Provider.GetName()) })
	return out
}

// writesAccessLogs reports whether an extension provider is an access
// log (Istio's telemetryAccessLog builds one for it).
func writesAccessLogs(p *meshv1alpha1.MeshConfig_ExtensionProvider) bool {
	switch p.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLog,
		*meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyHttpAls,
		*meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyTcpAls,
		*meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyOtelAls:
		return true
	}
	return false
}
