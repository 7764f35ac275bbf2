package inject

import (
	"bytes"
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"

	"google.golang.org/protobuf/encoding/protojson"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Per-pod annotations that override values.
const (
	AnnotationProxyImage       = "sidecar.istio.io/proxyImage"
	AnnotationProxyCPU         = "sidecar.istio.io/proxyCPU"
	AnnotationProxyMemory      = "sidecar.istio.io/proxyMemory"
	AnnotationProxyCPULimit    = "sidecar.istio.io/proxyCPULimit"
	AnnotationProxyMemoryLimit = "sidecar.istio.io/proxyMemoryLimit"
	AnnotationLogLevel         = "sidecar.istio.io/logLevel"
	// AnnotationComponentLogLevel and AnnotationAgentLogLevel are read
	// by the proxyv2 template only: pilot-agent's
	// --proxyComponentLogLevel (Envoy's per-component levels) and
	// --log_output_level (the agent's own scopes).
	AnnotationComponentLogLevel = "sidecar.istio.io/componentLogLevel"
	AnnotationAgentLogLevel     = "sidecar.istio.io/agentLogLevel"
	AnnotationIncludeOutbound   = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutbound   = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationExcludeInbound    = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationExcludeOutboundPt = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationIncludeInbound    = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationIncludeOutboundPt = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeIfaces     = "traffic.sidecar.istio.io/excludeInterfaces"
	// AnnotationKubevirtIfaces is the older name of AnnotationRerouteIfaces,
	// which wins when both are set, as in Istio's template.
	AnnotationKubevirtIfaces = "traffic.sidecar.istio.io/kubevirtInterfaces"
	AnnotationRerouteIfaces  = "istio.io/reroute-virtual-interfaces"
	// Honoured with one value each (onlyValues).
	AnnotationInterceptionMode = "sidecar.istio.io/interceptionMode"
	AnnotationStatusPort       = "status.sidecar.istio.io/port"
	AnnotationNativeSidecar    = "sidecar.istio.io/nativeSidecar"
	AnnotationProxyConfig      = "proxy.istio.io/config"
	AnnotationProxyImageType   = "sidecar.istio.io/proxyImageType"
	AnnotationRewriteProbes    = "sidecar.istio.io/rewriteAppHTTPProbers"
	// AnnotationTemplates chooses the injection template, as Istio's
	// does: TemplateSidecar (the default) or TemplateGRPCAgent.
	AnnotationTemplates = "inject.istio.io/templates"
	// AnnotationDiscoveryAddress is the discovery address the pod's
	// agent dials, over the injector's (Istio's agent reads it so).
	AnnotationDiscoveryAddress = "sidecar.istio.io/discoveryAddress"
	// The sidecar's readiness probe, over the template's numbers.
	AnnotationReadinessInitialDelay = "readiness.status.sidecar.istio.io/initialDelaySeconds"
	AnnotationReadinessPeriod       = "readiness.status.sidecar.istio.io/periodSeconds"
	AnnotationReadinessFailures     = "readiness.status.sidecar.istio.io/failureThreshold"
)

// The injection templates a pod can ask for by AnnotationTemplates.
const (
	// TemplateSidecar is Envoy beside the application, traffic captured.
	TemplateSidecar = "sidecar"
	// TemplateGRPCAgent is Istio's proxyless gRPC template: the agent
	// without Envoy and without capture, writing the gRPC xDS bootstrap
	// and the certificate files the application's containers read.
	TemplateGRPCAgent = "grpc-agent"
)

// The sidecars an injector can add, chosen once by Values.Sidecar: each
// has its own built-in template and defaults.
const (
	// SidecarFlotilla is flotilla-proxy: Envoy and flotilla-agent, with
	// Flotilla's template (sidecar.yaml.tmpl).
	SidecarFlotilla = "flotilla"
	// SidecarProxyV2 is Istio's proxyv2 image (pilot-agent and Envoy) with
	// Istio's injection template semantics (proxyv2.yaml.tmpl), so a pod
	// written for Istio runs against Flotilla as it is.
	SidecarProxyV2 = "proxyv2"
)

// Values fill the template.
type Values struct {
	// Sidecar chooses the built-in template and the built-in values the
	// rest are laid over: SidecarFlotilla or SidecarProxyV2.
	Sidecar          string `json:"sidecar"`
	ProxyImage       string `json:"proxyImage"`
	CPURequest       string `json:"cpuRequest"`
	MemoryRequest    string `json:"memoryRequest"`
	CPULimit         string `json:"cpuLimit"`
	MemoryLimit      string `json:"memoryLimit"`
	DiscoveryAddress string `json:"discoveryAddress"`
	CAAddress        string `json:"caAddress"`
	TrustDomain      string `json:"trustDomain"`
	ClusterID        string `json:"clusterID"`
	LogLevel         string `json:"logLevel"`
	Revision         string `json:"revision"`
	// DomainSuffix is the cluster's DNS domain (pilot-agent's --domain
	// is $(POD_NAMESPACE).svc.<suffix>).
	DomainSuffix string `json:"domainSuffix"`
	// MeshID is Istio's global.meshID (ISTIO_META_MESH_ID); empty: the
	// trust domain, as Istio's template falls back to.
	MeshID string `json:"meshID"`
	// ComponentLogLevel and AgentLogLevel are the proxyv2 template's
	// Envoy component levels and pilot-agent's scopes (Istio's
	// global.proxy.componentLogLevel and global.logging.level).
	ComponentLogLevel string `json:"componentLogLevel"`
	AgentLogLevel     string `json:"agentLogLevel"`
	// Traffic capture, as the annotations of the same names.
	IncludeOutboundIPRanges string `json:"includeOutboundIPRanges"`
	ExcludeOutboundIPRanges string `json:"excludeOutboundIPRanges"`
	ExcludeInboundPorts     string `json:"excludeInboundPorts"`
	ExcludeOutboundPorts    string `json:"excludeOutboundPorts"`
	// IncludeInboundPorts: "*" all (the default), "" none, or ports.
	IncludeInboundPorts  string `json:"includeInboundPorts"`
	IncludeOutboundPorts string `json:"includeOutboundPorts"`
	ExcludeInterfaces    string `json:"excludeInterfaces"`
	// RerouteInterfaces are Istio's kubevirtInterfaces (KubeVirt VMs'
	// interfaces, whose traffic is captured outbound).
	RerouteInterfaces string `json:"rerouteInterfaces"`
	// HoldApplicationUntilProxyStarts starts the proxy first and holds the
	// application's containers until it is ready.
	HoldApplicationUntilProxyStarts bool `json:"holdApplicationUntilProxyStarts"`
	// RewriteAppProbers points the application's probes at the agent
	// (Istio's rewriteAppHTTPProbe, on by default), which performs them:
	// the kubelet's probes then pass whatever the mesh requires (mTLS).
	RewriteAppProbers bool `json:"rewriteAppProbers"`
	// ReadinessInitialDelaySeconds, ReadinessPeriodSeconds and
	// ReadinessFailureThreshold are the sidecar's readiness probe's
	// numbers, as the readiness.status.sidecar.istio.io annotations set
	// them; empty: the template's own (Istio's for proxyv2).
	ReadinessInitialDelaySeconds string `json:"readinessInitialDelaySeconds"`
	ReadinessPeriodSeconds       string `json:"readinessPeriodSeconds"`
	ReadinessFailureThreshold    string `json:"readinessFailureThreshold"`
	// ProxyConfig is the pod's proxy configuration (ProxyConfigs.Effective:
	// the ProxyConfig resources and the proxy.istio.io/config annotation),
	// given to the agent as JSON in PROXY_CONFIG; set per pod, never from
	// values.
	ProxyConfig string `json:"-"`
	// ProxyConfigs are the ProxyConfig resources in force (the injector
	// sets them from galley's); nil: none.
	ProxyConfigs *ProxyConfigs `json:"-"`
}

// DefaultValues are the built-in values of Flotilla's own sidecar.
func DefaultValues() Values {
	return Values{
		Sidecar: SidecarFlotilla, DomainSuffix: controlplane.DefaultDomainSuffix,
		ComponentLogLevel: "misc:error", AgentLogLevel: "default:info",
		ProxyImage: "flotilla-proxy:latest", CPURequest: "100m", MemoryRequest: "128Mi", CPULimit: "2", MemoryLimit: "1Gi",
		DiscoveryAddress: "flotilla-discovery.istio-system.svc:15012", CAAddress: "flotilla-ca.istio-system.svc:15013",
		TrustDomain: controlplane.DefaultTrustDomain, ClusterID: controlplane.DefaultClusterID, LogLevel: "warning", Revision: "default",
		IncludeOutboundIPRanges: "*", IncludeInboundPorts: "*", RewriteAppProbers: true,
	}
}

// DefaultTemplate is the built-in template of Flotilla's own sidecar.
//
//go:embed sidecar.yaml.tmpl
var DefaultTemplate string

// ProxyV2Template is the built-in template of Istio's proxyv2 sidecar.
//
//go:embed proxyv2.yaml.tmpl
var ProxyV2Template string

// BuiltinTemplate is the built-in template of a sidecar.
func BuiltinTemplate(sidecar string) (string, error) {
	switch sidecar {
	case SidecarFlotilla:
		return DefaultTemplate, nil
	case SidecarProxyV2:
		return ProxyV2Template, nil
	}
	return "", fmt.Errorf("sidecar %q: want %s or %s", sidecar, SidecarFlotilla, SidecarProxyV2)
}

// Template is a parsed sidecar template. Safe for concurrent use.
type Template struct {
	t *template.Template

	// parsed memoises the decoding of rendered text: pods with the same
	// effective values render the same text, and decoding the YAML is
	// most of an injection's cost.
	mu     sync.Mutex
	parsed map[string]*Sidecar
}

// maxParsed bounds the memo; when full it starts over.
const maxParsed = 64

// ParseTemplate parses a sidecar template (the injection ConfigMap's).
func ParseTemplate(text string) (*Template, error) {
	t, err := template.New("sidecar").Option("missingkey=error").Funcs(template.FuncMap{
		"quote": func(s string) string { b, _ := json.Marshal(s); return string(b) },
		"join":  func(l []string) string { return strings.Join(l, ",") },
		"toJSON": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
	}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("sidecar template: %w", err)
	}
	return &Template{t: t, parsed: map[string]*Sidecar{}}, nil
}

// Sidecar is what a template renders: what is added to the pod.
type Sidecar struct {
	InitContainers []corev1.Container `json:"initContainers"`
	Containers     []corev1.Container `json:"containers"`
	Volumes        []corev1.Volume    `json:"volumes"`
	// Application is added to each of the pod's own containers (the
	// proxyless template's bootstrap variable and mounts); what a
	// container already has of the same name or path is kept.
	Application *Application `json:"application,omitempty"`
	// Labels and Annotations are set on the pod, replacing the pod's own
	// of the same keys, as Istio's templates' metadata overlays the pod.
	// An annotation sidecar.istio.io/rewriteAppHTTPProbers set here
	// decides the probe rewriting, as it does in Istio (its grpc-agent
	// template turns the rewriting off so).
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// InitContainersLast puts the template's init containers after the
	// pod's own, as Istio's reorderPod places istio-init: the pod's init
	// containers run before traffic is redirected to a proxy that is not
	// running yet. Otherwise they go first.
	InitContainersLast bool `json:"initContainersLast,omitempty"`
}

// Application is what the pod's own containers get.
type Application struct {
	Env          []corev1.EnvVar      `json:"env"`
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
}

// effective applies a pod's annotations to the values.
func effective(v Values, pod *corev1.Pod) (Values, error) {
	a := pod.Annotations
	set := func(dst *string, key string) {
		if s, ok := a[key]; ok {
			*dst = s
		}
	}
	set(&v.ProxyImage, AnnotationProxyImage)
	set(&v.CPURequest, AnnotationProxyCPU)
	set(&v.MemoryRequest, AnnotationProxyMemory)
	set(&v.CPULimit, AnnotationProxyCPULimit)
	set(&v.MemoryLimit, AnnotationProxyMemoryLimit)
	set(&v.LogLevel, AnnotationLogLevel)
	set(&v.IncludeOutboundIPRanges, AnnotationIncludeOutbound)
	set(&v.ExcludeOutboundIPRanges, AnnotationExcludeOutbound)
	set(&v.ExcludeInboundPorts, AnnotationExcludeInbound)
	set(&v.ExcludeOutboundPorts, AnnotationExcludeOutboundPt)
	set(&v.IncludeInboundPorts, AnnotationIncludeInbound)
	set(&v.IncludeOutboundPorts, AnnotationIncludeOutboundPt)
	set(&v.ExcludeInterfaces, AnnotationExcludeIfaces)
	set(&v.RerouteInterfaces, AnnotationKubevirtIfaces)
	set(&v.RerouteInterfaces, AnnotationRerouteIfaces)
	for key, only := range onlyValues {
		if got, ok := a[key]; ok && got != only.value {
			return v, fmt.Errorf("%s %q: %s", key, got, only.why)
		}
	}
	if addr, ok := a[AnnotationDiscoveryAddress]; ok {
		if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
			return v, fmt.Errorf("%s %q: want host:port", AnnotationDiscoveryAddress, addr)
		}
		v.DiscoveryAddress = addr
	}
	set(&v.ReadinessInitialDelaySeconds, AnnotationReadinessInitialDelay)
	set(&v.ReadinessPeriodSeconds, AnnotationReadinessPeriod)
	set(&v.ReadinessFailureThreshold, AnnotationReadinessFailures)
	// Istio's validateUInt32 for the initial delay; Kubernetes wants a
	// period and a threshold of at least 1.
	for key, n := range map[string]struct {
		value string
		least uint64
	}{
		AnnotationReadinessInitialDelay: {v.ReadinessInitialDelaySeconds, 0},
		AnnotationReadinessPeriod:       {v.ReadinessPeriodSeconds, 1},
		AnnotationReadinessFailures:     {v.ReadinessFailureThreshold, 1},
	} {
		if n.value == "" {
			continue
		}
		if u, err := strconv.ParseUint(n.value, 10, 31); err != nil || u < n.least {
			return v, fmt.Errorf("%s %q: want a whole number from %d to %d", key, n.value, n.least, math.MaxInt32)
		}
	}
	if s, ok := a[AnnotationRewriteProbes]; ok {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return v, fmt.Errorf("%s %q: want true or false", AnnotationRewriteProbes, s)
		}
		v.RewriteAppProbers = b
	}
	for key, q := range map[string]string{"CPU request": v.CPURequest, "memory request": v.MemoryRequest, "CPU limit": v.CPULimit, "memory limit": v.MemoryLimit} {
		if q == "" {
			continue
		}
		if _, err := resource.ParseQuantity(q); err != nil {
			return v, fmt.Errorf("proxy %s %q: %w", key, q, err)
		}
	}
	switch v.LogLevel {
	case "trace", "debug", "info", "warning", "error", "critical", "off":
	default:
		return v, fmt.Errorf("%s %q: want trace, debug, info, warning, error, critical or off", AnnotationLogLevel, v.LogLevel)
	}
	set(&v.ComponentLogLevel, AnnotationComponentLogLevel)
	set(&v.AgentLogLevel, AnnotationAgentLogLevel)
	if v.ComponentLogLevel != "" && !componentLevels.MatchString(v.ComponentLogLevel) {
		return v, fmt.Errorf("%s %q: want component:level pairs separated by commas, as misc:error,upstream:debug", AnnotationComponentLogLevel, v.ComponentLogLevel)
	}
	if v.AgentLogLevel != "" && !agentLevels.MatchString(v.AgentLogLevel) {
		return v, fmt.Errorf("%s %q: want a level, or scope:level pairs separated by commas, as default:info,ads:debug", AnnotationAgentLogLevel, v.AgentLogLevel)
	}
	var own *meshv1alpha1.ProxyConfig
	if cfg, ok := a[AnnotationProxyConfig]; ok {
		pc, err := istio.ParseProxyConfig([]byte(cfg))
		if err != nil {
			return v, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
		}
		own = pc
	}
	pc := v.ProxyConfigs.Effective(pod.Namespace, pod.Labels, own)
	if pc != nil {
		if h := pc.GetHoldApplicationUntilProxyStarts(); h != nil {
			v.HoldApplicationUntilProxyStarts = h.GetValue()
		}
		js, err := protojson.Marshal(pc)
		if err != nil {
			return v, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
		}
		// protojson varies its spacing from build to build: compacted,
		// the same pod renders the same text.
		var compact bytes.Buffer
		if err := json.Compact(&compact, js); err != nil {
			return v, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
		}
		v.ProxyConfig = compact.String()
	}
	imageType := pc.GetImage().GetImageType()
	if t, ok := a[AnnotationProxyImageType]; ok {
		imageType = t
	}
	if !slices.Contains([]string{"", "default", "debug", "distroless"}, imageType) {
		return v, fmt.Errorf("proxy image type %q: want default, debug or distroless", imageType)
	}
	v.ProxyImage = imageOfType(v, a, imageType)

	for key, r := range map[string]string{AnnotationIncludeOutbound: v.IncludeOutboundIPRanges, AnnotationExcludeOutbound: v.ExcludeOutboundIPRanges} {
		if err := checkRanges(r, key == AnnotationIncludeOutbound); err != nil {
			return v, fmt.Errorf("%s: %w", key, err)
		}
	}
	inbound := v.IncludeInboundPorts
	if strings.TrimSpace(inbound) == "*" {
		inbound = ""
	}
	for _, s := range []string{v.ExcludeInboundPorts, v.ExcludeOutboundPorts, inbound, v.IncludeOutboundPorts} {
		for _, p := range splitList(s) {
			var n int
			if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 || fmt.Sprint(n) != p {
				return v, fmt.Errorf("port %q: want 1 to 65535", p)
			}
		}
	}
	for key, list := range map[string]string{AnnotationExcludeIfaces: v.ExcludeInterfaces, AnnotationRerouteIfaces: v.RerouteInterfaces} {
		for _, iface := range splitList(list) {
			if !proxycontract.ValidInterfaceName(iface) {
				return v, fmt.Errorf("%s: interface %q: want a Linux interface name (1 to 15 letters, digits, '.', '_', '-', '@')", key, iface)
			}
		}
	}
	return v, nil
}

