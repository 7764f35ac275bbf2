package gatewayapi

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// The automated deployment of a Gateway: what Istio's gateway deployment
// controller (gatewaycommon.DeploymentController with the kube-gateway
// template) creates for a Gateway of a served class, rendered here from
// the injection values of the Gateway's revision; galley applies it.
const (
	// LabelGatewayName selects a Gateway's pods, and policies'
	// targetRefs attach to them by it.
	LabelGatewayName = model.LabelGatewayName
	// LabelGatewayClassName names the class on every object.
	LabelGatewayClassName = "gateway.networking.k8s.io/gateway-class-name"
	// LabelManaged marks the objects the controller owns
	// (label.GatewayManaged): one without it is never written.
	LabelManaged = "gateway.istio.io/managed"
	// LabelClassDefaults marks a ConfigMap of the system namespace whose
	// overlays apply to every Gateway of the class it names
	// (gatewaycommon.GatewayClassDefaults).
	LabelClassDefaults = "gateway.istio.io/defaults-for-class"
	// AnnotationControllerVersion is Istio's controller version on a
	// Gateway (ControllerVersionAnnotation): a Gateway a newer
	// controller has taken is left to it. It is read, never written:
	// Istio's setGatewayControllerVersion patches it through the
	// Gateway's status subresource, and the apiserver keeps only the
	// status of such a write to a custom resource
	// (apiextensions-apiserver's statusStrategy.PrepareForUpdate), so
	// Istio's write changes nothing either; a user (or an older Istio,
	// by a plain update) sets it.
	AnnotationControllerVersion = "gateway.istio.io/controller-version"
	// ControllerVersion is Istio 1.18+'s (ControllerVersion).
	ControllerVersion = 5

	annotationServiceType = "networking.istio.io/service-type"
	statusPort            = 15021
)

// Overlay keys of a parametersRef or class-defaults ConfigMap, each a
// strategic merge patch (YAML) of the object of that kind
// (gatewaycommon's supportedOverlays); the HorizontalPodAutoscaler and
// PodDisruptionBudget exist only when an overlay asks for them.
const (
	OverlayDeployment     = "deployment"
	OverlayService        = "service"
	OverlayServiceAccount = "serviceAccount"
	OverlayAutoscaler     = "horizontalPodAutoscaler"
	OverlayDisruption     = "podDisruptionBudget"
)

// DeployInput is what a Gateway's deployment is rendered from.
type DeployInput struct {
	Gateway *gw.Gateway
	// Controller is the controllerName of the Gateway's class; it names
	// the objects' LabelManaged.
	Controller gw.GatewayController
	// ListenerSets are the ListenerSets the Gateway allows
	// (AllowedListenerSets): their listeners' ports are the Service's too.
	ListenerSets []*gw.ListenerSet
	// Values are the injection values of the Gateway's revision: the
	// sidecar kind, image, addresses, trust domain and resources.
	Values inject.Values
	// ClassDefaults and Parameters are the data of the class-defaults
	// ConfigMap and of the Gateway's parametersRef ConfigMap (nil: none),
	// laid over the objects in that order.
	ClassDefaults, Parameters map[string]string
}

// Deployable reports whether Flotilla deploys the Gateway, and why not:
// a Gateway naming a Service by hostname, or several addresses, is
// deployed by its user (Istio's IsManaged); one a newer controller
// version has taken is left to it (ManagedGatewayControllerVersion).
func Deployable(g *gw.Gateway) (bool, string) {
	if !managed(&g.Spec) {
		return false, "the Gateway names its own address: deployed by its user"
	}
	if v, ok := g.Annotations[AnnotationControllerVersion]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n > ControllerVersion {
			return false, "managed by controller version " + v
		}
	}
	return true, ""
}

// Deploy renders a Gateway's ServiceAccount, Deployment and Service (and
// the HorizontalPodAutoscaler and PodDisruptionBudget its overlays ask
// for), as Istio's kube-gateway template does, each owned by the Gateway
// so that the cluster removes them with it. The sidecar kind of the
// values chooses the proxy container once, here.
func Deploy(in DeployInput) ([]metav1.Object, error) {
	pod, ok := gatewayPods[in.Values.Sidecar]
	if !ok {
		return nil, fmt.Errorf("sidecar %q has no gateway deployment", in.Values.Sidecar)
	}
	g := in.Gateway
	d := newDeployment(in)
	objs := []metav1.Object{
		&corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"), ObjectMeta: d.meta(d.serviceAccount)},
		d.deployment(pod),
		d.service(),
		&autoscalingv2.HorizontalPodAutoscaler{
			TypeMeta: typeMeta("autoscaling/v2", "HorizontalPodAutoscaler"), ObjectMeta: d.meta(d.name),
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.name},
				MaxReplicas:    1,
			},
		},
		&policyv1.PodDisruptionBudget{
			TypeMeta: typeMeta("policy/v1", "PodDisruptionBudget"), ObjectMeta: d.meta(d.name),
			Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelGatewayName: g.Name}}},
		},
	}
	overlays := []map[string]string{in.ClassDefaults, in.Parameters}
	var out []metav1.Object
	for _, o := range objs {
		o, err := applyOverlays(o, overlays)
		if err != nil {
			return nil, err
		}
		if o != nil {
			out = append(out, o)
		}
	}
	return out, nil
}

