package inject

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

func pod(mut func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app-1", Namespace: "shop", Labels: map[string]string{"app": "cart"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "cart", Containers: []corev1.Container{{Name: "app", Image: "cart:1"}}},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

func TestDecide(t *testing.T) {
	enabled := map[string]string{NamespaceLabel: "enabled"}
	canaryNS := map[string]string{RevisionLabel: "canary"}
	def := Policy{SystemNamespace: "istio-system"}
	canary := Policy{SystemNamespace: "istio-system", Revision: "canary"}
	label := func(k, v string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Labels[k] = v } }
	annotate := func(k, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Annotations = map[string]string{k: v} }
	}
	tests := []struct {
		name   string
		pod    *corev1.Pod
		ns     string
		labels map[string]string
		p      Policy
		want   bool
		why    string
	}{
		{"labelled namespace", pod(nil), "shop", enabled, def, true, "istio-injection=enabled"},
		{"unlabelled namespace", pod(nil), "shop", nil, def, false, "neither"},
		{"kube-system even if asked", pod(label(InjectLabel, "true")), "kube-system", enabled, def, false, "never injected"},
		{"the control plane", pod(nil), "istio-system", enabled, def, false, "never injected"},
		{"host network", pod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), "shop", enabled, def, false, "host network"},
		{"opt out by label", pod(label(InjectLabel, "false")), "shop", enabled, def, false, "label is false"},
		{"opt out by annotation", pod(annotate(InjectLabel, "false")), "shop", enabled, def, false, "annotation is false"},
		{"opt in by label", pod(label(InjectLabel, "true")), "shop", nil, def, true, "label is true"},
		{"opt in by label, Istio's spelling", pod(label(InjectLabel, "yes")), "shop", nil, def, true, "label is true"},
		// Istio's object webhook selects on the label: the annotation
		// alone reaches no injector.
		{"an annotation does not select a pod", pod(annotate(InjectLabel, "true")), "shop", nil, def, false, "label it"},
		{"label beats annotation", pod(func(p *corev1.Pod) {
			p.Labels[InjectLabel] = "false"
			p.Annotations = map[string]string{InjectLabel: "true"}
		}), "shop", enabled, def, false, "label is false"},
		{"namespace disabled", pod(nil), "shop", map[string]string{NamespaceLabel: "disabled"}, def, false, "disabled"},
		// Istio: "if either label is disabled, the pod is not injected".
		{"namespace disabled beats the pod's opt-in", pod(label(InjectLabel, "true")), "shop", map[string]string{NamespaceLabel: "disabled"}, def, false, "disabled"},
		{"istio.io/rev=default", pod(nil), "shop", map[string]string{RevisionLabel: "default"}, def, true, "istio.io/rev=default"},
		{"another revision's namespace", pod(nil), "shop", canaryNS, def, false, "revision canary"},
		{"already injected", pod(annotate(StatusAnnotation, "{}")), "shop", enabled, def, false, "already injected"},
		// Istio: a pod's own istio-proxy container customises the
		// injected one (Overrides).
		{"has its own istio-proxy", pod(func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: ProxyContainer})
		}), "shop", enabled, def, true, "istio-injection=enabled"},

		// Revision canary's injector.
		{"canary: its namespace", pod(nil), "shop", canaryNS, canary, true, "istio.io/rev=canary"},
		{"canary: its namespace, the pod opts out", pod(label(InjectLabel, "false")), "shop", canaryNS, canary, false, "label is false"},
		{"canary: its namespace, the pod opts in", pod(label(InjectLabel, "true")), "shop", canaryNS, canary, true, "istio.io/rev=canary"},
		// istio-injection wins over istio.io/rev, as Istio's selectors
		// give it precedence.
		{"canary: istio-injection=enabled is the default's", pod(nil), "shop", map[string]string{NamespaceLabel: "enabled", RevisionLabel: "canary"}, canary, false, "the default revision's"},
		{"default: istio-injection=enabled beats istio.io/rev", pod(nil), "shop", map[string]string{NamespaceLabel: "enabled", RevisionLabel: "canary"}, def, true, "istio-injection=enabled"},
		{"canary: a pod of its revision in an unlabelled namespace", pod(label(RevisionLabel, "canary")), "shop", nil, canary, true, "the pod has istio.io/rev=canary"},
		{"default: a canary pod in an unlabelled namespace", pod(label(RevisionLabel, "canary")), "shop", nil, def, false, "the pod is for revision canary"},
		// The namespace's revision wins over the pod's.
		{"canary: a canary pod in a default namespace", pod(label(RevisionLabel, "canary")), "shop", map[string]string{RevisionLabel: "default"}, canary, false, "namespace shop is for revision default"},
		{"canary: the default revision's opt-in", pod(label(InjectLabel, "true")), "shop", nil, canary, false, "asks the default revision"},
		{"canary: unlabelled", pod(nil), "shop", nil, canary, false, "neither"},
	}
	for _, tt := range tests {
		got, why := Decide(tt.pod, tt.ns, tt.labels, tt.p)
		if got != tt.want || !strings.Contains(why, tt.why) {
			t.Errorf("%s: %v (%s), want %v (…%s…)", tt.name, got, why, tt.want, tt.why)
		}
	}
}

