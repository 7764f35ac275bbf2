package translate

import (
	"maps"
	"slices"
	"strings"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filealv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	celv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	grpcalv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	otelalv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/open_telemetry/v3"
	reqwithoutqueryv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/req_without_query/v3"
	otlpcommon "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Access logs, as Istio's AccessLogBuilder (pilot/pkg/networking/core/
// accesslog.go) and telemetryAccessLog (pilot/pkg/model/
// telemetry_logging.go) make them: from the Telemetry API when a
// Telemetry (or the mesh's defaultProviders) configures access logging
// for the listener's side, else from the mesh's accessLogFile,
// accessLogFormat and accessLogEncoding.

// Envoy's names of the access loggers and filters Istio configures.
const (
	fileAccessLog      = "envoy.access_loggers.file"
	httpGRPCAccessLog  = "envoy.access_loggers.http_grpc"
	tcpGRPCAccessLog   = "envoy.tcp_grpc_access_log"
	otelAccessLog      = "envoy.access_loggers.open_telemetry"
	celAccessLogFilter = "envoy.access_loggers.extension_filters.cel"
	reqWithoutQuery    = "envoy.formatter.req_without_query"
)

// EnvoyTextLogFormat is Istio's access log format (EnvoyTextLogFormat,
// Istio 1.9 onwards).
const EnvoyTextLogFormat = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% " +
	"%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% " +
	"%RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% " +
	"\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% " +
	"%DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" " +
	"\"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" " +
	"%UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% " +
	"%DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"

// envoyJSONLogFormat is Istio's JSON access log (EnvoyJSONLogFormatIstio).
func envoyJSONLogFormat() *structpb.Struct {
	fields := map[string]string{
		"start_time":                        "%START_TIME%",
		"route_name":                        "%ROUTE_NAME%",
		"method":                            "%REQ(:METHOD)%",
		"path":                              "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
		"protocol":                          "%PROTOCOL%",
		"response_code":                     "%RESPONSE_CODE%",
		"response_flags":                    "%RESPONSE_FLAGS%",
		"response_code_details":             "%RESPONSE_CODE_DETAILS%",
		"connection_termination_details":    "%CONNECTION_TERMINATION_DETAILS%",
		"bytes_received":                    "%BYTES_RECEIVED%",
		"bytes_sent":                        "%BYTES_SENT%",
		"duration":                          "%DURATION%",
		"upstream_service_time":             "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
		"x_forwarded_for":                   "%REQ(X-FORWARDED-FOR)%",
		"user_agent":                        "%REQ(USER-AGENT)%",
		"request_id":                        "%REQ(X-REQUEST-ID)%",
		"authority":                         "%REQ(:AUTHORITY)%",
		"upstream_host":                     "%UPSTREAM_HOST%",
		"upstream_cluster":                  "%UPSTREAM_CLUSTER_RAW%",
		"upstream_local_address":            "%UPSTREAM_LOCAL_ADDRESS%",
		"downstream_local_address":          "%DOWNSTREAM_LOCAL_ADDRESS%",
		"downstream_remote_address":         "%DOWNSTREAM_REMOTE_ADDRESS%",
		"requested_server_name":             "%REQUESTED_SERVER_NAME%",
		"upstream_transport_failure_reason": "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
	}
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range fields {
		s.Fields[k] = structpb.NewStringValue(v)
	}
	return s
}

// Filter state the peer-metadata filters leave, logged by the gRPC log
// services (Istio's envoyStateToLog and envoyWasmStateToLog).
var (
	peerStateToLog     = []string{"upstream_peer", "downstream_peer"}
	peerWasmStateToLog = []string{"upstream_peer", "downstream_peer", "wasm.upstream_peer", "wasm.upstream_peer_id", "wasm.downstream_peer", "wasm.downstream_peer_id"}
)

// logLayer is where on a listener an access log goes: in its network or
// HTTP filter (connection managers and TCP proxies), or on the listener
// itself, which logs only connections no filter chain took (Envoy's NR
// flag; Istio's listenerAccessLogFilter).
type logLayer int

const (
	httpLog logLayer = iota // HTTP connection managers
	tcpLog                  // TCP proxies
	listenerLog
)

// accessLogs are the access logs of one side's filters or listeners,
// built once per generator.
func (g *gen) accessLogs(side model.WorkloadMode, layer logLayer) []*accesslogv3.AccessLog {
	if !g.client.envoyTelemetry {
		return nil
	}
	if layer == listenerLog && g.pc.Mesh.GetDisableEnvoyListenerLog() {
		return nil
	}
	key := [2]int{int(side), int(layer)}
	if als, ok := g.tel.logs[key]; ok {
		return als
	}
	var filter *accesslogv3.AccessLogFilter
	if layer == listenerLog {
		filter = &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ResponseFlagFilter{
			ResponseFlagFilter: &accesslogv3.ResponseFlagFilter{Flags: []string{"NR"}},
		}}
	}
	als := g.telemetryAccessLogs(side, filter)
	if als == nil {
		als = g.meshAccessLogs(layer, filter)
	}
	if g.tel.logs == nil {
		g.tel.logs = map[[2]int][]*accesslogv3.AccessLog{}
	}
	g.tel.logs[key] = als
	return als
}

