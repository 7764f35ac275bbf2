package translate

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	uuidv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/request_id/uuid/v3"
	resourcedetectorsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/tracers/opentelemetry/resource_detectors/v3"
	samplersv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/tracers/opentelemetry/samplers/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	tracingv3 "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	telemetry "istio.io/api/telemetry/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Tracing, as Istio's configureTracing (pilot/pkg/networking/core/
// tracing.go) sets it on every HTTP connection manager of a sidecar or
// gateway: from the Telemetry API when a Telemetry (or the mesh's
// defaultProviders) configures tracing, with the provider's tracer;
// else, when the mesh's enableTracing is on (Istio's default), sampling
// and tags only, the tracer being the one the proxy's bootstrap names
// (defaultConfig.tracing). The proxy's ProxyConfig is the mesh's
// defaultConfig (Flotilla does not read a pod's proxy.istio.io/config
// here).

// Envoy's tracer names.
const (
	zipkinTracer     = "envoy.tracers.zipkin"
	datadogTracer    = "envoy.tracers.datadog"
	skywalkingTracer = "envoy.tracers.skywalking"
	otelTracer       = "envoy.tracers.opentelemetry"
)

// defaultTraceSampling is the percentage of requests traced when nothing
// says otherwise (Istio's PILOT_TRACE_SAMPLING default).
const defaultTraceSampling = 1.0

// builtTracing is a side's tracing and request-ID settings.
type builtTracing struct {
	tracing *hcmv3.HttpConnectionManager_Tracing
	reqID   *hcmv3.RequestIDExtension
}

// setTracing sets an HTTP connection manager's tracing and request ID
// extension for side.
func (g *gen) setTracing(hcm *hcmv3.HttpConnectionManager, side model.WorkloadMode) {
	if !g.client.envoyTelemetry {
		return
	}
	if g.tel.tracing == nil {
		g.tel.tracing = map[model.WorkloadMode]builtTracing{}
	}
	b, ok := g.tel.tracing[side]
	if !ok {
		b = g.buildTracing(side)
		g.tel.tracing[side] = b
	}
	hcm.Tracing, hcm.RequestIdExtension = b.tracing, b.reqID
}

func (g *gen) buildTracing(side model.WorkloadMode) builtTracing {
	useRequestID := true
	reqID := func() *hcmv3.RequestIDExtension {
		return &hcmv3.RequestIDExtension{TypedConfig: g.pack(&uuidv3.UuidRequestIdConfig{UseRequestIdForTraceSampling: wrapperspb.Bool(useRequestID)})}
	}
	pcfg := g.pc.Mesh.GetDefaultConfig()
	tc := g.appliedTelemetry().MergeTracing(g.pc)
	if tc == nil {
		if !g.pc.Mesh.GetEnableTracing() {
			return builtTracing{reqID: reqID()}
		}
		t := &hcmv3.HttpConnectionManager_Tracing{}
		setSampling(t, proxyConfigSampling(pcfg))
		enableIstioTags := pcfg.GetTracing().GetEnableIstioTags() == nil || pcfg.GetTracing().GetEnableIstioTags().GetValue()
		t.CustomTags = g.traceTags(enableIstioTags, nil)
		if n := pcfg.GetTracing().GetMaxPathTagLength(); n != 0 {
			t.MaxPathTagLength = wrapperspb.UInt32(n)
		}
		return builtTracing{tracing: t, reqID: reqID()}
	}
	spec := tc.Server
	if side == model.ClientMode {
		spec = tc.Client
	}
	if spec.Disabled {
		return builtTracing{reqID: reqID()}
	}
	t, customSampler, err := g.tracer(spec.Provider)
	if err != nil {
		g.problem("Telemetry tracing: provider %q: %v; no tracing", spec.Provider.GetName(), err)
		return builtTracing{reqID: reqID()}
	}
	sampling := proxyConfigSampling(pcfg)
	switch {
	case customSampler:
		// The provider's sampler decides: every span reaches it.
		sampling = 100
	case spec.RandomSamplingPercentage != nil:
		sampling = *spec.RandomSamplingPercentage
	}
	setSampling(t, sampling)
	t.CustomTags = g.traceTags(spec.EnableIstioTags, spec.CustomTags)
	if t.GetMaxPathTagLength() == nil && pcfg.GetTracing().GetMaxPathTagLength() != 0 {
		t.MaxPathTagLength = wrapperspb.UInt32(pcfg.GetTracing().GetMaxPathTagLength())
	}
	t.NoContextPropagation = spec.DisableContextPropagation
	useRequestID = spec.UseRequestIDForTraceSampling
	return builtTracing{tracing: t, reqID: reqID()}
}

