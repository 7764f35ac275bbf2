package analyze

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// kubeFiles are the Kubernetes objects of the files that Istio's
// analyzers of annotations, injection and Deployments read
// (pkg/config/analysis/analyzers/annotations, injection, deployment):
// Namespaces, Services, Pods and the workload controllers with their Pod
// templates. Live analysis does not hold them (galley serves Services
// and endpoints, not these objects): these checks run on files.
type kubeFiles struct {
	namespaces []objectAnnotations
	services   []*corev1.Service
	workloads  []podSource
}

// objectAnnotations is an object's metadata as the annotation checks
// read it.
type objectAnnotations struct {
	ref                 validation.Ref
	path                string // of the annotations, e.g. "metadata.annotations"
	kind                string // the resource type annotations name (Pod, Service, Namespace; other kinds take none)
	labels, annotations map[string]string
}

// podSource is a Pod, or a workload controller's Pod template.
type podSource struct {
	// meta is the object's own metadata (a Deployment's, not its
	// template's); for a Pod, the Pod's. Its ref names the object.
	meta objectAnnotations
	// template is the pod as created, with templatePath the prefix of
	// its fields ("" for a Pod, "spec.template." for a Deployment).
	template     *corev1.Pod
	templatePath string
}

func (k *kubeFiles) addNamespace(ref validation.Ref, n *corev1.Namespace) {
	k.namespaces = append(k.namespaces, objectAnnotations{ref: ref, path: "metadata.annotations", kind: "Namespace", labels: n.Labels, annotations: n.Annotations})
}

func (k *kubeFiles) addService(svc *corev1.Service) { k.services = append(k.services, svc) }

// addWorkload adds a Pod (templatePath "") or a controller's template.
func (k *kubeFiles) addWorkload(ref validation.Ref, meta objectAnnotations, tmpl corev1.PodTemplateSpec, templatePath string) {
	meta.ref, meta.path = ref, "metadata.annotations"
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Namespace = ref.Namespace
	k.workloads = append(k.workloads, podSource{meta: meta, template: pod, templatePath: templatePath})
}

// messages runs the checks over the files' objects; in gives the
// namespaces' labels (live: the cluster's, with the files' over them).
func (k *kubeFiles) messages(in validation.Input) []validation.Message {
	var out []validation.Message
	report := func(code validation.Code, ref validation.Ref, path, format string, args ...any) {
		out = append(out, validation.Message{Code: code, Object: ref, Path: path, Text: fmt.Sprintf(format, args...)})
	}
	annotated := slices.Clone(k.namespaces)
	for _, svc := range k.services {
		annotated = append(annotated, objectAnnotations{
			ref: validation.Ref{Kind: "Service", Namespace: svc.Namespace, Name: svc.Name}, path: "metadata.annotations", kind: "Service",
			labels: svc.Labels, annotations: svc.Annotations,
		})
	}
	for _, w := range k.workloads {
		annotated = append(annotated, w.meta)
		if w.templatePath != "" {
			annotated = append(annotated, objectAnnotations{
				ref: w.meta.ref, path: w.templatePath + "metadata.annotations", kind: "Pod",
				labels: w.template.Labels, annotations: w.template.Annotations,
			})
		}
	}
	defs := annotationsByName()
	for _, o := range annotated {
		checkAnnotations(o, defs, report)
	}
	for _, w := range k.workloads {
		k.checkWorkload(w, in, report)
	}
	slices.SortStableFunc(out, func(x, y validation.Message) int {
		return cmp.Or(
			cmp.Compare(x.Object.Kind, y.Object.Kind), cmp.Compare(x.Object.Namespace, y.Object.Namespace), cmp.Compare(x.Object.Name, y.Object.Name),
			cmp.Compare(x.Path, y.Path), cmp.Compare(x.Code, y.Code))
	})
	return out
}