// deploy holds what every object of one Gateway's deployment shares.
type deploy struct {
	in             DeployInput
	name           string
	serviceAccount string
	labels         map[string]string // on every object
	annotations    map[string]string // on every object
	owner          []metav1.OwnerReference
}

func newDeployment(in DeployInput) *deploy {
	g := in.Gateway
	d := &deploy{in: in, name: DefaultName(g), serviceAccount: g.Annotations[annotationServiceAccount]}
	if d.serviceAccount == "" {
		d.serviceAccount = d.name
	}
	d.labels, d.annotations = infrastructure(g)
	d.labels[LabelGatewayName] = g.Name
	d.labels[LabelGatewayClassName] = string(g.Spec.GatewayClassName)
	d.labels[LabelManaged] = strings.ReplaceAll(string(in.Controller), "/", "-")
	for _, k := range []string{"kubectl.kubernetes.io/last-applied-configuration", annotationNameOverride, annotationServiceAccount, AnnotationControllerVersion} {
		delete(d.annotations, k)
	}
	d.owner = []metav1.OwnerReference{{APIVersion: Group + "/v1", Kind: KindGateway, Name: g.Name, UID: g.UID}}
	return d
}

// infrastructure returns the labels and annotations of the objects
// (Istio's extractInfrastructureMetadata): spec.infrastructure's, less the
// gateway.networking.k8s.io/ ones, or else the Gateway's own (Istio's
// default of ENABLE_GATEWAY_API_COPY_LABELS_ANNOTATIONS).
func infrastructure(g *gw.Gateway) (labels, annotations map[string]string) {
	labels, annotations = maps.Clone(g.Labels), maps.Clone(g.Annotations)
	if inf := g.Spec.Infrastructure; inf != nil {
		if inf.Labels != nil {
			labels = infraMeta(inf.Labels)
		}
		if inf.Annotations != nil {
			annotations = infraMeta(inf.Annotations)
		}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	return labels, annotations
}

func infraMeta[K ~string, V ~string](m map[K]V) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if !strings.HasPrefix(string(k), Group+"/") {
			out[string(k)] = string(v)
		}
	}
	return out
}

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

// meta is an object's metadata: every object has LabelManaged (Istio's
// apply sets it on each) and is owned by the Gateway.
func (d *deploy) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: name, Namespace: d.in.Gateway.Namespace, Labels: maps.Clone(d.labels),
		Annotations: nilIfEmpty(maps.Clone(d.annotations)), OwnerReferences: slices.Clone(d.owner),
	}
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

func (d *deploy) deployment(pod gatewayPod) *appsv1.Deployment {
	g := d.in.Gateway
	rev := d.in.Values.Revision
	if rev == "" {
		rev = "default"
	}
	podLabels := map[string]string{
		"sidecar.istio.io/inject":             "false",
		"service.istio.io/canonical-name":     d.name,
		"service.istio.io/canonical-revision": "latest",
	}
	maps.Copy(podLabels, d.labels)
	podAnnotations := maps.Clone(d.annotations)
	podAnnotations[controlplane.RevisionLabel] = rev
	maps.Copy(podAnnotations, map[string]string{
		"prometheus.io/path": "/stats/prometheus", "prometheus.io/port": "15020", "prometheus.io/scrape": "true",
	})
	spec := pod(d, podLabels)
	spec.ServiceAccountName = d.serviceAccount
	spec.SecurityContext = &corev1.PodSecurityContext{
		// The proxy binds the listeners' ports, 80 and 443 too, as uid 1337.
		Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}},
	}
	return &appsv1.Deployment{
		TypeMeta: typeMeta("apps/v1", "Deployment"), ObjectMeta: d.meta(d.name),
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelGatewayName: g.Name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
				Spec:       spec,
			},
		},
	}
}