func defaultTemplate(t *testing.T) *Template {
	t.Helper()
	tmpl, err := ParseTemplate(DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestTheDefaultSidecar(t *testing.T) {
	out, err := defaultTemplate(t).Inject(pod(nil), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	if names(out.Spec.InitContainers)[0] != InitContainer || !slices.Equal(names(out.Spec.Containers), []string{"app", ProxyContainer}) {
		t.Fatalf("init %v, containers %v", names(out.Spec.InitContainers), names(out.Spec.Containers))
	}
	// Istio's canonical service labels, from the app label.
	if out.Labels["service.istio.io/canonical-name"] != "cart" || out.Labels["service.istio.io/canonical-revision"] != "latest" || out.Labels["app"] != "cart" {
		t.Fatalf("labels %v", out.Labels)
	}
	init := out.Spec.InitContainers[0]
	if caps := init.SecurityContext.Capabilities.Add; !slices.Contains(caps, "NET_ADMIN") || !slices.Contains(caps, "NET_RAW") {
		t.Fatalf("init capabilities %v", caps)
	}
	if init.Args[0] != "iptables" || !slices.Contains(init.Args, "--include-outbound-ip-ranges=*") {
		t.Fatalf("init args %v", init.Args)
	}
	proxy := out.Spec.Containers[1]
	if *proxy.SecurityContext.RunAsUser != 1337 || proxy.ReadinessProbe.HTTPGet.Port.IntValue() != 15021 {
		t.Fatal("proxy user or readiness")
	}
	env := map[string]string{}
	for _, e := range proxy.Env {
		env[e.Name] = e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			env[e.Name] = e.ValueFrom.ResourceFieldRef.Resource
		}
	}
	for k, v := range map[string]string{
		"GOMEMLIMIT": "limits.memory",
		"POD_NAME":   "metadata.name", "POD_NAMESPACE": "metadata.namespace", "INSTANCE_IP": "status.podIP",
		"SERVICE_ACCOUNT": "spec.serviceAccountName", "TRUST_DOMAIN": "cluster.local", "CA_ADDRESS": "flotilla-ca.istio-system.svc:15013",
	} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range out.Spec.Volumes {
		vols[v.Name] = v
	}
	tok := vols["istio-token"].Projected.Sources[0].ServiceAccountToken
	if tok.Audience != "istio-ca" || *tok.ExpirationSeconds != 43200 {
		t.Fatalf("token volume %+v", tok)
	}
	if vols["istio-ca-root-cert"].ConfigMap.Name != "istio-ca-root-cert" || vols["workload-socket"].EmptyDir == nil {
		t.Fatal("root cert or socket volume")
	}
	if pi := vols["istio-podinfo"].DownwardAPI; pi == nil || len(pi.Items) != 1 || pi.Items[0].FieldRef.FieldPath != "metadata.annotations" {
		t.Fatalf("podinfo volume %+v: want the pod's annotations, which the agent reads", vols["istio-podinfo"])
	}
	var st Status
	if err := json.Unmarshal([]byte(out.Annotations[StatusAnnotation]), &st); err != nil || !slices.Equal(st.Containers, []string{ProxyContainer}) || len(st.Volumes) != 5 {
		t.Fatalf("status %q: %v", out.Annotations[StatusAnnotation], err)
	}
	if out.Labels[TLSModeLabel] != "istio" {
		t.Fatal("no tlsMode label")
	}
	// Injecting again is refused by the policy: once equals twice.
	if ok, _ := Decide(out, "shop", map[string]string{NamespaceLabel: "enabled"}, Policy{}); ok {
		t.Fatal("an injected pod would be injected again")
	}
}

func TestAnnotationsOverrideValues(t *testing.T) {
	p := pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{
			AnnotationProxyCPU: "250m", AnnotationProxyMemory: "256Mi", AnnotationProxyImage: "registry.local/agent:2",
			AnnotationLogLevel: "debug", AnnotationExcludeInbound: "9090, 9091", AnnotationExcludeOutboundPt: "3306",
			AnnotationIncludeOutbound: "10.0.0.0/8", AnnotationExcludeOutbound: "10.96.0.1/32",
			AnnotationProxyConfig:           "holdApplicationUntilProxyStarts: true",
			AnnotationDiscoveryAddress:      "discovery.canary.svc:15012",
			AnnotationReadinessInitialDelay: "5", AnnotationReadinessPeriod: "10", AnnotationReadinessFailures: "3",
			AnnotationInterceptionMode: "REDIRECT", AnnotationStatusPort: "15020", AnnotationNativeSidecar: "false",
		}
	})
	out, err := defaultTemplate(t).Inject(p, DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	proxy := out.Spec.Containers[0]
	if rp := proxy.ReadinessProbe; rp == nil || rp.InitialDelaySeconds != 5 || rp.PeriodSeconds != 10 || rp.FailureThreshold != 3 {
		t.Errorf("readiness probe %+v, want the annotations' 5, 10, 3", rp)
	}
	if !slices.Contains(proxy.Env, corev1.EnvVar{Name: "DISCOVERY_ADDRESS", Value: "discovery.canary.svc:15012"}) {
		t.Errorf("env %v: want the annotation's discovery address", proxy.Env)
	}
	if proxy.Name != ProxyContainer || proxy.Lifecycle == nil {
		t.Fatal("holdApplicationUntilProxyStarts: the proxy is not first with a postStart hook")
	}
	if proxy.Image != "registry.local/agent:2" || proxy.Resources.Requests.Cpu().String() != "250m" || proxy.Resources.Requests.Memory().String() != "256Mi" ||
		!slices.Contains(proxy.Args, "--log-level=debug") {
		t.Fatalf("proxy %v %v %v", proxy.Image, proxy.Resources.Requests, proxy.Args)
	}
	args := out.Spec.InitContainers[0].Args
	for _, want := range []string{"--exclude-inbound-ports=9090,9091", "--exclude-outbound-ports=3306", "--include-outbound-ip-ranges=10.0.0.0/8", "--exclude-outbound-ip-ranges=10.96.0.1/32"} {
		if !slices.Contains(args, want) {
			t.Errorf("init args %v lack %s", args, want)
		}
	}
	for key, bad := range map[string]string{
		AnnotationProxyCPU: "lots", AnnotationExcludeInbound: "99999", AnnotationExcludeOutboundPt: "http",
		AnnotationLogLevel: "chatty", AnnotationProxyConfig: "holdApplicationUntilProxyStarts: [",
		AnnotationDiscoveryAddress: "no-port", AnnotationReadinessPeriod: "0", AnnotationReadinessFailures: "-1",
		AnnotationReadinessInitialDelay: "99999999999",
		AnnotationExcludeIfaces:         "eth0 -j ACCEPT", AnnotationIncludeInbound: "http", AnnotationIncludeOutboundPt: "0",
		AnnotationRerouteIfaces:    "an-interface-name-too-long",
		AnnotationInterceptionMode: "TPROXY", AnnotationStatusPort: "15021", AnnotationNativeSidecar: "true",
	} {
		if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Annotations = map[string]string{key: bad} }), DefaultValues()); err == nil {
			t.Errorf("%s=%q accepted", key, bad)
		}
	}
}

