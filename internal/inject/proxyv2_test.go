package inject

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func proxyV2(t *testing.T, revision, values string) Config {
	t.Helper()
	c, err := ParseConfig(revision, "", "sidecar: proxyv2\n"+values)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// deploymentPod is probedPod as a Deployment's ReplicaSet creates it.
func deploymentPod(mut func(*corev1.Pod)) *corev1.Pod {
	return probedPod(func(p *corev1.Pod) {
		p.Name, p.GenerateName = "", "cart-7d9f8b6c5d-"
		p.Labels["pod-template-hash"] = "7d9f8b6c5d"
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "cart-7d9f8b6c5d", Controller: ptr.To(true)}}
		if mut != nil {
			mut(p)
		}
	})
}

func envOf(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			out[e.Name] = "field " + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			out[e.Name] = "resource " + e.ValueFrom.ResourceFieldRef.Resource
		}
	}
	return out
}

func container(p *corev1.Pod, name string) corev1.Container {
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Name == name {
			return c
		}
	}
	return corev1.Container{}
}

// TestTheProxyV2PodsAreIstiosInjectionTemplatesOutput keeps the whole
// injected pod of each proxyv2 template in a golden file, to be read
// beside Istio's injection-template.yaml and grpc-agent.yaml.
func TestTheProxyV2PodsAreIstiosInjectionTemplatesOutput(t *testing.T) {
	c := proxyV2(t, "default", "")
	for name, p := range map[string]*corev1.Pod{
		"proxyv2-sidecar":    deploymentPod(nil),
		"proxyv2-grpc-agent": deploymentPod(func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent} }),
	} {
		out, err := c.Template.Inject(p, c.Values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := sigsyaml.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		golden.Check(t, filepath.Join("testdata", name+".golden.yaml"), b, *update)
	}
}

