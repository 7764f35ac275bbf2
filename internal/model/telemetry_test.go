package model

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	telemetry "istio.io/api/telemetry/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// telemetryObj is a Telemetry of a test: its namespace and spec (YAML).
type telemetryObj struct{ ns, spec string }

// telemetryPush builds a push context of the Telemetries, created in the
// order given, on Istio's default mesh plus an "envoy-json" file
// provider and the given default providers.
func telemetryPush(t *testing.T, mesh func(*meshv1alpha1.MeshConfig), objs ...telemetryObj) *PushContext {
	t.Helper()
	m, err := istio.ParseMeshConfig([]byte("extensionProviders:\n- name: envoy-json\n  envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {}}}\n" +
		"- name: zipkin\n  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}\n" +
		"- name: otel\n  opentelemetry: {service: otel.istio-system.svc.cluster.local, port: 4317}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if mesh != nil {
		mesh(m)
	}
	s := NewStore()
	s.PutMesh(m)
	k, _ := istio.ByName(istio.Telemetry)
	for i, o := range objs {
		spec := &telemetry.Telemetry{}
		if err := istio.DecodeProtoYAML([]byte(o.spec), spec); err != nil {
			t.Fatalf("telemetry %d: %v", i, err)
		}
		s.PutObject(&istio.Object{Kind: k, Spec: spec, Meta: istio.Meta{
			Namespace: o.ns, Name: fmt.Sprintf("t%d", i), CreationTime: time.Unix(int64(1000+i), 0),
		}})
	}
	pc, _ := s.Build(BuildOptions{}, nil, 1)
	return pc
}

func defaultAccessLogging(names ...string) func(*meshv1alpha1.MeshConfig) {
	return func(m *meshv1alpha1.MeshConfig) {
		m.DefaultProviders = &meshv1alpha1.MeshConfig_DefaultProviders{AccessLogging: names}
	}
}

// The cases of Istio's TestAccessLogging (pilot/pkg/model/
// telemetry_logging_test.go), for a sidecar in "default" labelled
// app=test: which providers log, by mode, through applicableTelemetries,
// mergeLogs and AccessLogging.
func TestAccessLoggingProvidersFollowIstiosMergeLogs(t *testing.T) {
	const (
		envoy  = "accessLogging: [{providers: [{name: envoy}]}]"
		client = "accessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}]}]"
		server = "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}]"
		both   = "accessLogging: [{match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}]}]"
		json   = "accessLogging: [{providers: [{name: envoy-json}]}]"
	)
	root, ns := "istio-system", "default"
	none := []string{}
	for _, tt := range []struct {
		name     string
		mesh     func(*meshv1alpha1.MeshConfig)
		objs     []telemetryObj
		mode     WorkloadMode
		want     []string
		byLegacy bool
	}{
		{name: "no Telemetry: the legacy settings", byLegacy: true},
		{name: "a metrics-only Telemetry mesh-wide: the legacy settings", objs: []telemetryObj{{root, "metrics: [{providers: [{name: prometheus}]}]"}}, byLegacy: true},
		{name: "a metrics-only Telemetry for the workload: the legacy settings", objs: []telemetryObj{{ns, "selector: {matchLabels: {app: test}}\nmetrics: [{providers: [{name: prometheus}]}]"}}, byLegacy: true},
		{name: "default provider only", mesh: defaultAccessLogging("envoy"), want: []string{"envoy"}},
		{name: "provider only", objs: []telemetryObj{{root, envoy}}, want: []string{"envoy"}},
		{name: "client - outbound", objs: []telemetryObj{{root, client}}, want: []string{"envoy"}},
		{name: "client - inbound", objs: []telemetryObj{{root, client}}, mode: ServerMode, want: none},
		{name: "client - disabled server", objs: []telemetryObj{{root, client}, {ns, "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}], disabled: true}]"}}, want: []string{"envoy"}},
		{name: "client - disabled client", objs: []telemetryObj{{root, client}, {ns, "accessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}], disabled: true}]"}}, want: none},
		{name: "client - disabled - enabled for the workload", objs: []telemetryObj{
			{root, client},
			{ns, "accessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}], disabled: true}]"},
			{ns, "selector: {matchLabels: {app: test}}\n" + client},
		}, want: []string{"envoy"}},
		{name: "server - inbound", objs: []telemetryObj{{root, server}}, mode: ServerMode, want: []string{"envoy"}},
		{name: "server - outbound", objs: []telemetryObj{{root, server}}, want: none},
		{name: "server and client - inbound", objs: []telemetryObj{{root, both}}, mode: ServerMode, want: []string{"envoy"}},
		{name: "server and client - outbound", objs: []telemetryObj{{root, both}}, want: []string{"envoy"}},
		{name: "override default", mesh: defaultAccessLogging("stackdriver"), objs: []telemetryObj{{root, envoy}}, want: []string{"envoy"}},
		{name: "override namespace", objs: []telemetryObj{{root, envoy}, {ns, json}}, want: []string{"envoy-json"}},
		{name: "empty config inherits", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{}]"}}, want: []string{"envoy"}},
		{name: "stackdriver writes no Envoy access log", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{providers: [{name: stackdriver}]}]"}}, want: none},
		{name: "default envoy JSON", objs: []telemetryObj{{root, json}}, want: []string{"envoy-json"}},
		{name: "disable config", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{disabled: true}]"}}, want: none},
		{name: "disable default", mesh: defaultAccessLogging("envoy"), objs: []telemetryObj{{ns, "accessLogging: [{disabled: true}]"}}, want: none},
		{name: "non existing", mesh: defaultAccessLogging("envoy"), objs: []telemetryObj{{ns, "accessLogging: [{providers: [{name: custom-provider}]}]"}}, want: none},
		{name: "server - multi filters", objs: []telemetryObj{{root, "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}]}]"}}, mode: ServerMode, want: []string{"envoy"}},
		{name: "server - multi filters disabled", objs: []telemetryObj{{root, "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}], disabled: true}]"}}, mode: ServerMode, want: none},
		{name: "multi accesslogging", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{providers: [{name: envoy}]}, {providers: [{name: envoy-json}]}]"}}, want: []string{"envoy", "envoy-json"}},
		{name: "multi accesslogging with disabled", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{providers: [{name: envoy}]}, {providers: [{name: envoy-json}], disabled: true}]"}}, want: []string{"envoy"}},
		{name: "multi accesslogging - multi providers", objs: []telemetryObj{{root, envoy}, {ns, "accessLogging: [{providers: [{name: envoy}, {name: envoy-json}]}, {providers: [{name: envoy}]}]"}}, want: []string{"envoy", "envoy-json"}},
		{name: "server and client different - inbound", objs: []telemetryObj{{root, "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT}, providers: [{name: envoy-json}]}]"}}, mode: ServerMode, want: []string{"envoy"}},
		{name: "server and client different - outbound", objs: []telemetryObj{{root, "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT}, providers: [{name: envoy-json}]}]"}}, want: []string{"envoy-json"}},
		{name: "a targetRef Telemetry attaches to no sidecar", objs: []telemetryObj{{ns, "targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]\n" + client}}, byLegacy: true},
		{name: "another namespace's Telemetry does not apply", objs: []telemetryObj{{"other", envoy}}, byLegacy: true},
		{name: "a selector that does not match does not apply", objs: []telemetryObj{{ns, "selector: {matchLabels: {app: other}}\n" + envoy}}, byLegacy: true},
		{name: "the root namespace's selector Telemetries apply only there", objs: []telemetryObj{{root, "selector: {matchLabels: {app: test}}\n" + envoy}}, byLegacy: true},
		{name: "the oldest namespace-wide Telemetry wins", objs: []telemetryObj{{ns, json}, {ns, envoy}}, want: []string{"envoy-json"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pc := telemetryPush(t, tt.mesh, tt.objs...)
			mode := tt.mode
			if mode == 0 {
				mode = ClientMode
			}
			cfgs := pc.ProxyTelemetry(ns, map[string]string{"app": "test"}).AccessLogging(pc, mode)
			if tt.byLegacy {
				if cfgs != nil {
					t.Fatalf("got %v, want the legacy settings (nil)", cfgs)
				}
				return
			}
			got := []string{}
			for _, c := range cfgs {
				if !c.Disabled {
					got = append(got, c.Provider.GetName())
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// Istio's TestAccessLoggingWithFilter: a rule's filter goes with its
// provider; a later level's rule replaces it.
func TestAnAccessLogFilterIsTheLastRuleOfItsProvider(t *testing.T) {
	pc := telemetryPush(t, nil,
		telemetryObj{"istio-system", "accessLogging: [{providers: [{name: envoy}], filter: {expression: 'response.code >= 400'}}]"},
		telemetryObj{"default", "accessLogging: [{providers: [{name: envoy}], filter: {expression: 'response.code >= 500'}}]"},
	)
	cfgs := pc.ProxyTelemetry("default", nil).AccessLogging(pc, ClientMode)
	if len(cfgs) != 1 || cfgs[0].Filter.GetExpression() != "response.code >= 500" {
		t.Fatalf("got %+v", cfgs)
	}
	cfgs = pc.ProxyTelemetry("elsewhere", nil).AccessLogging(pc, ClientMode)
	if len(cfgs) != 1 || cfgs[0].Filter.GetExpression() != "response.code >= 400" {
		t.Fatalf("got %+v", cfgs)
	}
}

// The cases of Istio's TestTracing (pilot/pkg/model/telemetry_test.go).
func TestTracingFollowsIstiosTelemetriesTracing(t *testing.T) {
	defaultTracing := func(names ...string) func(*meshv1alpha1.MeshConfig) {
		return func(m *meshv1alpha1.MeshConfig) {
			m.DefaultProviders = &meshv1alpha1.MeshConfig_DefaultProviders{Tracing: names}
		}
	}
	f := func(v float64) *float64 { return &v }
	root, ns := "istio-system", "default"
	type side struct {
		provider string
		disabled bool
		sampling *float64
		reqID    bool
		tags     []string
	}
	on := func(p string) side { return side{provider: p, reqID: true} }
	for _, tt := range []struct {
		name           string
		mesh           func(*meshv1alpha1.MeshConfig)
		objs           []telemetryObj
		none           bool
		client, server side
	}{
		{name: "empty", none: true},
		{name: "default provider only", mesh: defaultTracing("zipkin"), client: on("zipkin"), server: on("zipkin")},
		{name: "only the first default provider", mesh: defaultTracing("zipkin", "otel"), client: on("zipkin"), server: on("zipkin")},
		{name: "provider only", objs: []telemetryObj{{root, "tracing: [{providers: [{name: zipkin}]}]"}}, client: on("zipkin"), server: on("zipkin")},
		{
			name: "no provider: disabled", objs: []telemetryObj{{root, "tracing: [{randomSamplingPercentage: 10}]"}},
			client: side{disabled: true, sampling: f(10), reqID: true}, server: side{disabled: true, sampling: f(10), reqID: true},
		},
		{
			name: "an unknown provider: disabled", objs: []telemetryObj{{root, "tracing: [{providers: [{name: nope}]}]"}},
			client: side{disabled: true, reqID: true}, server: side{disabled: true, reqID: true},
		},
		{
			name: "override sampling", mesh: defaultTracing("zipkin"), objs: []telemetryObj{{root, "tracing: [{randomSamplingPercentage: 50}]"}},
			client: side{provider: "zipkin", sampling: f(50), reqID: true}, server: side{provider: "zipkin", sampling: f(50), reqID: true},
		},
		{
			name: "namespace overrides root", objs: []telemetryObj{{root, "tracing: [{providers: [{name: zipkin}], randomSamplingPercentage: 50}]"}, {ns, "tracing: [{providers: [{name: otel}]}]"}},
			client: side{provider: "otel", sampling: f(50), reqID: true}, server: side{provider: "otel", sampling: f(50), reqID: true},
		},
		{
			name: "client only", objs: []telemetryObj{{root, "tracing: [{match: {mode: CLIENT}, providers: [{name: zipkin}]}]"}},
			client: on("zipkin"), server: side{disabled: true, reqID: true},
		},
		{
			name: "server only, disabled span reporting", mesh: defaultTracing("zipkin"), objs: []telemetryObj{{root, "tracing: [{match: {mode: SERVER}, disableSpanReporting: true}]"}},
			client: on("zipkin"), server: side{provider: "zipkin", disabled: true, reqID: true},
		},
		{name: "custom tags are replaced, not merged", mesh: defaultTracing("zipkin"), objs: []telemetryObj{
			{root, "tracing: [{customTags: {a: {literal: {value: x}}, b: {literal: {value: y}}}}]"},
			{ns, "tracing: [{customTags: {c: {environment: {name: E}}}, useRequestIdForTraceSampling: false}]"},
		}, client: side{provider: "zipkin", tags: []string{"c"}}, server: side{provider: "zipkin", tags: []string{"c"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pc := telemetryPush(t, tt.mesh, tt.objs...)
			got := pc.ProxyTelemetry(ns, nil).MergeTracing(pc)
			if tt.none {
				if got != nil {
					t.Fatalf("got %+v, want nil (the legacy settings)", got)
				}
				return
			}
			if got == nil {
				t.Fatal("got nil")
			}
			toSide := func(s TracingSpec) side {
				out := side{provider: s.Provider.GetName(), disabled: s.Disabled, sampling: s.RandomSamplingPercentage, reqID: s.UseRequestIDForTraceSampling}
				for k := range s.CustomTags {
					out.tags = append(out.tags, k)
				}
				slices.Sort(out.tags)
				return out
			}
			if c := toSide(got.Client); !reflect.DeepEqual(c, tt.client) {
				t.Errorf("client = %+v, want %+v", c, tt.client)
			}
			if s := toSide(got.Server); !reflect.DeepEqual(s, tt.server) {
				t.Errorf("server = %+v, want %+v", s, tt.server)
			}
			if !got.Client.EnableIstioTags || !got.Server.EnableIstioTags {
				t.Error("Istio's tags are on unless a rule turns them off")
			}
		})
	}
}

// The merge cases of Istio's TestTelemetryFilters and mergeMetrics.
func TestMetricsFollowIstiosMergeMetrics(t *testing.T) {
	root, ns := "istio-system", "default"
	defaultMetrics := func(m *meshv1alpha1.MeshConfig) {
		m.DefaultProviders = &meshv1alpha1.MeshConfig_DefaultProviders{Metrics: []string{"prometheus"}}
	}
	for _, tt := range []struct {
		name string
		mesh func(*meshv1alpha1.MeshConfig)
		objs []telemetryObj
		want map[string]MetricsConfig
	}{
		{name: "nothing: no metrics", want: map[string]MetricsConfig{}},
		{name: "the default provider", mesh: defaultMetrics, want: map[string]MetricsConfig{"prometheus": {}}},
		{name: "a provider named", objs: []telemetryObj{{root, "metrics: [{providers: [{name: prometheus}]}]"}}, want: map[string]MetricsConfig{"prometheus": {}}},
		{name: "disable all metrics on the server side", mesh: defaultMetrics, objs: []telemetryObj{
			{root, "metrics: [{overrides: [{match: {metric: ALL_METRICS, mode: SERVER}, disabled: true}]}]"},
		}, want: map[string]MetricsConfig{"prometheus": {Server: MetricsSide{Disabled: true}}}},
		{name: "disabled all at the root, one enabled again in the namespace", mesh: defaultMetrics, objs: []telemetryObj{
			{root, "metrics: [{overrides: [{disabled: true}]}]"},
			{ns, "metrics: [{overrides: [{match: {metric: REQUEST_COUNT}, disabled: false}]}]"},
		}, want: map[string]MetricsConfig{"prometheus": {
			Client: MetricsSide{Overrides: []MetricOverride{{Name: "REQUEST_COUNT"}}},
			Server: MetricsSide{Overrides: []MetricOverride{{Name: "REQUEST_COUNT"}}},
		}}},
		{name: "tag overrides merge by tag, later wins, sorted", mesh: defaultMetrics, objs: []telemetryObj{
			{root, "metrics: [{overrides: [{match: {metric: REQUEST_COUNT, mode: CLIENT}, tagOverrides: {b: {value: x}, a: {operation: REMOVE}}}]}]"},
			{ns, "metrics: [{overrides: [{match: {metric: REQUEST_COUNT, mode: CLIENT}, tagOverrides: {b: {value: y}}}], reportingInterval: 10s}]"},
		}, want: map[string]MetricsConfig{"prometheus": {
			Client: MetricsSide{Overrides: []MetricOverride{{Name: "REQUEST_COUNT", Tags: []TagOverride{{Name: "a", Remove: true}, {Name: "b", Value: "y"}}}}},
		}}},
		{name: "a custom metric", mesh: defaultMetrics, objs: []telemetryObj{
			{root, "metrics: [{overrides: [{match: {customMetric: my_metric}, disabled: true}]}]"},
		}, want: map[string]MetricsConfig{"prometheus": {
			Client: MetricsSide{Overrides: []MetricOverride{{Name: "my_metric", Disabled: true}}},
			Server: MetricsSide{Overrides: []MetricOverride{{Name: "my_metric", Disabled: true}}},
		}}},
		{name: "a lower level's providers replace the parent's", mesh: defaultMetrics, objs: []telemetryObj{
			{ns, "metrics: [{providers: [{name: stackdriver}]}]"},
		}, want: map[string]MetricsConfig{"stackdriver": {}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pc := telemetryPush(t, tt.mesh, tt.objs...)
			got := pc.ProxyTelemetry(ns, nil).MergeMetrics(pc.Mesh)
			for p, c := range got {
				c.ReportingInterval = nil
				got[p] = c
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestAMetricsReportingIntervalIsTheLastGiven(t *testing.T) {
	pc := telemetryPush(t, nil,
		telemetryObj{"istio-system", "metrics: [{providers: [{name: prometheus}], reportingInterval: 5s}]"},
		telemetryObj{"default", "metrics: [{reportingInterval: 15s}]"})
	got := pc.ProxyTelemetry("default", nil).MergeMetrics(pc.Mesh)
	if d := got["prometheus"].ReportingInterval.AsDuration(); d != 15*time.Second {
		t.Fatalf("interval = %v, want 15s", d)
	}
}

func TestAllMetricsAreTheStandardOnes(t *testing.T) {
	all := allMetrics()
	if slices.Contains(all, "ALL_METRICS") || !slices.Contains(all, "REQUEST_COUNT") || !slices.IsSorted(all) {
		t.Fatalf("allMetrics = %v", all)
	}
}
