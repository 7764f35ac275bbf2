package inject

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-mesh/flotilla/internal/appprobe"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// ProxyV2Image is the proxyv2 sidecar's built-in image: Istio's release
// whose injection templates proxyv2.yaml.tmpl follows.
const ProxyV2Image = "docker.io/istio/proxyv2:1.32.0"

// ProxyV2InitContainer is the proxyv2 sidecar's capture init container,
// as Istio's template names it.
const ProxyV2InitContainer = "istio-init"

// defaultValuesFor are the built-in values of a sidecar for a revision.
// Istio's sidecar finds the control plane by Istio's names: discovery at
// istiod[-<revision>].<namespace>.svc:15012 (the chart's Service of that
// name), and, with no CA address, its CSRs go there too (CA_ADDR is the
// discovery address, as Istio's template writes it).
func defaultValuesFor(sidecar, revision string) (Values, error) {
	v := DefaultValues()
	switch sidecar {
	case SidecarFlotilla:
	case SidecarProxyV2:
		v.Sidecar = SidecarProxyV2
		v.ProxyImage = ProxyV2Image
		v.DiscoveryAddress = IstiodAddress(controlplane.DefaultNamespace, revision)
		v.CAAddress = ""
	default:
		return v, fmt.Errorf("sidecar %q: want %s or %s", sidecar, SidecarFlotilla, SidecarProxyV2)
	}
	return v, nil
}

// IstiodAddress is where Istio's sidecars of revision find discovery:
// the Service Istio's chart names istiod (istiod-<revision> for a
// revision other than the default, controlplane.Istiod) in the system
// namespace, port 15012 (Istio's injection-template.yaml writes the same
// for CA_ADDR).
func IstiodAddress(namespace, revision string) string {
	return controlplane.Istiod(revision) + "." + namespace + ".svc:15012"
}

// Workload is what Istio's template calls the pod's DeploymentMeta and
// TypeMeta: the object the pod is of, for ISTIO_META_WORKLOAD_NAME and
// ISTIO_META_OWNER.
type Workload struct {
	Name, Namespace  string
	Kind, APIVersion string
}

// cronJobName is a Job's name as the CronJob controller makes it
// (Istio's pkg/kube cronJobNameRegexp).
var cronJobName = regexp.MustCompile(`(.+)-\d{8,10}$`)

// WorkloadOf guesses a pod's workload from its controller, as Istio's
// pkg/kube GetDeployMetaFromPod does for the webhook: a ReplicaSet named
// after the pod-template-hash is a Deployment's, a Job named with a
// schedule's timestamp a CronJob's; a pod with no generated name or no
// controller is its own workload.
func WorkloadOf(pod *corev1.Pod) Workload {
	w := Workload{Name: pod.Name, Namespace: pod.Namespace, Kind: "Pod", APIVersion: "v1"}
	if pod.GenerateName != "" {
		for _, ref := range pod.OwnerReferences {
			if ref.Controller == nil || !*ref.Controller {
				continue
			}
			w.Kind, w.APIVersion, w.Name = ref.Kind, ref.APIVersion, ref.Name
			switch hash := pod.Labels["pod-template-hash"]; {
			case ref.Kind == "ReplicaSet" && hash != "" && strings.HasSuffix(ref.Name, hash):
				w.Name, w.Kind, w.APIVersion = strings.TrimSuffix(ref.Name, "-"+hash), "Deployment", "apps/v1"
			case ref.Kind == "ReplicationController" && pod.Labels["deploymentconfig"] != "":
				w.Name, w.Kind = pod.Labels["deploymentconfig"], "DeploymentConfig"
			case ref.Kind == "Job":
				if m := cronJobName.FindStringSubmatch(ref.Name); m != nil {
					w.Name, w.Kind, w.APIVersion = m[1], "CronJob", "batch/v1"
				}
			}
			break
		}
	}
	w.Name = cmp.Or(w.Name, pod.Name)
	return w
}