func TestTheProxyV2SidecarIsPilotAgentAndEnvoyAsIstioInjectsThem(t *testing.T) {
	c := proxyV2(t, "default", "")
	if c.Values.ProxyImage != ProxyV2Image || c.Values.DiscoveryAddress != "istiod.istio-system.svc:15012" || c.Values.CAAddress != "" {
		t.Fatalf("proxyv2 defaults %+v", c.Values)
	}
	out, err := c.Template.Inject(deploymentPod(func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m"}}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"migrate", ProxyV2InitContainer}) {
		t.Errorf("init containers %v: istio-init runs last, as Istio's reorderPod puts it", got)
	}
	if got := names(out.Spec.Containers); !slices.Equal(got, []string{"web", "greeter", ProxyContainer}) {
		t.Errorf("containers %v", got)
	}
	init := container(out, ProxyV2InitContainer)
	if got := strings.Join(init.Args, " "); got != "istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i * -x  -b * -d 15090,15021,15020 --log_output_level=default:info" {
		t.Errorf("istio-init args %q", got)
	}
	if sc := init.SecurityContext; *sc.RunAsUser != 0 || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) {
		t.Errorf("istio-init security context %+v", sc)
	}

	proxy := container(out, ProxyContainer)
	if proxy.Image != ProxyV2Image || init.Image != ProxyV2Image {
		t.Errorf("images %s, %s", proxy.Image, init.Image)
	}
	if got := strings.Join(proxy.Args, " "); got != "proxy sidecar --domain $(POD_NAMESPACE).svc.cluster.local --proxyLogLevel=warning --proxyComponentLogLevel=misc:error --log_output_level=default:info" {
		t.Errorf("pilot-agent args %q", got)
	}
	env := envOf(proxy)
	for k, want := range map[string]string{
		"PILOT_CERT_PROVIDER": "istiod", "POD_NAME": "field metadata.name", "POD_NAMESPACE": "field metadata.namespace",
		"INSTANCE_IP": "field status.podIP", "SERVICE_ACCOUNT": "field spec.serviceAccountName", "HOST_IP": "field status.hostIP",
		"ISTIO_CPU_LIMIT": "resource limits.cpu", "GOMEMLIMIT": "resource limits.memory",
		"PROXY_CONFIG":              `{"discoveryAddress":"istiod.istio-system.svc:15012"}`,
		"ISTIO_META_POD_PORTS":      `[{"name":"http","containerPort":8080}]`,
		"ISTIO_META_APP_CONTAINERS": "web,greeter", "ISTIO_META_CLUSTER_ID": "Kubernetes", "ISTIO_META_NODE_NAME": "field spec.nodeName",
		"ISTIO_META_INTERCEPTION_MODE": "REDIRECT", "ISTIO_META_WORKLOAD_NAME": "cart",
		"ISTIO_META_OWNER":   "kubernetes://apis/apps/v1/namespaces/shop/deployments/cart",
		"ISTIO_META_MESH_ID": "cluster.local", "TRUST_DOMAIN": "cluster.local",
	} {
		if env[k] != want {
			t.Errorf("env %s = %q, want %q", k, env[k], want)
		}
	}
	// pilot-agent sends its CSRs to the discovery address unless a CA
	// address is configured: CA_ADDR is istiod's, as Istio's template
	// writes it.
	if v := env["CA_ADDR"]; v != "istiod.istio-system.svc:15012" {
		t.Errorf("CA_ADDR %q with no CA address configured, want the discovery address", v)
	}
	if p := proxy.ReadinessProbe.HTTPGet; p.Path != "/healthz/ready" || p.Port.IntValue() != 15021 {
		t.Errorf("readiness %+v", p)
	}
	if len(proxy.Ports) != 1 || proxy.Ports[0].ContainerPort != 15090 || proxy.Ports[0].Name != "http-envoy-prom" {
		t.Errorf("ports %+v", proxy.Ports)
	}
	if sc := proxy.SecurityContext; *sc.RunAsUser != 1337 || *sc.RunAsGroup != 1337 || !*sc.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation {
		t.Errorf("istio-proxy security context %+v", sc)
	}
	mounts := map[string]string{}
	for _, m := range proxy.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]corev1.Volume{}
	for _, v := range out.Spec.Volumes {
		vols[v.Name] = v
	}
	for name, path := range map[string]string{
		"workload-socket": "/var/run/secrets/workload-spiffe-uds", "credential-socket": "/var/run/secrets/credential-uds",
		"workload-certs": "/var/run/secrets/workload-spiffe-credentials", "istio-envoy": "/etc/istio/proxy",
		"istio-data": "/var/lib/istio/data", "istio-podinfo": "/etc/istio/pod", "istio-token": "/var/run/secrets/tokens",
		"istiod-ca-cert": "/var/run/secrets/istio",
	} {
		if mounts[name] != path {
			t.Errorf("%s mounted at %q, want %s", name, mounts[name], path)
		}
		if _, ok := vols[name]; !ok {
			t.Errorf("no volume %s", name)
		}
	}
	if v := vols["istio-envoy"].EmptyDir; v == nil || v.Medium != corev1.StorageMediumMemory {
		t.Errorf("istio-envoy %+v", vols["istio-envoy"])
	}
	if tok := vols["istio-token"].Projected.Sources[0].ServiceAccountToken; tok.Audience != "istio-ca" || *tok.ExpirationSeconds != 43200 {
		t.Errorf("istio-token %+v", tok)
	}
	if cm := vols["istiod-ca-cert"].ConfigMap; cm == nil || cm.Name != "istio-ca-root-cert" {
		t.Errorf("istiod-ca-cert %+v", vols["istiod-ca-cert"])
	}
	if items := vols["istio-podinfo"].DownwardAPI.Items; len(items) != 2 || items[0].FieldRef.FieldPath != "metadata.labels" || items[1].FieldRef.FieldPath != "metadata.annotations" {
		t.Errorf("istio-podinfo %+v", items)
	}
	if out.Labels["service.istio.io/canonical-name"] != "cart" || out.Labels["service.istio.io/canonical-revision"] != "latest" || out.Labels[TLSModeLabel] != "istio" {
		t.Errorf("labels %v", out.Labels)
	}
	if out.Annotations["kubectl.kubernetes.io/default-container"] != "web" || out.Annotations[RevisionLabel] != "default" {
		t.Errorf("annotations %v", out.Annotations)
	}

	// The application's probes go to pilot-agent's /app-health on 15020,
	// which performs the originals from ISTIO_KUBE_APP_PROBERS.
	web := container(out, "web")
	if get := web.LivenessProbe.HTTPGet; get.Path != "/app-health/web/livez" || get.Port.IntValue() != appprobe.AgentPort {
		t.Errorf("web liveness %+v", get)
	}
	var probers map[string]appprobe.Prober
	if err := json.Unmarshal([]byte(env[appprobe.EnvVar]), &probers); err != nil || probers["/app-health/web/livez"].HTTPGet.Port.Number() != 8080 {
		t.Errorf("%s %q: %v", appprobe.EnvVar, env[appprobe.EnvVar], err)
	}
}