// onlyValues are the annotations Flotilla honours with one value, what
// it does anyway; a pod asking for another is refused, with the reason.
var onlyValues = map[string]struct{ value, why string }{
	AnnotationInterceptionMode: {"REDIRECT", "Flotilla's capture redirects (REDIRECT); TPROXY and NONE are not built"},
	AnnotationStatusPort:       {"15020", "the agent's status port is 15020 (the probes and metrics the injector rewrites point there)"},
	AnnotationNativeSidecar:    {"false", "the sidecar is injected as an ordinary container; Kubernetes native sidecars are not built"},
}

// The shapes of Envoy's --component-log-level and of Istio's
// --log_output_level (pkg/log's scope:level list, a bare level meaning
// every scope's).
var (
	componentLevels = regexp.MustCompile(`^[a-z0-9_]+:[a-z]+(,[a-z0-9_]+:[a-z]+)*$`)
	agentLevels     = regexp.MustCompile(`^([a-z0-9_.-]+:)?[a-z]+(,[a-z0-9_.-]+:[a-z]+)*$`)
)

// checkRanges accepts a list of IPv4 CIDRs or addresses (and "*" when
// star): what the agent's capture rules take.
func checkRanges(list string, star bool) error {
	for _, f := range splitList(list) {
		if f == "*" && star {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return fmt.Errorf("%q is not an IP range", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is4() {
			return fmt.Errorf("%q: only IPv4 traffic is captured (IPv6 capture is not built)", f)
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// CheckAnnotations returns why the injector would refuse pod for one of
// Istio's annotations it reads (a malformed proxyCPU, an interception
// mode other than REDIRECT, ...), as Render would, with the default
// values; nil when it would not. It is what analysis reports as Istio's
// InvalidAnnotation.
func CheckAnnotations(pod *corev1.Pod) error {
	_, err := effective(DefaultValues(), pod)
	return err
}

// Render renders the sidecar for a pod: values overridden by the pod's
// annotations, then the template. The pod's workload is WorkloadOf(pod).
func (t *Template) Render(pod *corev1.Pod, values Values) (*Sidecar, Values, error) {
	return t.RenderAs(pod, WorkloadOf(pod), values)
}

// RenderAs is Render for a pod of workload w (kube-inject knows the
// object whose pod template it injects).
func (t *Template) RenderAs(pod *corev1.Pod, w Workload, values Values) (*Sidecar, Values, error) {
	v, err := effective(values, pod)
	if err != nil {
		return nil, v, err
	}
	tmpl := TemplateSidecar
	if name, ok := pod.Annotations[AnnotationTemplates]; ok {
		tmpl = strings.TrimSpace(name)
	}
	if tmpl != TemplateSidecar && tmpl != TemplateGRPCAgent {
		return nil, v, fmt.Errorf("%s %q: want %s or %s", AnnotationTemplates, tmpl, TemplateSidecar, TemplateGRPCAgent)
	}
	buf := limitedBuffer{max: MaxRenderedBytes}
	istio, err := istioData(pod, w, v)
	if err != nil {
		return nil, v, err
	}
	data := map[string]any{
		"Values": v, "Pod": pod, "Proxyless": tmpl == TemplateGRPCAgent,
		"ExcludeInboundPorts": splitList(v.ExcludeInboundPorts), "ExcludeOutboundPorts": splitList(v.ExcludeOutboundPorts),
		"IncludeOutboundPorts": splitList(v.IncludeOutboundPorts), "ExcludeInterfaces": splitList(v.ExcludeInterfaces),
		"RerouteInterfaces":       splitList(v.RerouteInterfaces),
		"IncludeOutboundIPRanges": splitList(v.IncludeOutboundIPRanges), "ExcludeOutboundIPRanges": splitList(v.ExcludeOutboundIPRanges),
		"Istio": istio,
	}
	if err := t.t.Execute(&buf, data); err != nil {
		return nil, v, fmt.Errorf("sidecar template: %w", err)
	}
	sc, err := t.decode(buf.b.Bytes())
	if err != nil {
		return nil, v, err
	}
	if err := addUserVolumes(sc, pod.Annotations); err != nil {
		return nil, v, err
	}
	return sc, v, nil
}

// The pod's own volumes for the sidecar, as Istio's templates add them:
// a JSON object of volume name to volume source, and of volume name (the
// sidecar's, or the pod's own) to mount.
const (
	AnnotationUserVolume      = "sidecar.istio.io/userVolume"
	AnnotationUserVolumeMount = "sidecar.istio.io/userVolumeMount"
)

// maxUserVolumes bounds each annotation's entries.
const maxUserVolumes = 64

// addUserVolumes adds the userVolume annotation's volumes to the sidecar's
// and the userVolumeMount annotation's mounts to its proxy container.
// Unknown fields, a name the template's volumes already use, and more
// than maxUserVolumes entries are refused.
func addUserVolumes(sc *Sidecar, annotations map[string]string) error {
	decode := func(key string, into any) error {
		raw, ok := annotations[key]
		if !ok {
			return nil
		}
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(into); err != nil {
			return fmt.Errorf("%s: want a JSON object of volume name to %s: %w", key, map[string]string{AnnotationUserVolume: "volume source", AnnotationUserVolumeMount: "mount"}[key], err)
		}
		if dec.More() {
			return fmt.Errorf("%s: more than one JSON value", key)
		}
		return nil
	}
	var vols map[string]corev1.VolumeSource
	var mounts map[string]corev1.VolumeMount
	if err := decode(AnnotationUserVolume, &vols); err != nil {
		return err
	}
	if err := decode(AnnotationUserVolumeMount, &mounts); err != nil {
		return err
	}
	if len(vols) > maxUserVolumes || len(mounts) > maxUserVolumes {
		return fmt.Errorf("%s and %s: at most %d entries each", AnnotationUserVolume, AnnotationUserVolumeMount, maxUserVolumes)
	}
	for _, name := range slices.Sorted(maps.Keys(vols)) {
		if slices.ContainsFunc(sc.Volumes, func(v corev1.Volume) bool { return v.Name == name }) {
			return fmt.Errorf("%s: volume %q is the sidecar's own", AnnotationUserVolume, name)
		}
		sc.Volumes = append(sc.Volumes, corev1.Volume{Name: name, VolumeSource: vols[name]})
	}
	if len(mounts) == 0 {
		return nil
	}
	i := slices.IndexFunc(sc.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer })
	if i < 0 {
		return fmt.Errorf("%s: the template has no %s container", AnnotationUserVolumeMount, ProxyContainer)
	}
	for _, name := range slices.Sorted(maps.Keys(mounts)) {
		m := mounts[name]
		if m.MountPath == "" {
			return fmt.Errorf("%s: volume %q has no mountPath", AnnotationUserVolumeMount, name)
		}
		m.Name = name
		sc.Containers[i].VolumeMounts = append(sc.Containers[i].VolumeMounts, m)
	}
	return nil
}

// decode parses rendered text, or copies the memoised result.
func (t *Template) decode(text []byte) (*Sidecar, error) {
	t.mu.Lock()
	sc, ok := t.parsed[string(text)]
	t.mu.Unlock()
	if !ok {
		sc = &Sidecar{}
		if err := sigsyaml.UnmarshalStrict(text, sc); err != nil {
			return nil, fmt.Errorf("sidecar template rendered invalid YAML: %w", err)
		}
		t.mu.Lock()
		if len(t.parsed) >= maxParsed {
			clear(t.parsed)
		}
		t.parsed[string(text)] = sc
		t.mu.Unlock()
	}
	return sc.deepCopy(), nil
}

func (s *Sidecar) deepCopy() *Sidecar {
	out := &Sidecar{}
	if s.InitContainers != nil {
		out.InitContainers = make([]corev1.Container, len(s.InitContainers))
	}
	if s.Containers != nil {
		out.Containers = make([]corev1.Container, len(s.Containers))
	}
	if s.Volumes != nil {
		out.Volumes = make([]corev1.Volume, len(s.Volumes))
	}
	out.Labels, out.Annotations = maps.Clone(s.Labels), maps.Clone(s.Annotations)
	out.InitContainersLast = s.InitContainersLast
	if s.Application != nil {
		out.Application = &Application{}
		for _, e := range s.Application.Env {
			out.Application.Env = append(out.Application.Env, *e.DeepCopy())
		}
		for _, m := range s.Application.VolumeMounts {
			out.Application.VolumeMounts = append(out.Application.VolumeMounts, *m.DeepCopy())
		}
	}
	for i := range s.InitContainers {
		s.InitContainers[i].DeepCopyInto(&out.InitContainers[i])
	}
	for i := range s.Containers {
		s.Containers[i].DeepCopyInto(&out.Containers[i])
	}
	for i := range s.Volumes {
		s.Volumes[i].DeepCopyInto(&out.Volumes[i])
	}
	return out
}

// MaxRenderedBytes bounds what a template may render for one pod: a
// runaway template fails instead of eating the webhook's memory.
const MaxRenderedBytes = 1 << 20

// limitedBuffer refuses writes beyond max, which stops template execution.
type limitedBuffer struct {
	b   bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.max {
		return 0, fmt.Errorf("the template renders more than %d bytes", l.max)
	}
	return l.b.Write(p)
}

// Status is the status annotation's content: what was injected.
type Status struct {
	InitContainers []string `json:"initContainers"`
	Containers     []string `json:"containers"`
	Volumes        []string `json:"volumes"`
	Revision       string   `json:"revision"`
}

// Inject returns a copy of pod with the sidecar added. The pod's workload
// is WorkloadOf(pod).
func (t *Template) Inject(pod *corev1.Pod, values Values) (*corev1.Pod, error) {
	return t.InjectAs(pod, WorkloadOf(pod), values)
}

// InjectAs is Inject for a pod of workload w.
func (t *Template) InjectAs(pod *corev1.Pod, w Workload, values Values) (*corev1.Pod, error) {
	sc, v, err := t.RenderAs(pod, w, values)
	if err != nil {
		return nil, err
	}
	out := pod.DeepCopy()
	overrides, err := applyOverrides(sc, out)
	if err != nil {
		return nil, err
	}
	st := Status{Revision: v.Revision}
	for _, c := range sc.InitContainers {
		st.InitContainers = append(st.InitContainers, c.Name)
	}
	for _, c := range sc.Containers {
		st.Containers = append(st.Containers, c.Name)
	}
	for _, vol := range sc.Volumes {
		if slices.ContainsFunc(out.Spec.Volumes, func(e corev1.Volume) bool { return e.Name == vol.Name }) {
			return nil, fmt.Errorf("the pod already has a volume named %s", vol.Name)
		}
		st.Volumes = append(st.Volumes, vol.Name)
	}
	if sc.InitContainersLast {
		out.Spec.InitContainers = append(out.Spec.InitContainers, sc.InitContainers...)
	} else {
		// Capture first, before any other init container opens connections.
		out.Spec.InitContainers = append(slices.Clone(sc.InitContainers), out.Spec.InitContainers...)
	}
	if v.HoldApplicationUntilProxyStarts {
		out.Spec.Containers = append(slices.Clone(sc.Containers), out.Spec.Containers...)
	} else {
		out.Spec.Containers = append(out.Spec.Containers, sc.Containers...)
	}
	out.Spec.Volumes = append(out.Spec.Volumes, sc.Volumes...)
	if sc.Application != nil {
		for i := range out.Spec.Containers {
			c := &out.Spec.Containers[i]
			if slices.Contains(st.Containers, c.Name) {
				continue
			}
			for _, e := range sc.Application.Env {
				if !slices.ContainsFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
					c.Env = append(c.Env, e)
				}
			}
			for _, m := range sc.Application.VolumeMounts {
				if !slices.ContainsFunc(c.VolumeMounts, func(x corev1.VolumeMount) bool { return x.MountPath == m.MountPath || x.Name == m.Name }) {
					c.VolumeMounts = append(c.VolumeMounts, m)
				}
			}
		}
	}
	out.Annotations = maps.Clone(out.Annotations)
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	maps.Copy(out.Annotations, sc.Annotations)
	if overrides != "" {
		out.Annotations[AnnotationOverrides] = overrides
	}
	if s, ok := sc.Annotations[AnnotationRewriteProbes]; ok {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("the template's %s %q: want true or false", AnnotationRewriteProbes, s)
		}
		v.RewriteAppProbers = b
	}
	if v.RewriteAppProbers {
		if err := rewriteProbes(out, st.Containers); err != nil {
			return nil, err
		}
	}
	if err := mergePrometheus(out); err != nil {
		return nil, err
	}
	status, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	out.Annotations[StatusAnnotation] = string(status)
	// The revision that injected it, as Istio's template records it.
	out.Annotations[RevisionLabel] = cmp.Or(v.Revision, controlplane.DefaultRevision)
	out.Labels = maps.Clone(out.Labels)
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	maps.Copy(out.Labels, sc.Labels)
	out.Labels[TLSModeLabel] = "istio"
	return out, nil
}

// rewriteProbes points the application containers' probes at the agent
// and gives the originals to the proxy container (istio-proxy) in
// appprobe.EnvVar, as Istio's injector does. A probe with a named port
// the container does not declare, or a probe without an HTTP, TCP or gRPC
// action, is left as it is; without an istio-proxy container nothing is
// rewritten.
func rewriteProbes(pod *corev1.Pod, injected []string) error {
	proxy := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer })
	if proxy < 0 {
		return nil
	}
	probers := map[string]appprobe.Prober{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if slices.Contains(injected, c.Name) {
			continue
		}
		for _, pr := range []struct {
			probe **corev1.Probe
			kind  string
		}{{&c.LivenessProbe, "livez"}, {&c.ReadinessProbe, "readyz"}, {&c.StartupProbe, "startupz"}} {
			orig := *pr.probe
			if orig == nil {
				continue
			}
			p, ok := original(orig, c.Ports)
			if !ok {
				continue
			}
			path := appprobe.Path(c.Name, pr.kind)
			probers[path] = p
			rewritten := orig.DeepCopy()
			rewritten.ProbeHandler = corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromInt(appprobe.AgentPort), Scheme: corev1.URISchemeHTTP,
			}}
			*pr.probe = rewritten
		}
	}
	if len(probers) == 0 {
		return nil
	}
	js, err := json.Marshal(probers)
	if err != nil {
		return fmt.Errorf("app probers: %w", err)
	}
	pod.Spec.Containers[proxy].Env = append(pod.Spec.Containers[proxy].Env, corev1.EnvVar{Name: appprobe.EnvVar, Value: string(js)})
	return nil
}