func (d *deploy) service() *corev1.Service {
	g := d.in.Gateway
	svcType := corev1.ServiceTypeLoadBalancer
	if t, ok := g.Annotations[annotationServiceType]; ok {
		svcType = corev1.ServiceType(t)
	}
	policy := corev1.IPFamilyPolicyPreferDualStack
	s := &corev1.Service{
		TypeMeta: typeMeta("v1", "Service"), ObjectMeta: d.meta(d.name),
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &policy, Type: svcType, Ports: servicePorts(g.Spec.Listeners, d.in.ListenerSets),
			Selector: map[string]string{LabelGatewayName: g.Name},
		},
	}
	if len(g.Spec.Addresses) > 0 && svcType == corev1.ServiceTypeLoadBalancer {
		s.Spec.LoadBalancerIP = g.Spec.Addresses[0].Value // deprecated in Kubernetes; Istio's template sets it so
	}
	return s
}

// servicePorts are the Service's ports (Istio's extractServicePorts): the
// status port, then one per distinct listener port — the Gateway's
// listeners, then its ListenerSets' — named after its first listener (63
// characters at most, unique), its appProtocol the listener's protocol.
// A set's listener without a port takes HTTP's or HTTPS's default, and is
// left out for other protocols (Istio's would ask for port 0, which the
// apiserver refuses).
func servicePorts(listeners []gw.Listener, sets []*gw.ListenerSet) []corev1.ServicePort {
	all := slices.Clone(listeners)
	for _, ls := range sets {
		for _, e := range ls.Spec.Listeners {
			port, err := listenerEntryPort(e)
			if err != nil {
				continue
			}
			e.Port = port
			all = append(all, gw.Listener(e))
		}
	}
	ports := []corev1.ServicePort{{Name: "status-port", Port: statusPort, Protocol: corev1.ProtocolTCP, AppProtocol: new("tcp")}}
	seen := map[int32]bool{}
	used := map[string]bool{"status-port": true}
	for i, l := range all {
		if seen[l.Port] {
			continue
		}
		seen[l.Port] = true
		name := strings.ReplaceAll(string(l.Name), ".", "-")
		if name == "" {
			name = fmt.Sprintf("%s-%d", strings.ToLower(string(l.Protocol)), i)
		}
		ports = append(ports, corev1.ServicePort{
			Name: uniquePortName(name, l.Port, used), Port: l.Port, Protocol: corev1.ProtocolTCP,
			AppProtocol: new(strings.ToLower(string(l.Protocol))),
		})
	}
	return ports
}

// uniquePortName is Istio's: name cut to 63 characters, told apart from
// the names used by the port number and then "x"s.
func uniquePortName(name string, port int32, used map[string]bool) string {
	name = name[:min(len(name), 63)]
	candidate := name
	for suffix := fmt.Sprintf("-%d", port); used[candidate]; suffix += "x" {
		candidate = name[:min(len(name), 63-len(suffix))] + suffix
	}
	used[candidate] = true
	return candidate
}

// gatewayPod builds the pod spec of a gateway of one sidecar kind; the
// Deployment sets its service account and security context.
type gatewayPod func(d *deploy, labels map[string]string) corev1.PodSpec

// gatewayPods are the gateway pods per sidecar kind (inject.Values.Sidecar).
var gatewayPods = map[string]gatewayPod{
	inject.SidecarFlotilla: flotillaGatewayPod,
	inject.SidecarProxyV2:  proxyV2GatewayPod,
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func resourceEnv(name, res string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
		Resource: res, Divisor: resource.MustParse("1"),
	}}}
}

// resources are the proxy's requests and limits from the values; one
// that does not parse is left out (the injection configuration is
// validated before it is used).
func resources(v inject.Values) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{}
	set := func(l *corev1.ResourceList, name corev1.ResourceName, q string) {
		if q, err := resource.ParseQuantity(q); err == nil {
			if *l == nil {
				*l = corev1.ResourceList{}
			}
			(*l)[name] = q
		}
	}
	set(&r.Requests, corev1.ResourceCPU, v.CPURequest)
	set(&r.Requests, corev1.ResourceMemory, v.MemoryRequest)
	set(&r.Limits, corev1.ResourceCPU, v.CPULimit)
	set(&r.Limits, corev1.ResourceMemory, v.MemoryLimit)
	return r
}

func proxySecurity() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, AllowPrivilegeEscalation: new(false),
		Privileged: new(false), ReadOnlyRootFilesystem: new(true),
		RunAsUser: new(int64(1337)), RunAsGroup: new(int64(1337)), RunAsNonRoot: new(true),
	}
}