func TestTheSidecarValueChoosesTheTemplateAndTheDefaultsOnce(t *testing.T) {
	canary := proxyV2(t, "canary", "")
	if canary.Values.DiscoveryAddress != "istiod-canary.istio-system.svc:15012" || canary.Values.Revision != "canary" {
		t.Errorf("a revision's proxyv2 discovery address %q", canary.Values.DiscoveryAddress)
	}
	flotilla, err := ParseConfig("default", "", "sidecar: flotilla\n")
	if err != nil || flotilla.Values != DefaultValues() {
		t.Fatalf("sidecar: flotilla is the built-in configuration: %v %+v", err, flotilla.Values)
	}
	own := proxyV2(t, "default", "proxyImage: registry.local/istio/proxyv2:1.32.1\ncaAddress: ca.example:15012\ndiscoveryAddress: istiod.mesh.svc:15012\n")
	out, err := own.Template.Inject(pod(nil), own.Values)
	if err != nil {
		t.Fatal(err)
	}
	env := envOf(container(out, ProxyContainer))
	if env["CA_ADDR"] != "ca.example:15012" || env["PROXY_CONFIG"] != `{"discoveryAddress":"istiod.mesh.svc:15012"}` || container(out, ProxyContainer).Image != "registry.local/istio/proxyv2:1.32.1" {
		t.Errorf("values laid over the proxyv2 defaults: %v", env)
	}
	for values, want := range map[string]string{
		"sidecar: envoy\n":                                `sidecar "envoy": want flotilla or proxyv2`,
		"sidecar: [proxyv2]\n":                            "injection values",
		"sidecar: proxyv2\nproxyImg: x":                   "unknown field",
		"sidecar: proxyv2\ncomponentLogLevel: \"misc\"\n": "component:level pairs",
	} {
		if _, err := ParseConfig("default", "", values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: %v, want an error saying %q", values, err, want)
		}
	}
}