func TestThePatchTurnsThePodIntoTheInjectedOne(t *testing.T) {
	tmpl := defaultTemplate(t)
	for name, p := range map[string]*corev1.Pod{
		"bare": pod(func(p *corev1.Pod) { p.Labels = nil }),
		"with init containers, volumes and annotations": pod(func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m"}}
			p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Annotations = map[string]string{"a/b~c": "x"}
		}),
		"held": pod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationProxyConfig: `{"holdApplicationUntilProxyStarts": true}`}
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "worker", Image: "w"})
		}),
		"with probes, held": probedPod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationProxyConfig: `{"holdApplicationUntilProxyStarts": true}`}
		}),
		"with probes": probedPod(nil),
		"proxyless": pod(func(p *corev1.Pod) {
			p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent}
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "KEEP", Value: "me"}}
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "worker", Image: "w"})
		}),
	} {
		injected, err := tmpl.Inject(p, DefaultValues())
		if err != nil {
			t.Fatal(err)
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
		want, _ := json.Marshal(injected)
		var a, b any
		_ = json.Unmarshal(applied, &a)
		_ = json.Unmarshal(want, &b)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: the patched pod differs from the injected one:\n%s\n%s", name, applied, want)
		}
	}
}

func TestABrokenTemplateIsAnError(t *testing.T) {
	if _, err := ParseTemplate("{{ .Values.Nope"); err == nil {
		t.Fatal("an unparsable template was accepted")
	}
	tmpl, err := ParseTemplate("containers: [{name: x, image: {{ .Values.NoSuchField }}}]")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Inject(pod(nil), DefaultValues()); err == nil {
		t.Fatal("a template naming a missing value rendered")
	}
	tmpl, _ = ParseTemplate("containers: {not: a list}")
	if _, err := tmpl.Inject(pod(nil), DefaultValues()); err == nil || !strings.Contains(err.Error(), "invalid YAML") {
		t.Fatalf("a template rendering the wrong shape: %v", err)
	}
}