// setSampling traces random% of requests that carry no decision, and
// every request the client or a header forces (Istio's
// configureSampling).
func setSampling(t *hcmv3.HttpConnectionManager_Tracing, random float64) {
	t.ClientSampling = &typev3.Percent{Value: 100}
	t.OverallSampling = &typev3.Percent{Value: 100}
	t.RandomSampling = &typev3.Percent{Value: random}
}

// proxyConfigSampling is defaultConfig.tracing.sampling when set (above
// 100 means 1), else 1% (Istio's proxyConfigSamplingValue).
func proxyConfigSampling(pc *meshv1alpha1.ProxyConfig) float64 {
	s := pc.GetTracing().GetSampling()
	switch {
	case s == 0:
		return defaultTraceSampling
	case s > 100:
		return 1
	}
	return s
}

// traceTags are a span's tags, sorted by name (Istio's
// configureCustomTags): Istio's own (the workload's canonical service
// and revision, mesh, namespace and cluster, and the dry-run policies'
// decisions) unless turned off, then the Telemetry's custom tags, or
// without them defaultConfig.tracing's.
func (g *gen) traceTags(istioTags bool, custom map[string]*telemetry.Tracing_CustomTag) []*tracingv3.CustomTag {
	var tags []*tracingv3.CustomTag
	if istioTags {
		tags = append(tags, g.serviceTraceTags()...)
		for _, t := range []struct{ tag, key string }{
			{"istio.authorization.dry_run.allow_policy.name", authz.DryRunAllowPrefix + authz.ShadowEffectivePolicyID},
			{"istio.authorization.dry_run.allow_policy.result", authz.DryRunAllowPrefix + authz.ShadowEngineResult},
			{"istio.authorization.dry_run.deny_policy.name", authz.DryRunDenyPrefix + authz.ShadowEffectivePolicyID},
			{"istio.authorization.dry_run.deny_policy.result", authz.DryRunDenyPrefix + authz.ShadowEngineResult},
		} {
			tags = append(tags, &tracingv3.CustomTag{Tag: t.tag, Type: &tracingv3.CustomTag_Metadata_{Metadata: &tracingv3.CustomTag_Metadata{
				Kind: &metadatav3.MetadataKind{Kind: &metadatav3.MetadataKind_Request_{Request: &metadatav3.MetadataKind_Request{}}},
				MetadataKey: &metadatav3.MetadataKey{Key: rbacHTTPFilter, Path: []*metadatav3.MetadataKey_PathSegment{
					{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: t.key}},
				}},
			}}})
		}
	}
	if len(custom) > 0 {
		for _, name := range slices.Sorted(maps.Keys(custom)) {
			if t := telemetryTag(name, custom[name]); t != nil {
				tags = append(tags, t)
			}
		}
	} else {
		pt := g.pc.Mesh.GetDefaultConfig().GetTracing().GetCustomTags()
		for _, name := range slices.Sorted(maps.Keys(pt)) {
			if t := proxyConfigTag(name, pt[name]); t != nil {
				tags = append(tags, t)
			}
		}
	}
	slices.SortStableFunc(tags, func(a, b *tracingv3.CustomTag) int { return strings.Compare(a.GetTag(), b.GetTag()) })
	return tags
}

// serviceTraceTags name the workload (Istio's buildServiceTags), from
// its canonical-service labels and its node's metadata.
func (g *gen) serviceTraceTags() []*tracingv3.CustomTag {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	lit := func(tag, v string) *tracingv3.CustomTag {
		return &tracingv3.CustomTag{Tag: tag, Type: &tracingv3.CustomTag_Literal_{Literal: &tracingv3.CustomTag_Literal{Value: v}}}
	}
	rev, svc := canonicalTraceLabels(g.p)
	return []*tracingv3.CustomTag{
		lit("istio.canonical_revision", rev),
		lit("istio.canonical_service", svc),
		lit("istio.mesh_id", or(g.p.MeshID, "unknown")),
		lit("istio.namespace", or(g.p.Namespace, "default")),
		lit("istio.cluster_id", or(g.p.ClusterID, "unknown")),
	}
}