func TestTheTrafficAnnotationsReachIstioIptablesAsIstiosTemplateMapsThem(t *testing.T) {
	c := proxyV2(t, "default", "")
	out, err := c.Template.Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{
			AnnotationIncludeOutbound: "10.0.0.0/8,172.16.0.0/12", AnnotationExcludeOutbound: "10.96.0.1/32",
			AnnotationExcludeInbound: "9090, 9091", AnnotationExcludeOutboundPt: "3306",
			AnnotationAgentLogLevel: "default:debug", AnnotationComponentLogLevel: "misc:error,upstream:debug", AnnotationLogLevel: "debug",
		}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	want := "istio-iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i 10.0.0.0/8,172.16.0.0/12 -x 10.96.0.1/32 -b * -d 15090,15021,9090,9091,15020 -o 3306 --log_output_level=default:debug"
	if got := strings.Join(container(out, ProxyV2InitContainer).Args, " "); got != want {
		t.Errorf("istio-init args\n%s\nwant\n%s", got, want)
	}
	if got := strings.Join(container(out, ProxyContainer).Args, " "); !strings.Contains(got, "--proxyLogLevel=debug --proxyComponentLogLevel=misc:error,upstream:debug --log_output_level=default:debug") {
		t.Errorf("pilot-agent args %q", got)
	}
	// The agent's status port excluded already is not excluded twice.
	out, err = c.Template.Inject(pod(func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationExcludeInbound: "15020,8443"} }), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	if args := container(out, ProxyV2InitContainer).Args; args[slices.Index(args, "-d")+1] != "15090,15021,15020,8443" {
		t.Errorf("-d %v", args)
	}
	for key, bad := range map[string]string{
		AnnotationComponentLogLevel: "misc", AnnotationAgentLogLevel: "default:info\n- --evil", AnnotationExcludeInbound: "http",
	} {
		if _, err := c.Template.Inject(pod(func(p *corev1.Pod) { p.Annotations = map[string]string{key: bad} }), c.Values); err == nil {
			t.Errorf("%s=%q accepted", key, bad)
		}
	}
}

func TestAPodsProxyConfigReachesPilotAgentOverTheDiscoveryAddress(t *testing.T) {
	c := proxyV2(t, "default", "")
	out, err := c.Template.Inject(probedPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationProxyConfig: `{"holdApplicationUntilProxyStarts": true, "proxyMetadata": {"ISTIO_META_DNS_CAPTURE": "true"}, "concurrency": 2}`}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	proxy := out.Spec.Containers[0]
	if proxy.Name != ProxyContainer || proxy.Lifecycle == nil || !slices.Equal(proxy.Lifecycle.PostStart.Exec.Command, []string{"pilot-agent", "wait"}) {
		t.Fatalf("holdApplicationUntilProxyStarts: the proxy is not first with pilot-agent wait: %v", names(out.Spec.Containers))
	}
	env := envOf(proxy)
	var pc map[string]any
	if err := json.Unmarshal([]byte(env["PROXY_CONFIG"]), &pc); err != nil || pc["discoveryAddress"] != "istiod.istio-system.svc:15012" || pc["concurrency"] != float64(2) || pc["holdApplicationUntilProxyStarts"] != true {
		t.Errorf("PROXY_CONFIG %s: %v", env["PROXY_CONFIG"], err)
	}
	if env["ISTIO_META_DNS_CAPTURE"] != "true" {
		t.Errorf("proxyMetadata is not the proxy's environment: %v", env)
	}
	// istio-iptables captures the pod's DNS from the same variable.
	if env := envOf(container(out, ProxyV2InitContainer)); env["ISTIO_META_DNS_CAPTURE"] != "true" {
		t.Errorf("proxyMetadata is not istio-init's environment: %v", env)
	}
	// The pod's own discovery address wins, as Istio lays the annotation
	// over the mesh's default proxy configuration.
	out, err = c.Template.Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationProxyConfig: "discoveryAddress: istiod-canary.istio-system.svc:15012"}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	if got := envOf(container(out, ProxyContainer))["PROXY_CONFIG"]; got != `{"discoveryAddress":"istiod-canary.istio-system.svc:15012"}` {
		t.Errorf("PROXY_CONFIG %s", got)
	}
}