func TestARunawayTemplateFailsInsteadOfGrowing(t *testing.T) {
	tmpl, err := ParseTemplate("containers: [{name: istio-proxy, image: x}]\n{{ range 100000000 }}# padding\n{{ end }}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Inject(pod(nil), DefaultValues()); err == nil || !strings.Contains(err.Error(), "renders more than") {
		t.Fatalf("rendered: %v", err)
	}
}

// TestHostileAnnotationsCannotChangeTheShapeOfWhatIsInjected: annotation
// values are data, never YAML or template text: they are quoted where
// they land, and the lists are checked.
func TestHostileAnnotationsCannotChangeTheShapeOfWhatIsInjected(t *testing.T) {
	escape := "x\"}\n  securityContext: {privileged: true}\n# "
	out, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationProxyImage: escape, AnnotationProxyConfig: "discoveryAddress: " + strconv.Quote(escape)}
	}), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	proxyConfigs := 0
	for _, c := range slices.Concat(out.Spec.InitContainers, out.Spec.Containers) {
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil {
			t.Fatalf("%s became privileged", c.Name)
		}
		if c.Name != "app" && c.Image != escape {
			t.Fatalf("%s: image %q, want the annotation verbatim", c.Name, c.Image)
		}
		for _, e := range c.Env {
			if e.Name != "PROXY_CONFIG" {
				continue
			}
			pc, err := istio.ParseProxyConfig([]byte(e.Value))
			if err != nil || pc.GetDiscoveryAddress() != escape {
				t.Fatalf("PROXY_CONFIG %q: %v, want the annotation's proxy config with its value verbatim", e.Value, err)
			}
			proxyConfigs++
		}
	}
	if proxyConfigs != 1 {
		t.Fatalf("PROXY_CONFIG in %d containers, want the proxy's", proxyConfigs)
	}
	// The pod's labels reach the agent as JSON, whatever they hold.
	labelled := pod(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "cart", "evil": escape} })
	sc, _, err := defaultTemplate(t).Render(labelled, DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	var labels map[string]string
	for _, e := range sc.Containers[0].Env {
		if e.Name == "ISTIO_METAJSON_LABELS" {
			if err := json.Unmarshal([]byte(e.Value), &labels); err != nil {
				t.Fatal(err)
			}
		}
	}
	if labels["app"] != "cart" || labels["evil"] != escape {
		t.Fatalf("ISTIO_METAJSON_LABELS gave %v", labels)
	}
	for _, bad := range [][2]string{
		{AnnotationIncludeOutbound, "10.0.0.0/8\n  - --evil"},
		{AnnotationIncludeOutbound, "{{ .Values.ProxyImage }}"},
		{AnnotationExcludeOutbound, "*"},
		{AnnotationExcludeInbound, "80\n- x"},
		{AnnotationLogLevel, "debug\n  privileged: true"},
		{AnnotationProxyCPU, "1\"\n  privileged: true"},
		{AnnotationProxyConfig, "{{ .Values }}: x"},
	} {
		if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Annotations = map[string]string{bad[0]: bad[1]} }), DefaultValues()); err == nil {
			t.Errorf("%s=%q accepted", bad[0], bad[1])
		}
	}
	if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationIncludeOutbound: "fd00::/8"}
	}), DefaultValues()); err == nil || !strings.Contains(err.Error(), "IPv6") {
		t.Errorf("an IPv6 range: %v", err)
	}
}