// original is the probe the agent must perform, its port a number.
func original(p *corev1.Probe, ports []corev1.ContainerPort) (appprobe.Prober, bool) {
	resolve := func(port intstr.IntOrString) (appprobe.Port, bool) {
		if port.Type == intstr.Int {
			return appprobe.NumberPort(port.IntVal), port.IntValue() > 0
		}
		for _, cp := range ports {
			if cp.Name == port.StrVal {
				return appprobe.NumberPort(cp.ContainerPort), true
			}
		}
		return appprobe.Port{}, false
	}
	out := appprobe.Prober{TimeoutSeconds: p.TimeoutSeconds}
	var ok bool
	switch {
	case p.HTTPGet != nil:
		h := &appprobe.HTTPGetAction{Path: p.HTTPGet.Path, Host: p.HTTPGet.Host, Scheme: string(p.HTTPGet.Scheme)}
		for _, hd := range p.HTTPGet.HTTPHeaders {
			h.HTTPHeaders = append(h.HTTPHeaders, appprobe.HTTPHeader{Name: hd.Name, Value: hd.Value})
		}
		h.Port, ok = resolve(p.HTTPGet.Port)
		out.HTTPGet = h
	case p.TCPSocket != nil:
		t := &appprobe.TCPSocketAction{Host: p.TCPSocket.Host}
		t.Port, ok = resolve(p.TCPSocket.Port)
		out.TCPSocket = t
	case p.GRPC != nil:
		g := &appprobe.GRPCAction{Port: p.GRPC.Port}
		if p.GRPC.Service != nil {
			s := *p.GRPC.Service
			g.Service = &s
		}
		out.GRPC, ok = g, true
	default:
		return out, false // exec probes run in the container itself
	}
	return out, ok
}

// imageOfType is the proxy image of image type t, as Istio's ProxyImage:
// Istio's image of a type other than "default" is tagged with it
// ("proxyv2:1.32.0-distroless"). Flotilla's own image comes in one type:
// only the proxyv2 sidecar's image changes; an image the pod names itself
// (proxyImage) is kept.
func imageOfType(v Values, a map[string]string, t string) string {
	if v.Sidecar != SidecarProxyV2 || a[AnnotationProxyImage] != "" || t == "" || t == "default" {
		return v.ProxyImage
	}
	return v.ProxyImage + "-" + t
}