func TestTheProxyV2GRPCAgentIsPilotAgentAloneAndTheAppReadsItsBootstrap(t *testing.T) {
	c := proxyV2(t, "default", "")
	out, err := c.Template.Inject(probedPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Spec.InitContainers) != 0 {
		t.Errorf("init containers %v: nothing is captured", names(out.Spec.InitContainers))
	}
	proxy := container(out, ProxyContainer)
	env := envOf(proxy)
	for k, want := range map[string]string{
		"DISABLE_ENVOY": "true", "ISTIO_META_GENERATOR": "grpc", "OUTPUT_CERTS": "/var/lib/istio/data", "ISTIO_META_DNS_CAPTURE": "false",
		"PILOT_CERT_PROVIDER": "istiod", "PROXY_CONFIG": `{"discoveryAddress":"istiod.istio-system.svc:15012"}`,
	} {
		if env[k] != want {
			t.Errorf("env %s = %q, want %q", k, env[k], want)
		}
	}
	if _, ok := env["ISTIO_META_INTERCEPTION_MODE"]; ok {
		t.Error("a proxyless pod has an interception mode")
	}
	if proxy.ReadinessProbe.HTTPGet.Port.IntValue() != 15020 || proxy.Ports[0].ContainerPort != 15020 {
		t.Errorf("readiness %+v, ports %+v: pilot-agent's own 15020", proxy.ReadinessProbe.HTTPGet, proxy.Ports)
	}
	for _, app := range []string{"web", "greeter"} {
		c := container(out, app)
		if e := envOf(c); e["GRPC_XDS_BOOTSTRAP"] != "/etc/istio/proxy/grpc-bootstrap.json" || e["GRPC_XDS_EXPERIMENTAL_SECURITY_SUPPORT"] != "true" {
			t.Errorf("%s env %v", app, e)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "istio-xds" && m.MountPath == "/etc/istio/proxy" }) {
			t.Errorf("%s mounts %v", app, c.VolumeMounts)
		}
	}
	// grpc-agent.yaml turns the probe rewriting off: pilot-agent does not
	// stand between the kubelet and a proxyless application.
	if web := container(out, "web"); web.LivenessProbe.HTTPGet.Path != "/healthz" || out.Annotations[AnnotationRewriteProbes] != "false" {
		t.Errorf("web liveness %+v, annotation %q", web.LivenessProbe.HTTPGet, out.Annotations[AnnotationRewriteProbes])
	}
	if _, ok := env[appprobe.EnvVar]; ok {
		t.Errorf("%s set for a proxyless pod", appprobe.EnvVar)
	}
}

func TestThePatchTurnsThePodIntoTheProxyV2InjectedOne(t *testing.T) {
	c := proxyV2(t, "default", "")
	for name, p := range map[string]*corev1.Pod{
		"with init containers and probes": deploymentPod(func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m"}}
			p.Annotations = map[string]string{"kubectl.kubernetes.io/default-container": "greeter"}
		}),
		"held": probedPod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationProxyConfig: "holdApplicationUntilProxyStarts: true"}
		}),
		"grpc-agent": probedPod(func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent} }),
		"no labels":  pod(func(p *corev1.Pod) { p.Labels = nil }),
	} {
		injected, err := c.Template.Inject(p, c.Values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		patch, err := Patch(p, injected)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		decoded, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		orig, _ := json.Marshal(p)
		applied, err := decoded.Apply(orig)
		if err != nil {
			t.Fatalf("%s: applying %s: %v", name, patch, err)
		}
		var got, want corev1.Pod
		want = *injected
		if err := json.Unmarshal(applied, &got); err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(want)
		if string(a) != string(b) {
			t.Fatalf("%s: the patched pod differs from the injected one:\n%s\n%s", name, a, b)
		}
	}
}