// TestAPodWithAThousandContainersIsInjected: size is no problem, the
// sidecar is added once.
func TestAPodWithAThousandContainersIsInjected(t *testing.T) {
	p := pod(func(p *corev1.Pod) {
		p.Spec.Containers = nil
		for i := range 1000 {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c" + strconv.Itoa(i), Image: "x"})
		}
	})
	out, err := defaultTemplate(t).Inject(p, DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Spec.Containers) != 1001 || out.Spec.Containers[1000].Name != ProxyContainer {
		t.Fatalf("%d containers", len(out.Spec.Containers))
	}
	patch, err := Patch(p, out)
	if err != nil || len(patch) == 0 {
		t.Fatalf("patch: %v", err)
	}
}

// TestInjectionsShareNothing: the decoded template output is memoised;
// changing one injected pod must not change the next.
func TestInjectionsShareNothing(t *testing.T) {
	tmpl := defaultTemplate(t)
	first, err := tmpl.Inject(pod(nil), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	proxy := &first.Spec.Containers[len(first.Spec.Containers)-1]
	proxy.Args[0] = "changed"
	proxy.Env[0].Value = "changed"
	first.Spec.InitContainers[0].SecurityContext.Capabilities.Add[0] = "SYS_ADMIN"
	second, err := tmpl.Inject(pod(nil), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	p2 := second.Spec.Containers[len(second.Spec.Containers)-1]
	if p2.Args[0] == "changed" || p2.Env[0].Value == "changed" || second.Spec.InitContainers[0].SecurityContext.Capabilities.Add[0] == "SYS_ADMIN" {
		t.Fatal("a change to one injected pod reached the next")
	}
}

// probedPod has an HTTP liveness probe on a named port, a TCP readiness
// probe, an exec startup probe and a gRPC container.
func probedPod(mut func(*corev1.Pod)) *corev1.Pod {
	return pod(func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{
			{
				Name: "web", Image: "web:1", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
					TimeoutSeconds: 3, PeriodSeconds: 7,
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(8080)}}},
				StartupProbe:   &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}},
			},
			{
				Name: "greeter", Image: "g:1",
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 50051}}},
				// A named port the container does not declare: left alone.
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("nope")}}},
			},
		}
		if mut != nil {
			mut(p)
		}
	})
}