// traceIdentity is every value of the proxy's own that its tracing
// reads: proxies share outbound listeners only when theirs are equal
// (outboundSet), so one proxy's node never shapes another's spans.
func (g *gen) traceIdentity() string {
	rev, svc := canonicalTraceLabels(g.p)
	id := []string{strconv.Quote(rev), strconv.Quote(svc), strconv.Quote(g.p.MeshID), strconv.Quote(g.p.ClusterID), strconv.Quote(g.p.ServiceCluster)}
	// The pod's own name only when a tracer names spans after it.
	if slices.ContainsFunc(g.pc.Mesh.GetExtensionProviders(), func(p *meshv1alpha1.MeshConfig_ExtensionProvider) bool {
		return p.GetOpentelemetry().GetServiceAttributeEnrichment() == meshv1alpha1.MeshConfig_ExtensionProvider_OTEL_SEMANTIC_CONVENTIONS
	}) {
		id = append(id, strconv.Quote(otelServiceName(g.p)))
	}
	return strings.Join(id, "|")
}

// canonicalTraceLabels are the canonical revision and service a
// workload's spans name: its service.istio.io/canonical-* labels, else
// "latest" and "unknown".
func canonicalTraceLabels(p *model.Proxy) (revision, service string) {
	revision, service = p.Labels["service.istio.io/canonical-revision"], p.Labels["service.istio.io/canonical-name"]
	if revision == "" {
		revision = "latest"
	}
	if service == "" {
		service = "unknown"
	}
	return revision, service
}

func telemetryTag(name string, t *telemetry.Tracing_CustomTag) *tracingv3.CustomTag {
	out := &tracingv3.CustomTag{Tag: name}
	switch v := t.GetType().(type) {
	case *telemetry.Tracing_CustomTag_Environment:
		out.Type = &tracingv3.CustomTag_Environment_{Environment: &tracingv3.CustomTag_Environment{Name: v.Environment.GetName(), DefaultValue: v.Environment.GetDefaultValue()}}
	case *telemetry.Tracing_CustomTag_Header:
		out.Type = &tracingv3.CustomTag_RequestHeader{RequestHeader: &tracingv3.CustomTag_Header{Name: v.Header.GetName(), DefaultValue: v.Header.GetDefaultValue()}}
	case *telemetry.Tracing_CustomTag_Literal:
		out.Type = &tracingv3.CustomTag_Literal_{Literal: &tracingv3.CustomTag_Literal{Value: v.Literal.GetValue()}}
	case *telemetry.Tracing_CustomTag_Formatter:
		out.Type = &tracingv3.CustomTag_Value{Value: v.Formatter.GetValue()}
	default:
		return nil
	}
	return out
}

func proxyConfigTag(name string, t *meshv1alpha1.Tracing_CustomTag) *tracingv3.CustomTag {
	out := &tracingv3.CustomTag{Tag: name}
	switch v := t.GetType().(type) {
	case *meshv1alpha1.Tracing_CustomTag_Environment:
		out.Type = &tracingv3.CustomTag_Environment_{Environment: &tracingv3.CustomTag_Environment{Name: v.Environment.GetName(), DefaultValue: v.Environment.GetDefaultValue()}}
	case *meshv1alpha1.Tracing_CustomTag_Header:
		out.Type = &tracingv3.CustomTag_RequestHeader{RequestHeader: &tracingv3.CustomTag_Header{Name: v.Header.GetName(), DefaultValue: v.Header.GetDefaultValue()}}
	case *meshv1alpha1.Tracing_CustomTag_Literal:
		out.Type = &tracingv3.CustomTag_Literal_{Literal: &tracingv3.CustomTag_Literal{Value: v.Literal.GetValue()}}
	default:
		return nil
	}
	return out
}