// checkAnnotations is Istio's K8sAnalyzer (annotations.go): each
// annotation in Istio's namespace (*istio.io/, and
// kubernetes.io/ingress.class) must be one Istio defines (IST0108), on a
// resource type it is for (IST0107), and is reported when deprecated
// (IST0135). Istio's alpha-annotation analyzer (IST0136) is not in
// istioctl analyze's set (too noisy, its source says) and not here.
func checkAnnotations(o objectAnnotations, defs map[string]*annotation.Instance, report func(validation.Code, validation.Ref, string, string, ...any)) {
	for _, name := range slices.Sorted(maps.Keys(o.annotations)) {
		if !istioAnnotation(name) || alwaysIgnoredAnnotations[name] {
			continue
		}
		path := o.path + "[" + name + "]"
		def := defs[name]
		if def == nil {
			report(validation.CodeUnknownAnnotation, o.ref, path, "unknown annotation: %s", name)
			continue
		}
		if def.Deprecated {
			_, hasLabel := o.labels[inject.InjectLabel]
			if name != annotation.SidecarInject.Name || !hasLabel {
				extra := ""
				if name == annotation.SidecarInject.Name {
					extra = ` in favor of the "sidecar.istio.io/inject" label`
				}
				report(validation.CodeDeprecatedAnnotation, o.ref, path, "annotation %q has been deprecated%s and may not work in future Istio versions", name, extra)
			}
		}
		var attaches []string
		anywhere := false
		for _, r := range def.Resources {
			switch s := r.String(); s {
			case "Any":
				anywhere = true
			case "Unknown":
			default:
				attaches = append(attaches, s)
			}
		}
		if !anywhere && !slices.Contains(attaches, o.kind) {
			report(validation.CodeMisplacedAnnotation, o.ref, path, "misplaced annotation: %s can only be applied to %s", name, strings.Join(attaches, ", "))
		}
	}
}

// alwaysIgnoredAnnotations are written by Istio itself, never reported
// (Istio's maturity.AlwaysIgnoredAnnotations).
var alwaysIgnoredAnnotations = map[string]bool{
	annotation.SidecarStatus.Name:            true,
	annotation.GatewayControllerVersion.Name: true,
	annotation.IoIstioRev.Name:               true,
}

// istioAnnotation is Istio's istioAnnotation: in Istio's namespace, or
// the Kubernetes annotation Istio documents.
func istioAnnotation(name string) bool {
	if name == "kubernetes.io/ingress.class" {
		return true
	}
	prefix, _, _ := strings.Cut(name, "/")
	return strings.HasSuffix(prefix, "istio.io")
}

func annotationsByName() map[string]*annotation.Instance {
	m := map[string]*annotation.Instance{}
	for _, a := range annotation.AllResourceAnnotations() {
		m[a.Name] = a
	}
	return m
}

// checkWorkload checks one Pod or template: the injector's own reading of
// its annotations (IST0125), the application's user ID (IST0144), a
// manually injected proxy image no injector will fill in (IST0146,
// IST0147), and, for a workload the injector selects, the Services in
// front of it (IST0116, IST0137).
func (k *kubeFiles) checkWorkload(w podSource, in validation.Input, report func(validation.Code, validation.Ref, string, string, ...any)) {
	pod := w.template
	if _, controlPlane := w.meta.labels["istio"]; controlPlane || w.meta.labels["release"] == "istio" {
		return // Istio's IsIstioControlPlane: the analyzers skip it
	}
	if err := inject.CheckAnnotations(pod); err != nil {
		report(validation.CodeInvalidAnnotation, w.meta.ref, w.templatePath+"metadata.annotations", "the injector refuses to inject a pod with it: %v", err)
	}
	specPath := w.templatePath + "spec"
	if sc := pod.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == proxycontract.ProxyUID {
		report(validation.CodeInvalidApplicationUID, w.meta.ref, specPath+".securityContext.runAsUser", "user ID (UID) %d is reserved for the sidecar proxy", proxycontract.ProxyUID)
	}
	for i, c := range pod.Spec.Containers {
		if c.Name == inject.ProxyContainer || c.Name == "istio-operator" {
			continue
		}
		if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == proxycontract.ProxyUID {
			report(validation.CodeInvalidApplicationUID, w.meta.ref, fmt.Sprintf("%s.containers[%d].securityContext.runAsUser", specPath, i),
				"user ID (UID) %d is reserved for the sidecar proxy", proxycontract.ProxyUID)
		}
	}
	nsLabels, nsKnown := in.Namespaces[w.meta.ref.Namespace]
	if !nsKnown {
		// Whether the injector selects it depends on its namespace's
		// labels, which the input does not hold.
		return
	}
	injected, why := injectedByAny(pod, w.meta.ref.Namespace, nsLabels)
	for i, c := range pod.Spec.Containers {
		if c.Name != inject.ProxyContainer || c.Image != "auto" || injected {
			continue
		}
		code := validation.CodeImageAutoWithoutInjection
		if w.meta.ref.Kind == "Pod" {
			code = validation.CodeImageAutoPodWithoutInjection
		}
		report(code, w.meta.ref, fmt.Sprintf("%s.containers[%d].image", specPath, i), "%s %s contains `image: auto` but no injector selects it (%s): the container keeps that image and does not start", w.meta.ref.Kind, w.meta.ref.Name, why)
	}
	if injected {
		k.checkServices(w, report)
	}
}