func TestWorkloadOfGuessesTheControllerAsIstioDoes(t *testing.T) {
	owned := func(kind, apiVersion, name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			GenerateName: name + "-", Namespace: "shop", Labels: labels,
			OwnerReferences: []metav1.OwnerReference{
				{Kind: "Other", APIVersion: "x/v1", Name: "not-the-controller"},
				{Kind: kind, APIVersion: apiVersion, Name: name, Controller: ptr.To(true)},
			},
		}}
	}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want Workload
	}{
		"a bare pod":      {pod(nil), Workload{Name: "app-1", Namespace: "shop", Kind: "Pod", APIVersion: "v1"}},
		"a Deployment's":  {owned("ReplicaSet", "apps/v1", "cart-5f6d", map[string]string{"pod-template-hash": "5f6d"}), Workload{Name: "cart", Namespace: "shop", Kind: "Deployment", APIVersion: "apps/v1"}},
		"a ReplicaSet's":  {owned("ReplicaSet", "apps/v1", "cart", nil), Workload{Name: "cart", Namespace: "shop", Kind: "ReplicaSet", APIVersion: "apps/v1"}},
		"a StatefulSet's": {owned("StatefulSet", "apps/v1", "db", nil), Workload{Name: "db", Namespace: "shop", Kind: "StatefulSet", APIVersion: "apps/v1"}},
		"a CronJob's":     {owned("Job", "batch/v1", "report-29012345", nil), Workload{Name: "report", Namespace: "shop", Kind: "CronJob", APIVersion: "batch/v1"}},
		"a Job's":         {owned("Job", "batch/v1", "migrate", nil), Workload{Name: "migrate", Namespace: "shop", Kind: "Job", APIVersion: "batch/v1"}},
		"a DeploymentConfig's": {
			owned("ReplicationController", "v1", "web-3", map[string]string{"deploymentconfig": "web"}),
			Workload{Name: "web", Namespace: "shop", Kind: "DeploymentConfig", APIVersion: "v1"},
		},
		"named, so its own": {pod(func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", APIVersion: "apps/v1", Name: "rs", Controller: ptr.To(true)}}
		}), Workload{Name: "app-1", Namespace: "shop", Kind: "Pod", APIVersion: "v1"}},
	} {
		if got := WorkloadOf(tc.pod); got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, got, tc.want)
		}
	}
}

// pilot-agent needs a probe's port as a number: a named one is resolved
// from the container's ports, as Istio's DumpAppProbers does.
func TestAStartupProbeOnANamedPortReachesPilotAgentWithItsNumber(t *testing.T) {
	c := proxyV2(t, "default", "")
	out, err := c.Template.Inject(pod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9000}}
		p.Spec.Containers[0].StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("grpc")}}}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	var probers map[string]appprobe.Prober
	if err := json.Unmarshal([]byte(envOf(container(out, ProxyContainer))[appprobe.EnvVar]), &probers); err != nil {
		t.Fatal(err)
	}
	if h := probers["/app-health/app/startupz"]; h.TCPSocket == nil || h.TCPSocket.Port.Number() != 9000 {
		t.Errorf("startup original %+v", h)
	}
	if get := container(out, "app").StartupProbe.HTTPGet; get == nil || get.Path != "/app-health/app/startupz" || get.Port.IntValue() != 15020 {
		t.Errorf("startup probe %+v", get)
	}
}

// TestHostileAnnotationsCannotChangeTheShapeOfTheProxyV2Sidecar: as with
// Flotilla's template, what a pod's annotations and labels carry lands
// quoted, never as YAML.
func TestHostileAnnotationsCannotChangeTheShapeOfTheProxyV2Sidecar(t *testing.T) {
	c := proxyV2(t, "default", "")
	escape := "x\"}\n  securityContext: {privileged: true}\n# "
	pc, err := json.Marshal(map[string]any{"proxyMetadata": map[string]string{"X\"}\n- name: Y": escape}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Template.Inject(pod(func(p *corev1.Pod) {
		p.Labels = map[string]string{"app": escape, "service.istio.io/workload-name": escape}
		p.Annotations = map[string]string{AnnotationProxyImage: escape, AnnotationProxyConfig: string(pc)}
	}), c.Values)
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range slices.Concat(out.Spec.InitContainers, out.Spec.Containers) {
		if ct.SecurityContext != nil && ct.SecurityContext.Privileged != nil && *ct.SecurityContext.Privileged {
			t.Fatalf("%s became privileged", ct.Name)
		}
	}
	env := envOf(container(out, ProxyContainer))
	if env["ISTIO_META_WORKLOAD_NAME"] != escape || env["X\"}\n- name: Y"] != escape || container(out, ProxyContainer).Image != escape {
		t.Errorf("the values did not land verbatim: %v", env)
	}
}