// telemetryAccessLogs are the Telemetry API's access logs for a side;
// nil when it configures none that could be built (Istio's
// buildAccessLogFromTelemetry, after AccessLogging).
func (g *gen) telemetryAccessLogs(side model.WorkloadMode, filter *accesslogv3.AccessLogFilter) []*accesslogv3.AccessLog {
	cfgs := g.appliedTelemetry().AccessLogging(g.pc, side)
	var out []*accesslogv3.AccessLog
	built := false
	for _, c := range cfgs {
		al := g.providerAccessLog(c.Provider)
		if al == nil {
			continue
		}
		built = true
		if c.Disabled {
			continue
		}
		filters := []*accesslogv3.AccessLogFilter{}
		if filter != nil {
			filters = append(filters, filter)
		}
		if c.Filter != nil {
			filters = append(filters, &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_ExtensionFilter{
				ExtensionFilter: &accesslogv3.ExtensionFilter{
					Name:       celAccessLogFilter,
					ConfigType: &accesslogv3.ExtensionFilter_TypedConfig{TypedConfig: g.pack(&celv3.ExpressionFilter{Expression: c.Filter.GetExpression()})},
				},
			}})
		}
		out = append(out, &accesslogv3.AccessLog{Name: al.GetName(), ConfigType: al.GetConfigType(), Filter: andFilter(filters)})
	}
	if !built {
		return nil
	}
	if out == nil {
		out = []*accesslogv3.AccessLog{}
	}
	return out
}

// andFilter is Istio's buildAccessLogFilter: none, the one, or all of
// them.
func andFilter(fs []*accesslogv3.AccessLogFilter) *accesslogv3.AccessLogFilter {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	return &accesslogv3.AccessLogFilter{FilterSpecifier: &accesslogv3.AccessLogFilter_AndFilter{AndFilter: &accesslogv3.AndFilter{Filters: fs}}}
}

// meshAccessLogs are the mesh configuration's access logs (Istio's
// AccessLogBuilder without a Telemetry): a file when accessLogFile is
// set, then, with enableEnvoyAccessLogService, Envoy's gRPC access log
// to the envoy_accesslog_service cluster, which the agent writes into
// the bootstrap from the proxy config's envoyAccessLogService — HTTP on
// connection managers, TCP on TCP proxies and on the listener (Istio's
// httpGrpcAccessLog and tcpGrpcAccessLog). A proxy whose proxy config
// names no such service has no cluster to send to: reported, left out
// (Envoy would refuse the listener).
func (g *gen) meshAccessLogs(layer logLayer, filter *accesslogv3.AccessLogFilter) []*accesslogv3.AccessLog {
	var out []*accesslogv3.AccessLog
	if path := g.pc.Mesh.GetAccessLogFile(); path != "" {
		al := g.meshFileAccessLog(path)
		al.Filter = filter
		out = append(out, al)
	}
	if g.pc.Mesh.GetEnableEnvoyAccessLogService() {
		if !g.meshALS() {
			g.problem("mesh enableEnvoyAccessLogService: the proxy config names no envoyAccessLogService, so the bootstrap has no %s cluster; the gRPC access log is left out", proxycontract.AccessLogServiceCluster)
		} else {
			out = append(out, g.meshGRPCAccessLog(layer, filter))
		}
	}
	return out
}