func TestProbesArePointedAtTheAgentWhichGetsTheOriginals(t *testing.T) {
	tmpl := defaultTemplate(t)
	out, err := tmpl.Inject(probedPod(nil), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]corev1.Container{}
	for _, c := range out.Spec.Containers {
		byName[c.Name] = c
	}
	agentGet := func(path string) *corev1.HTTPGetAction {
		return &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(appprobe.AgentPort), Scheme: corev1.URISchemeHTTP}
	}
	web, greeter := byName["web"], byName["greeter"]
	if got := web.LivenessProbe; !reflect.DeepEqual(got.HTTPGet, agentGet("/app-health/web/livez")) || got.PeriodSeconds != 7 || got.TimeoutSeconds != 3 {
		t.Errorf("web liveness: %+v", got)
	}
	if got := web.ReadinessProbe.HTTPGet; !reflect.DeepEqual(got, agentGet("/app-health/web/readyz")) {
		t.Errorf("web readiness: %+v", got)
	}
	if web.StartupProbe.Exec == nil || web.StartupProbe.HTTPGet != nil {
		t.Errorf("an exec probe was rewritten: %+v", web.StartupProbe)
	}
	if !reflect.DeepEqual(greeter.LivenessProbe.HTTPGet, agentGet("/app-health/greeter/livez")) {
		t.Errorf("greeter liveness: %+v", greeter.LivenessProbe)
	}
	if greeter.ReadinessProbe.HTTPGet.Port.StrVal != "nope" {
		t.Errorf("a probe on an undeclared named port was rewritten: %+v", greeter.ReadinessProbe)
	}
	var probers map[string]appprobe.Prober
	for _, e := range byName["istio-proxy"].Env {
		if e.Name == appprobe.EnvVar {
			if err := json.Unmarshal([]byte(e.Value), &probers); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(probers) != 3 {
		t.Fatalf("originals given to the agent: %v", probers)
	}
	if h := probers["/app-health/web/livez"]; h.HTTPGet == nil || h.HTTPGet.Path != "/healthz" || h.HTTPGet.Port.Number() != 8080 || h.TimeoutSeconds != 3 {
		t.Errorf("web liveness original: %+v (the named port resolved to 8080)", h)
	}
	if h := probers["/app-health/web/readyz"]; h.TCPSocket == nil || h.TCPSocket.Port.Number() != 8080 {
		t.Errorf("web readiness original: %+v", h)
	}
	if h := probers["/app-health/greeter/livez"]; h.GRPC == nil || h.GRPC.Port != 50051 {
		t.Errorf("greeter liveness original: %+v", h)
	}

	// Turned off per pod, as in Istio.
	off, err := tmpl.Inject(probedPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationRewriteProbes: "false"}
	}), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	if off.Spec.Containers[0].LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("rewriteAppHTTPProbers false still rewrote: %+v", off.Spec.Containers[0].LivenessProbe)
	}
	if _, err := tmpl.Inject(probedPod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationRewriteProbes: "maybe"}
	}), DefaultValues()); err == nil {
		t.Error("rewriteAppHTTPProbers maybe was accepted")
	}
}

func TestTheGRPCAgentTemplateIsTheAgentWithoutEnvoyAndTheAppReadsItsFiles(t *testing.T) {
	p := pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationTemplates: TemplateGRPCAgent}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GRPC_XDS_BOOTSTRAP", Value: "/mine.json"}}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "worker", Image: "w"})
	})
	injected, err := defaultTemplate(t).Inject(p, DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	if len(injected.Spec.InitContainers) != 0 {
		t.Errorf("init containers %v: a proxyless pod's traffic is not captured", names(injected.Spec.InitContainers))
	}
	env := func(c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, e := range c.Env {
			out[e.Name] = e.Value
		}
		return out
	}
	mounts := func(c corev1.Container) map[string]string {
		out := map[string]string{}
		for _, m := range c.VolumeMounts {
			out[m.MountPath] = m.Name
		}
		return out
	}
	var proxy corev1.Container
	for _, c := range injected.Spec.Containers {
		if c.Name == ProxyContainer {
			proxy = c
		}
	}
	pe := env(proxy)
	if pe["DISABLE_ENVOY"] != "true" || pe["GRPC_XDS_BOOTSTRAP"] != "/etc/istio/proxy/grpc-bootstrap.json" || pe["OUTPUT_CERTS"] != "/var/lib/istio/data" {
		t.Errorf("the agent's environment %v", pe)
	}
	if proxy.ReadinessProbe.HTTPGet.Port.IntValue() != 15020 || len(proxy.Ports) != 0 {
		t.Errorf("the agent's readiness %v and ports %v: want the agent's own 15020 and no Envoy ports", proxy.ReadinessProbe.HTTPGet, proxy.Ports)
	}
	if mounts(proxy)["/var/lib/istio/data"] != "istio-data" {
		t.Errorf("the agent's mounts %v", mounts(proxy))
	}
	app, worker := injected.Spec.Containers[0], injected.Spec.Containers[1]
	if got := env(app)["GRPC_XDS_BOOTSTRAP"]; got != "/mine.json" {
		t.Errorf("the app's own GRPC_XDS_BOOTSTRAP became %q", got)
	}
	if got := env(worker)["GRPC_XDS_BOOTSTRAP"]; got != "/etc/istio/proxy/grpc-bootstrap.json" {
		t.Errorf("the worker's GRPC_XDS_BOOTSTRAP is %q", got)
	}
	for _, c := range []corev1.Container{app, worker} {
		m := mounts(c)
		if m["/etc/istio/proxy"] != "istio-envoy" || m["/var/lib/istio/data"] != "istio-data" {
			t.Errorf("%s mounts %v", c.Name, m)
		}
	}
	if !slices.ContainsFunc(injected.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "istio-data" }) {
		t.Error("no istio-data volume")
	}

	sidecar, err := defaultTemplate(t).Inject(pod(nil), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	if len(sidecar.Spec.InitContainers) != 1 || env(sidecar.Spec.Containers[0])["GRPC_XDS_BOOTSTRAP"] != "" {
		t.Error("the default template changed: want capture and no proxyless settings")
	}
	if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{AnnotationTemplates: "gateway"}
	}), DefaultValues()); err == nil || !strings.Contains(err.Error(), AnnotationTemplates) {
		t.Errorf("an unknown template: %v", err)
	}
}