// injectedByAny is whether some revision's injector injects pod: the
// one its namespace, else its own labels, name (Decide's rules), else the
// default revision's.
func injectedByAny(pod *corev1.Pod, namespace string, nsLabels map[string]string) (bool, string) {
	rev := controlplane.DefaultRevision
	if _, ok := nsLabels[inject.NamespaceLabel]; !ok {
		rev = cmp.Or(nsLabels[inject.RevisionLabel], pod.Labels[inject.RevisionLabel], rev)
	}
	return inject.Decide(pod, namespace, nsLabels, inject.Policy{Revision: rev})
}

// checkServices is Istio's ServiceAssociationAnalyzer
// (deployment/services.go) for an injected workload: the Services of its
// namespace whose selector matches its pods must not use one port with
// two protocols (IST0116), nor one targetPort for two ports (IST0137).
func (k *kubeFiles) checkServices(w podSource, report func(validation.Code, validation.Ref, string, string, ...any)) {
	var svcs []*corev1.Service
	for _, svc := range k.services {
		if svc.Namespace == w.meta.ref.Namespace && len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(w.template.Labels)) {
			svcs = append(svcs, svc)
		}
	}
	protocols := map[int32]map[corev1.Protocol][]string{}
	targets := map[string]map[int32][]string{}
	for _, svc := range svcs {
		name := svc.Namespace + "/" + svc.Name
		for _, p := range svc.Spec.Ports {
			proto := cmp.Or(p.Protocol, corev1.ProtocolTCP)
			if protocols[p.Port] == nil {
				protocols[p.Port] = map[corev1.Protocol][]string{}
			}
			protocols[p.Port][proto] = append(protocols[p.Port][proto], name)
			target := p.TargetPort.String()
			if target == "0" || target == "" {
				target = strconv.Itoa(int(p.Port))
			}
			if targets[target] == nil {
				targets[target] = map[int32][]string{}
			}
			targets[target][p.Port] = append(targets[target][p.Port], name)
		}
	}
	for _, port := range slices.Sorted(maps.Keys(protocols)) {
		if len(protocols[port]) < 2 {
			continue
		}
		var names, protos []string
		for _, proto := range slices.Sorted(maps.Keys(protocols[port])) {
			names = append(names, protocols[port][proto]...)
			protos = append(protos, string(proto))
		}
		slices.Sort(names)
		report(validation.CodeWorkloadPortProtocols, w.meta.ref, "metadata.name", "%s %s is associated with multiple services using port %d but different protocols (%s): %s",
			w.meta.ref.Kind, w.meta.ref.Name, port, strings.Join(protos, ", "), strings.Join(names, ", "))
	}
	for _, target := range slices.Sorted(maps.Keys(targets)) {
		if len(targets[target]) < 2 {
			continue
		}
		var names, ports []string
		for _, port := range slices.Sorted(maps.Keys(targets[target])) {
			names = append(names, targets[target][port]...)
			ports = append(ports, strconv.Itoa(int(port)))
		}
		slices.Sort(names)
		report(validation.CodeWorkloadConflictingPorts, w.meta.ref, "metadata.name", "%s %s is associated with multiple services %s using targetPort %q but different ports: %s",
			w.meta.ref.Kind, w.meta.ref.Name, strings.Join(slices.Compact(names), ", "), target, strings.Join(ports, ", "))
	}
}