// meshALS says whether the proxy's bootstrap has the
// envoy_accesslog_service cluster (its proxy config names the service).
func (g *gen) meshALS() bool {
	return g.pc.Mesh.GetEnableEnvoyAccessLogService() && g.p.EffectiveProxyConfig(g.pc.Mesh).GetEnvoyAccessLogService().GetAddress() != ""
}

// meshGRPCAccessLog is Istio's httpGrpcAccessLog (connection managers)
// or tcpGrpcAccessLog (TCP proxies; the listener's with its log name and
// filter).
func (g *gen) meshGRPCAccessLog(layer logLayer, filter *accesslogv3.AccessLogFilter) *accesslogv3.AccessLog {
	common := func(logName string) *grpcalv3.CommonGrpcAccessLogConfig {
		return &grpcalv3.CommonGrpcAccessLogConfig{
			LogName: logName,
			GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: proxycontract.AccessLogServiceCluster},
			}},
			TransportApiVersion:     corev3.ApiVersion_V3,
			FilterStateObjectsToLog: peerWasmStateToLog,
		}
	}
	switch layer {
	case httpLog:
		return &accesslogv3.AccessLog{Name: httpGRPCAccessLog, ConfigType: &accesslogv3.AccessLog_TypedConfig{
			TypedConfig: g.pack(&grpcalv3.HttpGrpcAccessLogConfig{CommonConfig: common("http_envoy_accesslog")}),
		}}
	case listenerLog:
		return &accesslogv3.AccessLog{Name: tcpGRPCAccessLog, Filter: filter, ConfigType: &accesslogv3.AccessLog_TypedConfig{
			TypedConfig: g.pack(&grpcalv3.TcpGrpcAccessLogConfig{CommonConfig: common("listener_envoy_accesslog")}),
		}}
	default:
		return &accesslogv3.AccessLog{Name: tcpGRPCAccessLog, ConfigType: &accesslogv3.AccessLog_TypedConfig{
			TypedConfig: g.pack(&grpcalv3.TcpGrpcAccessLogConfig{CommonConfig: common("tcp_envoy_accesslog")}),
		}}
	}
}

// meshFileAccessLog writes to path in the mesh's accessLogFormat and
// accessLogEncoding (Istio's FileAccessLogFromMeshConfig): Istio's text
// format by default (a given one ends in a newline), or JSON, Istio's
// fields unless accessLogFormat is a JSON object of its own.
func (g *gen) meshFileAccessLog(path string) *accesslogv3.AccessLog {
	mesh := g.pc.Mesh
	fl := &filealv3.FileAccessLog{Path: path}
	switch mesh.GetAccessLogEncoding() {
	case meshv1alpha1.MeshConfig_JSON:
		format := envoyJSONLogFormat()
		if f := mesh.GetAccessLogFormat(); f != "" {
			parsed := &structpb.Struct{}
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(f), parsed); err != nil {
				g.problem("mesh accessLogFormat is not a JSON object (%v); Istio's JSON format is used", err)
			} else {
				format = parsed
			}
		}
		fl.AccessLogFormat = &filealv3.FileAccessLog_LogFormat{LogFormat: g.jsonFormat(format, false)}
	default:
		fl.AccessLogFormat = &filealv3.FileAccessLog_LogFormat{LogFormat: g.textFormat(mesh.GetAccessLogFormat(), false)}
	}
	return &accesslogv3.AccessLog{Name: fileAccessLog, ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: g.pack(fl)}}
}