func TestUserVolumesAreAddedToTheSidecarAsInIstio(t *testing.T) {
	out, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{
			AnnotationUserVolume:      `{"lua-libs": {"configMap": {"name": "lua-libs"}}, "certs": {"secret": {"secretName": "ext-certs"}}}`,
			AnnotationUserVolumeMount: `{"lua-libs": {"mountPath": "/var/lib/lua", "readOnly": true}, "certs": {"mountPath": "/etc/ext-certs"}}`,
		}
	}), DefaultValues())
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "lua-libs" })
	if i < 0 || out.Spec.Volumes[i].ConfigMap == nil || out.Spec.Volumes[i].ConfigMap.Name != "lua-libs" {
		t.Fatalf("volumes %v", out.Spec.Volumes)
	}
	proxy := out.Spec.Containers[slices.IndexFunc(out.Spec.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer })]
	mounted := func(want corev1.VolumeMount) bool {
		return slices.ContainsFunc(proxy.VolumeMounts, func(m corev1.VolumeMount) bool { return reflect.DeepEqual(m, want) })
	}
	if !mounted(corev1.VolumeMount{Name: "lua-libs", MountPath: "/var/lib/lua", ReadOnly: true}) || !mounted(corev1.VolumeMount{Name: "certs", MountPath: "/etc/ext-certs"}) {
		t.Fatalf("mounts %v", proxy.VolumeMounts)
	}
	var st Status
	if err := json.Unmarshal([]byte(out.Annotations[StatusAnnotation]), &st); err != nil || !slices.Contains(st.Volumes, "lua-libs") {
		t.Errorf("status %q: the user volumes must be recorded for removal", out.Annotations[StatusAnnotation])
	}
	many := map[string]any{}
	for i := range maxUserVolumes + 1 {
		many["v"+strconv.Itoa(i)] = map[string]any{"emptyDir": map[string]any{}}
	}
	tooMany, _ := json.Marshal(many)
	for name, a := range map[string]map[string]string{
		"not JSON":         {AnnotationUserVolume: `{"x": `},
		"unknown field":    {AnnotationUserVolume: `{"x": {"hostPathz": {"path": "/"}}}`},
		"an array":         {AnnotationUserVolume: `[{"name": "x", "emptyDir": {}}]`},
		"the sidecar's":    {AnnotationUserVolume: `{"istio-envoy": {"emptyDir": {}}}`},
		"no mount path":    {AnnotationUserVolumeMount: `{"x": {"readOnly": true}}`},
		"two values":       {AnnotationUserVolumeMount: `{"x": {"mountPath": "/x"}} {}`},
		"too many volumes": {AnnotationUserVolume: string(tooMany)},
	} {
		if _, err := defaultTemplate(t).Inject(pod(func(p *corev1.Pod) { p.Annotations = a }), DefaultValues()); err == nil {
			t.Errorf("%s: %v accepted", name, a)
		}
	}
}