// tracer is a provider's tracer (Istio's configureFromProviderConfig);
// customSampler reports that the provider samples itself.
func (g *gen) tracer(p *meshv1alpha1.MeshConfig_ExtensionProvider) (t *hcmv3.HttpConnectionManager_Tracing, customSampler bool, err error) {
	t = &hcmv3.HttpConnectionManager_Tracing{}
	if g.p.Type == model.RouterProxy {
		t.SpawnUpstreamSpan = wrapperspb.Bool(true)
	}
	var name string
	var maxTag uint32
	var cfg proto.Message
	switch prov := p.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_Zipkin:
		z := prov.Zipkin
		host, cluster, err := g.providerCluster(z.GetService(), z.GetPort())
		if err != nil {
			return nil, false, err
		}
		path := z.GetPath()
		if path == "" {
			path = "/api/v2/spans"
		}
		timeout := z.GetTimeout()
		if timeout == nil {
			timeout = durationpb.New(5 * time.Second)
		}
		zc := &tracev3.ZipkinConfig{
			CollectorEndpointVersion: tracev3.ZipkinConfig_HTTP_JSON,
			TraceId_128Bit:           !z.GetEnable_64BitTraceId(),
			SharedSpanContext:        wrapperspb.Bool(false),
			CollectorService: &corev3.HttpService{
				HttpUri:             &corev3.HttpUri{Uri: "http://" + host + path, HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: cluster}, Timeout: timeout},
				RequestHeadersToAdd: g.httpHeaders(z.GetHeaders()),
			},
		}
		if z.GetTraceContextOption() == meshv1alpha1.MeshConfig_ExtensionProvider_ZipkinTracingProvider_USE_B3_WITH_W3C_PROPAGATION {
			zc.TraceContextOption = tracev3.ZipkinConfig_USE_B3_WITH_W3C_PROPAGATION
		}
		name, maxTag, cfg = zipkinTracer, z.GetMaxTagLength(), zc
	case *meshv1alpha1.MeshConfig_ExtensionProvider_Datadog:
		d := prov.Datadog
		host, cluster, err := g.providerCluster(d.GetService(), d.GetPort())
		if err != nil {
			return nil, false, err
		}
		name, maxTag, cfg = datadogTracer, d.GetMaxTagLength(), &tracev3.DatadogConfig{CollectorCluster: cluster, ServiceName: g.p.ServiceCluster, CollectorHostname: host}
	case *meshv1alpha1.MeshConfig_ExtensionProvider_Skywalking:
		s := prov.Skywalking
		host, cluster, err := g.providerCluster(s.GetService(), s.GetPort())
		if err != nil {
			return nil, false, err
		}
		t.SpawnUpstreamSpan = wrapperspb.Bool(true)
		name, cfg = skywalkingTracer, &tracev3.SkyWalkingConfig{GrpcService: envoyGRPC(cluster, host)}
	case *meshv1alpha1.MeshConfig_ExtensionProvider_Opentelemetry:
		oc, sampler, err := g.otelTracer(prov.Opentelemetry)
		if err != nil {
			return nil, false, err
		}
		name, maxTag, cfg, customSampler = otelTracer, prov.Opentelemetry.GetMaxTagLength(), oc, sampler
	default:
		return nil, false, fmt.Errorf("a %s provider does not trace", providerKind(p))
	}
	t.Provider = &tracev3.Tracing_Http{Name: name, ConfigType: &tracev3.Tracing_Http_TypedConfig{TypedConfig: g.pack(cfg)}}
	if maxTag != 0 {
		t.MaxPathTagLength = wrapperspb.UInt32(maxTag)
	}
	return t, customSampler, nil
}