// textFormat is a text log format: Istio's when format is empty, else
// format ending in a newline (Istio's fileAccessLogFormat), with the
// formatters its operators need.
func (g *gen) textFormat(format string, omitEmpty bool) *corev3.SubstitutionFormatString {
	switch {
	case format == "":
		format = EnvoyTextLogFormat
	case !strings.HasSuffix(format, "\n"):
		format += "\n"
	}
	return &corev3.SubstitutionFormatString{
		Format: &corev3.SubstitutionFormatString_TextFormatSource{TextFormatSource: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: format},
		}},
		OmitEmptyValues: omitEmpty,
		Formatters:      g.formatters(format, nil),
	}
}

// jsonFormat is a JSON log format of the given fields (Envoy's
// sort_properties left off, as Istio leaves it).
func (g *gen) jsonFormat(fields *structpb.Struct, omitEmpty bool) *corev3.SubstitutionFormatString {
	return &corev3.SubstitutionFormatString{
		Format:          &corev3.SubstitutionFormatString_JsonFormat{JsonFormat: fields},
		OmitEmptyValues: omitEmpty,
		Formatters:      g.formatters("", fields),
	}
}

// formatters are the formatter extensions a format's operators need:
// %REQ_WITHOUT_QUERY(…)% is an extension (Istio's accessLogFormatters).
func (g *gen) formatters(text string, fields *structpb.Struct) []*corev3.TypedExtensionConfig {
	uses := strings.Contains(text, "%REQ_WITHOUT_QUERY")
	for _, v := range fields.GetFields() {
		uses = uses || strings.Contains(v.GetStringValue(), "%REQ_WITHOUT_QUERY")
	}
	if !uses {
		return nil
	}
	return []*corev3.TypedExtensionConfig{{Name: reqWithoutQuery, TypedConfig: g.pack(&reqwithoutqueryv3.ReqWithoutQuery{})}}
}

// providerAccessLog builds the access log of an extension provider, as
// Istio's telemetryAccessLog; nil (reported) when its service is not in
// the registry.
func (g *gen) providerAccessLog(p *meshv1alpha1.MeshConfig_ExtensionProvider) *accesslogv3.AccessLog {
	if al, ok := g.tel.providers[p.GetName()]; ok {
		return al
	}
	al := g.buildProviderAccessLog(p)
	if g.tel.providers == nil {
		g.tel.providers = map[string]*accesslogv3.AccessLog{}
	}
	g.tel.providers[p.GetName()] = al
	return al
}