// istioTemplateData is what the proxyv2 template needs beyond the values
// and the pod, computed here where Istio's template computes it with its
// own functions.
type istioTemplateData struct {
	// WorkloadName is ISTIO_META_WORKLOAD_NAME: the pod's
	// service.istio.io/workload-name label, or its workload's name.
	WorkloadName string
	// Owner is ISTIO_META_OWNER (empty: not set).
	Owner string
	// AppContainers is ISTIO_META_APP_CONTAINERS.
	AppContainers string
	// PodPorts is ISTIO_META_POD_PORTS: every container's ports as JSON.
	PodPorts string
	// ProxyConfig is PROXY_CONFIG: the discovery address with the pod's
	// proxy.istio.io/config laid over it, as JSON.
	ProxyConfig string
	// ExcludeInboundPorts is istio-iptables' -d: Envoy's ports, then the
	// excluded ports with the agent's status port (Istio's
	// excludeInboundPort template function).
	ExcludeInboundPorts string
	// MeshID is ISTIO_META_MESH_ID.
	MeshID string
	// ProxyMetadata is the proxy configuration's proxyMetadata, which
	// Istio's template also sets as the proxy's environment.
	ProxyMetadata map[string]string
	// DefaultContainer is the pod's first container of its own, which
	// kubectl's default-container annotations name.
	DefaultContainer string
	// CanonicalName and CanonicalRevision are the service.istio.io
	// canonical labels the template sets.
	CanonicalName, CanonicalRevision string
}

func istioData(pod *corev1.Pod, w Workload, v Values) (istioTemplateData, error) {
	d := istioTemplateData{
		WorkloadName: cmp.Or(pod.Labels["service.istio.io/workload-name"], w.Name),
		MeshID:       cmp.Or(v.MeshID, v.TrustDomain),
	}
	if w.APIVersion != "" && w.Name != "" {
		d.Owner = fmt.Sprintf("kubernetes://apis/%s/namespaces/%s/%ss/%s", w.APIVersion, cmp.Or(w.Namespace, "default"), strings.ToLower(w.Kind), w.Name)
	}
	var apps []string
	ports := []corev1.ContainerPort{}
	for _, c := range pod.Spec.Containers {
		if c.Name == ProxyContainer {
			continue
		}
		apps = append(apps, c.Name)
		ports = append(ports, c.Ports...)
	}
	d.AppContainers = strings.Join(apps, ",")
	if len(apps) > 0 {
		d.DefaultContainer = apps[0]
	}
	b, err := json.Marshal(ports)
	if err != nil {
		return d, fmt.Errorf("pod ports: %w", err)
	}
	d.PodPorts = string(b)

	pc := &meshv1alpha1.ProxyConfig{DiscoveryAddress: v.DiscoveryAddress}
	if v.ProxyConfig != "" {
		// Merged over the discovery address, as Istio lays the annotation
		// over the mesh's default proxy configuration.
		own := &meshv1alpha1.ProxyConfig{}
		if err := protojson.Unmarshal([]byte(v.ProxyConfig), own); err != nil {
			return d, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
		}
		proto.Merge(pc, own)
	}
	d.ProxyMetadata = pc.GetProxyMetadata()
	js, err := protojson.Marshal(pc)
	if err != nil {
		return d, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
	}
	// protojson varies its spacing from build to build: compacted, the
	// same pod renders the same text (and the same golden file).
	var compact bytes.Buffer
	if err := json.Compact(&compact, js); err != nil {
		return d, fmt.Errorf("%s: %w", AnnotationProxyConfig, err)
	}
	d.ProxyConfig = compact.String()

	excluded := splitList(v.ExcludeInboundPorts)
	status := fmt.Sprint(appprobe.AgentPort)
	if !slices.Contains(excluded, status) {
		excluded = append(excluded, status)
	}
	d.ExcludeInboundPorts = strings.Join(append([]string{"15090", "15021"}, excluded...), ",")

	d.CanonicalName, d.CanonicalRevision = CanonicalService(pod.Labels, w.Name)
	return d, nil
}

// CanonicalService is a workload's canonical service and revision
// (Istio's labels.CanonicalService, as its template and istioctl's
// workload entry configure set them): the label, else
// app.kubernetes.io/name, else app, else the workload's name, at most 63
// characters and trimmed of the characters a label value may not end
// with; the revision label, else app.kubernetes.io/version, else
// version, else "latest".
func CanonicalService(labels map[string]string, workload string) (name, revision string) {
	name = cmp.Or(labels["service.istio.io/canonical-name"], labels["app.kubernetes.io/name"], labels["app"], workload)
	if len(name) > 63 {
		name = name[:63]
	}
	return strings.Trim(name, "-_."), cmp.Or(labels["service.istio.io/canonical-revision"], labels["app.kubernetes.io/version"], labels["version"], "latest")
}