func readyProbe(period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz/ready", Port: intstr.FromInt32(statusPort), Scheme: corev1.URISchemeHTTP,
		}},
		PeriodSeconds: period, FailureThreshold: failures, TimeoutSeconds: 1, SuccessThreshold: 1,
	}
}

// The volumes both gateways mount: the CA token, the trust bundle, the
// workload socket, Envoy's bootstrap and the pod's metadata.
func commonVolumes() []corev1.Volume {
	return []corev1.Volume{
		{Name: "workload-socket", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "istio-envoy", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		{Name: "istio-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
		}}}},
		{Name: "istio-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
			ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "istio-token", ExpirationSeconds: new(int64(43200)), Audience: "istio-ca"},
		}}}}},
		{Name: "istio-ca-root-cert", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "istio-ca-root-cert"},
		}}},
	}
}

func commonMounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: "workload-socket", MountPath: "/var/run/secrets/workload-spiffe-uds"},
		{Name: "istio-envoy", MountPath: "/etc/istio/proxy"},
		{Name: "istio-podinfo", MountPath: "/etc/istio/pod"},
		{Name: "istio-token", MountPath: "/var/run/secrets/tokens"},
		{Name: "istio-ca-root-cert", MountPath: "/var/run/secrets/istio"},
	}
}

// flotillaGatewayPod is flotilla-proxy as a router, as the chart's own
// ingress gateway runs it.
func flotillaGatewayPod(d *deploy, labels map[string]string) corev1.PodSpec {
	v := d.in.Values
	labelsJSON, _ := json.Marshal(labels) // a map of strings always marshals
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name: "istio-proxy", Image: v.ProxyImage,
			Args: []string{"proxy", "router", "--log-level=" + v.LogLevel},
			Env: []corev1.EnvVar{
				fieldEnv("POD_NAME", "metadata.name"),
				fieldEnv("POD_NAMESPACE", "metadata.namespace"),
				fieldEnv("INSTANCE_IP", "status.podIP"),
				fieldEnv("SERVICE_ACCOUNT", "spec.serviceAccountName"),
				{Name: "TRUST_DOMAIN", Value: v.TrustDomain},
				{Name: "DISCOVERY_ADDRESS", Value: v.DiscoveryAddress},
				{Name: "CA_ADDRESS", Value: v.CAAddress},
				{Name: "CLUSTER_ID", Value: v.ClusterID},
				{Name: "ISTIO_METAJSON_LABELS", Value: string(labelsJSON)},
				resourceEnv("GOMEMLIMIT", "limits.memory"),
			},
			Ports: []corev1.ContainerPort{
				{Name: "metrics", ContainerPort: 15020, Protocol: corev1.ProtocolTCP},
				{Name: "status-port", ContainerPort: statusPort, Protocol: corev1.ProtocolTCP},
				{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe:  readyProbe(2, 30),
			Resources:       resources(v),
			SecurityContext: proxySecurity(),
			VolumeMounts:    commonMounts(),
		}},
		Volumes: commonVolumes(),
	}
}