// otelTracer is Istio's otelConfig: OTLP over gRPC, or over HTTP when
// the provider says http; the resource detectors it names; Dynatrace's
// sampler.
func (g *gen) otelTracer(o *meshv1alpha1.MeshConfig_ExtensionProvider_OpenTelemetryTracingProvider) (*tracev3.OpenTelemetryConfig, bool, error) {
	host, cluster, err := g.providerCluster(o.GetService(), o.GetPort())
	if err != nil {
		return nil, false, err
	}
	oc := &tracev3.OpenTelemetryConfig{ServiceName: g.p.ServiceCluster}
	if o.GetServiceAttributeEnrichment() == meshv1alpha1.MeshConfig_ExtensionProvider_OTEL_SEMANTIC_CONVENTIONS {
		oc.ServiceName = otelServiceName(g.p)
	}
	if h := o.GetHttp(); h != nil {
		uri, err := url.JoinPath(host, h.GetPath())
		if err != nil {
			return nil, false, fmt.Errorf("http path %q: %w", h.GetPath(), err)
		}
		oc.HttpService = &corev3.HttpService{
			HttpUri:             &corev3.HttpUri{Uri: uri, HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: cluster}, Timeout: h.GetTimeout()},
			RequestHeadersToAdd: g.httpHeaders(h.GetHeaders()),
		}
	} else {
		gs := envoyGRPC(cluster, host)
		gs.Timeout = o.GetGrpc().GetTimeout()
		for _, m := range o.GetGrpc().GetInitialMetadata() {
			gs.InitialMetadata = append(gs.InitialMetadata, &corev3.HeaderValue{Key: m.GetName(), Value: m.GetValue()})
		}
		oc.GrpcService = gs
	}
	env := o.GetResourceDetectors().GetEnvironment() != nil || o.GetServiceAttributeEnrichment() == meshv1alpha1.MeshConfig_ExtensionProvider_OTEL_SEMANTIC_CONVENTIONS
	if env {
		oc.ResourceDetectors = append(oc.ResourceDetectors, &corev3.TypedExtensionConfig{
			Name: "envoy.tracers.opentelemetry.resource_detectors.environment", TypedConfig: g.pack(&resourcedetectorsv3.EnvironmentResourceDetectorConfig{}),
		})
	}
	if o.GetResourceDetectors().GetDynatrace() != nil {
		oc.ResourceDetectors = append(oc.ResourceDetectors, &corev3.TypedExtensionConfig{
			Name: "envoy.tracers.opentelemetry.resource_detectors.dynatrace", TypedConfig: g.pack(&resourcedetectorsv3.DynatraceResourceDetectorConfig{}),
		})
	}
	if o.GetSampling() == nil {
		return oc, false, nil
	}
	if d := o.GetDynatraceSampler(); d != nil {
		dsc := &samplersv3.DynatraceSamplerConfig{Tenant: d.GetTenant(), ClusterId: d.GetClusterId(), RootSpansPerMinute: d.GetRootSpansPerMinute()}
		if api := d.GetHttpService(); api != nil {
			dtHost, dtCluster, err := g.providerCluster(api.GetService(), api.GetPort())
			if err != nil {
				return nil, false, fmt.Errorf("dynatrace sampler: %w", err)
			}
			uri, err := url.JoinPath(dtHost, api.GetHttp().GetPath())
			if err != nil {
				return nil, false, fmt.Errorf("dynatrace sampler path: %w", err)
			}
			dsc.HttpService = &corev3.HttpService{
				HttpUri:             &corev3.HttpUri{Uri: uri, HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: dtCluster}, Timeout: api.GetHttp().GetTimeout()},
				RequestHeadersToAdd: g.httpHeaders(api.GetHttp().GetHeaders()),
			}
		} else {
			h := o.GetHttp()
			if h == nil {
				return nil, false, fmt.Errorf("the dynatrace sampler needs the provider's http settings or its own httpService")
			}
			uri, err := url.JoinPath(host, "api/v2/samplingConfiguration")
			if err != nil {
				return nil, false, err
			}
			dsc.HttpService = &corev3.HttpService{
				HttpUri:             &corev3.HttpUri{Uri: uri, HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: cluster}, Timeout: h.GetTimeout()},
				RequestHeadersToAdd: g.httpHeaders(h.GetHeaders()),
			}
		}
		oc.Sampler = &corev3.TypedExtensionConfig{Name: "envoy.tracers.opentelemetry.samplers.dynatrace", TypedConfig: g.pack(dsc)}
	}
	return oc, true, nil
}

// otelServiceName is service.name by OpenTelemetry's Kubernetes
// conventions, as far as the node says (Istio's otelServiceName): the
// app.kubernetes.io/instance label, the app.kubernetes.io/name label,
// the pod's name, else unknown_service.
func otelServiceName(p *model.Proxy) string {
	for _, l := range []string{"app.kubernetes.io/instance", "app.kubernetes.io/name"} {
		if v := p.Labels[l]; v != "" {
			return v
		}
	}
	if pod, _, ok := strings.Cut(p.ID, "."); ok && pod != "" {
		return pod
	}
	return "unknown_service"
}

func envoyGRPC(cluster, authority string) *corev3.GrpcService {
	return &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: authority}}}
}

// httpHeaders are a provider's headers to add, each replacing one of its
// name. A header whose value Istio takes from istiod's environment
// (envName) is left out and reported: discovery hands none of its
// environment to proxies.
func (g *gen) httpHeaders(hs []*meshv1alpha1.MeshConfig_ExtensionProvider_HttpHeader) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for _, h := range hs {
		if h.GetEnvName() != "" {
			g.problem("tracing provider header %q: a value from the control plane's environment (envName) is not supported; header left out", h.GetName())
			continue
		}
		out = append(out, &corev3.HeaderValueOption{
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
			Header:       &corev3.HeaderValue{Key: h.GetName(), Value: h.GetValue()},
		})
	}
	return out
}

// providerKind names an extension provider's kind, as its YAML field.
func providerKind(p *meshv1alpha1.MeshConfig_ExtensionProvider) string {
	if p.GetProvider() == nil {
		return "kindless"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", p.GetProvider()), "*v1alpha1.MeshConfig_ExtensionProvider_")
}