func (g *gen) buildProviderAccessLog(p *meshv1alpha1.MeshConfig_ExtensionProvider) *accesslogv3.AccessLog {
	typed := func(name string, m proto.Message) *accesslogv3.AccessLog {
		return &accesslogv3.AccessLog{Name: name, ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: g.pack(m)}}
	}
	service := func(service string, port uint32) *corev3.GrpcService {
		host, cluster, err := g.providerCluster(service, port)
		if err != nil {
			g.problem("Telemetry access logging: provider %q: %v; its access log is left out", p.GetName(), err)
			return nil
		}
		return &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: host}}}
	}
	switch prov := p.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLog:
		f := prov.EnvoyFileAccessLog
		if p.GetName() == istio.EnvoyProvider && f.GetLogFormat() == nil && !f.GetOmitEmptyValues() {
			return g.meshFileAccessLog(f.GetPath())
		}
		fl := &filealv3.FileAccessLog{Path: f.GetPath()}
		if fl.Path == "" {
			fl.Path = istio.DevStdout
		}
		switch lf := f.GetLogFormat().GetLogFormat().(type) {
		case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLogProvider_LogFormat_Labels:
			fields := lf.Labels
			if len(fields.GetFields()) == 0 {
				fields = envoyJSONLogFormat()
			}
			fl.AccessLogFormat = &filealv3.FileAccessLog_LogFormat{LogFormat: g.jsonFormat(fields, f.GetOmitEmptyValues())}
		case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLogProvider_LogFormat_Text:
			fl.AccessLogFormat = &filealv3.FileAccessLog_LogFormat{LogFormat: g.textFormat(lf.Text, f.GetOmitEmptyValues())}
		default:
			fl.AccessLogFormat = &filealv3.FileAccessLog_LogFormat{LogFormat: g.textFormat("", f.GetOmitEmptyValues())}
		}
		return typed(fileAccessLog, fl)
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyHttpAls:
		h := prov.EnvoyHttpAls
		svc := service(h.GetService(), h.GetPort())
		if svc == nil {
			return nil
		}
		return typed(httpGRPCAccessLog, &grpcalv3.HttpGrpcAccessLogConfig{
			CommonConfig:                    grpcCommon(svc, h.GetLogName(), "http_envoy_accesslog", h.GetFilterStateObjectsToLog()),
			AdditionalRequestHeadersToLog:   h.GetAdditionalRequestHeadersToLog(),
			AdditionalResponseHeadersToLog:  h.GetAdditionalResponseHeadersToLog(),
			AdditionalResponseTrailersToLog: h.GetAdditionalResponseTrailersToLog(),
		})
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyTcpAls:
		t := prov.EnvoyTcpAls
		svc := service(t.GetService(), t.GetPort())
		if svc == nil {
			return nil
		}
		return typed(tcpGRPCAccessLog, &grpcalv3.TcpGrpcAccessLogConfig{
			CommonConfig: grpcCommon(svc, t.GetLogName(), "tcp_envoy_accesslog", t.GetFilterStateObjectsToLog()),
		})
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyOtelAls:
		o := prov.EnvoyOtelAls
		svc := service(o.GetService(), o.GetPort())
		if svc == nil {
			return nil
		}
		body := EnvoyTextLogFormat
		if t := o.GetLogFormat().GetText(); t != "" {
			body = t
		}
		labels := o.GetLogFormat().GetLabels()
		cfg := &otelalv3.OpenTelemetryAccessLogConfig{
			// common_config, as Istio 1.32 sends it: the Envoy of Istio's
			// proxy image reads it (its replacements are newer).
			CommonConfig:         grpcCommon(svc, o.GetLogName(), "otel_envoy_accesslog", peerWasmStateToLog), //nolint:staticcheck // see above
			DisableBuiltinLabels: true,
			Body:                 &otlpcommon.AnyValue{Value: &otlpcommon.AnyValue_StringValue{StringValue: body}},
			Formatters:           g.formatters(body, labels),
		}
		if len(labels.GetFields()) > 0 {
			cfg.Attributes = &otlpcommon.KeyValueList{}
			for _, k := range slices.Sorted(maps.Keys(labels.GetFields())) {
				cfg.Attributes.Values = append(cfg.Attributes.Values, &otlpcommon.KeyValue{
					Key: k, Value: &otlpcommon.AnyValue{Value: &otlpcommon.AnyValue_StringValue{StringValue: labels.GetFields()[k].GetStringValue()}},
				})
			}
		}
		return typed(otelAccessLog, cfg)
	}
	return nil
}

// grpcCommon is what Envoy's gRPC access log services share: the log
// name (a default per kind), the provider's service, and the filter
// state to send (the peers', unless the provider names its own).
func grpcCommon(svc *corev3.GrpcService, name, defaultName string, state []string) *grpcalv3.CommonGrpcAccessLogConfig {
	if name == "" {
		name = defaultName
	}
	if len(state) == 0 {
		state = peerStateToLog
	}
	return &grpcalv3.CommonGrpcAccessLogConfig{LogName: name, GrpcService: svc, TransportApiVersion: corev3.ApiVersion_V3, FilterStateObjectsToLog: state}
}