// proxyV2GatewayPod is Istio's proxyv2 image as Istio's kube-gateway
// template runs it: pilot-agent as a router with Istio's environment.
func proxyV2GatewayPod(d *deploy, _ map[string]string) corev1.PodSpec {
	v, g := d.in.Values, d.in.Gateway
	meshID := v.MeshID
	if meshID == "" {
		meshID = v.TrustDomain
	}
	env := []corev1.EnvVar{
		{Name: "PILOT_CERT_PROVIDER", Value: "istiod"},
		{Name: "CA_ADDR", Value: cmp.Or(v.CAAddress, v.DiscoveryAddress)},
		fieldEnv("POD_NAME", "metadata.name"),
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("INSTANCE_IP", "status.podIP"),
		fieldEnv("SERVICE_ACCOUNT", "spec.serviceAccountName"),
		fieldEnv("HOST_IP", "status.hostIP"),
		resourceEnv("ISTIO_CPU_LIMIT", "limits.cpu"),
		{Name: "PROXY_CONFIG", Value: "{}\n"},
		{Name: "ISTIO_META_POD_PORTS", Value: "[]"},
		{Name: "ISTIO_META_APP_CONTAINERS", Value: ""},
		resourceEnv("GOMEMLIMIT", "limits.memory"),
		{Name: "ISTIO_META_CLUSTER_ID", Value: v.ClusterID},
		fieldEnv("ISTIO_META_NODE_NAME", "spec.nodeName"),
		{Name: "ISTIO_META_INTERCEPTION_MODE", Value: "REDIRECT"},
	}
	if n := d.labels[labelTopologyNetwork]; n != "" {
		env = append(env, corev1.EnvVar{Name: "ISTIO_META_NETWORK", Value: n})
	}
	env = append(env,
		corev1.EnvVar{Name: "ISTIO_META_WORKLOAD_NAME", Value: d.name},
		corev1.EnvVar{Name: "ISTIO_META_OWNER", Value: "kubernetes://apis/apps/v1/namespaces/" + g.Namespace + "/deployments/" + d.name},
		corev1.EnvVar{Name: "ISTIO_META_MESH_ID", Value: meshID},
		corev1.EnvVar{Name: "TRUST_DOMAIN", Value: v.TrustDomain},
	)
	startup := readyProbe(1, 30)
	startup.InitialDelaySeconds = 1
	mounts := append(commonMounts(),
		corev1.VolumeMount{Name: "credential-socket", MountPath: "/var/run/secrets/credential-uds"},
		corev1.VolumeMount{Name: "workload-certs", MountPath: "/var/run/secrets/workload-spiffe-credentials"},
		corev1.VolumeMount{Name: "istio-data", MountPath: "/var/lib/istio/data"},
	)
	volumes := append(commonVolumes(),
		corev1.Volume{Name: "credential-socket", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "workload-certs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "istio-data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name: "istio-proxy", Image: v.ProxyImage,
			Args: []string{
				"proxy", "router", "--domain", "$(POD_NAMESPACE).svc." + v.DomainSuffix,
				"--proxyLogLevel", v.LogLevel, "--proxyComponentLogLevel", v.ComponentLogLevel,
				"--log_output_level", v.AgentLogLevel,
			},
			Env: env,
			Ports: []corev1.ContainerPort{
				{Name: "metrics", ContainerPort: 15020, Protocol: corev1.ProtocolTCP},
				{Name: "status-port", ContainerPort: statusPort, Protocol: corev1.ProtocolTCP},
				{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP},
			},
			StartupProbe:    startup,
			ReadinessProbe:  readyProbe(15, 4),
			Resources:       resources(v),
			SecurityContext: proxySecurity(),
			VolumeMounts:    mounts,
		}},
		Volumes: volumes,
	}
}

// overlayKeys are the keys an overlay ConfigMap may hold, per kind.
var overlayKeys = map[string]string{
	"Deployment": OverlayDeployment, "Service": OverlayService, "ServiceAccount": OverlayServiceAccount,
	"HorizontalPodAutoscaler": OverlayAutoscaler, "PodDisruptionBudget": OverlayDisruption,
}

// applyOverlays lays each ConfigMap's overlay for the object's kind over
// it as a strategic merge patch (Istio's applyOverlay): an unknown key is
// an error, an overlay may not change the object's identity or owners,
// and the autoscaler and disruption budget exist only when overlaid.
func applyOverlays(obj metav1.Object, overlays []map[string]string) (metav1.Object, error) {
	kind := reflect.TypeOf(obj).Elem().Name()
	key := overlayKeys[kind]
	applied := false
	supported := slices.Sorted(maps.Values(overlayKeys))
	for _, ov := range overlays {
		for k := range ov {
			if !slices.Contains(supported, k) {
				return nil, fmt.Errorf("unsupported overlay %q (supported: %s)", k, strings.Join(supported, ", "))
			}
		}
		patch, ok := ov[key]
		if !ok {
			continue
		}
		next, err := strategicOverlay(obj, patch)
		if err != nil {
			return nil, fmt.Errorf("overlay %q: %w", key, err)
		}
		a, b := obj, next
		if a.GetName() != b.GetName() || a.GetNamespace() != b.GetNamespace() || a.GetGenerateName() != b.GetGenerateName() ||
			!reflect.DeepEqual(a.GetOwnerReferences(), b.GetOwnerReferences()) || len(b.GetFinalizers()) > 0 ||
			b.GetUID() != "" || b.GetResourceVersion() != "" || len(b.GetManagedFields()) > 0 {
			return nil, fmt.Errorf("overlay %q: illegal metadata change", key)
		}
		obj, applied = next, true
	}
	if !applied && (key == OverlayAutoscaler || key == OverlayDisruption) {
		return nil, nil
	}
	return obj, nil
}

// strategicOverlay applies a YAML strategic merge patch to an object of
// its own type.
func strategicOverlay(obj metav1.Object, patchYAML string) (metav1.Object, error) {
	patch, err := sigsyaml.YAMLToJSON([]byte(patchYAML))
	if err != nil {
		return nil, err
	}
	orig, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, obj)
	if err != nil {
		return nil, err
	}
	next := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(metav1.Object)
	if err := json.Unmarshal(merged, next); err != nil {
		return nil, err
	}
	return next, nil
}
