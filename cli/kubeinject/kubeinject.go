// Package kubeinject is `flotilla kube-inject`: the sidecar injection the
// webhook does, done offline on YAML (Pods and the pod templates of
// Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs),
// for clusters without the webhook or to see what it would do.
package kubeinject

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// maxInput bounds what is read.
const maxInput = 32 << 20

// NewCommand returns the kube-inject command.
func NewCommand() *cobra.Command {
	var file, templateFile, valuesFile, revision string
	cmd := &cobra.Command{
		Use:   "kube-inject -f FILE",
		Short: "Add the sidecar to the pods of Kubernetes YAML, as the injection webhook would",
		Long: "kube-inject reads Kubernetes YAML (a file, or - for standard input) and writes it back with the sidecar added to " +
			"every Pod and pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob) that does not opt out " +
			"(sidecar.istio.io/inject: \"false\", hostNetwork) and is not injected already. Other objects pass unchanged.",
		Example: `  # inject a Deployment and apply it
  flotilla kube-inject -f deployment.yaml | kubectl apply -f -

  # from standard input, with a sidecar template and values of your own
  kubectl get deployment reviews -o yaml | flotilla kube-inject -f - --template-file template.yaml --values-file values.yaml

  # Istio's proxyv2 sidecar instead of Flotilla's (values.yaml: "sidecar: proxyv2")
  flotilla kube-inject -f deployment.yaml --values-file values.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := inject.ConfigFromFiles(revision, templateFile, valuesFile)
			if err != nil {
				return err
			}
			var in io.Reader
			if file == "-" {
				in = cmd.InOrStdin()
			} else {
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("input: %w", err)
				}
				defer f.Close()
				in = f
			}
			data, err := io.ReadAll(io.LimitReader(in, maxInput+1))
			if err != nil {
				return fmt.Errorf("input: %w", err)
			}
			if len(data) > maxInput {
				return fmt.Errorf("input is larger than %d bytes", maxInput)
			}
			out, err := Inject(data, cfg.Template, cfg.Values)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "YAML to inject, or - for standard input")
	cmd.Flags().StringVar(&templateFile, "template-file", "", "sidecar template; empty uses the built-in")
	cmd.Flags().StringVar(&valuesFile, "values-file", "", "template values (YAML) laid over the built-in ones; empty uses the built-in (sidecar: proxyv2 chooses Istio's proxyv2 sidecar and its template)")
	cmd.Flags().StringVar(&revision, "revision", controlplane.DefaultRevision, "revision recorded on injected pods")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

// Inject injects every document of a multi-document YAML stream.
func Inject(data []byte, tmpl *inject.Template, values inject.Values) ([]byte, error) {
	var docs [][]byte
	for i, doc := range splitDocs(data) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		out, err := injectDoc(doc, tmpl, values)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		docs = append(docs, out)
	}
	return bytes.Join(docs, []byte("---\n")), nil
}

func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur []string
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if strings.TrimRight(line, " \t\r\n") == "---" {
			docs = append(docs, []byte(strings.Join(cur, "")))
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, []byte(strings.Join(cur, "")))
}

// injectDoc injects one object; kinds without pods come back as they were
// (re-encoded).
func injectDoc(doc []byte, tmpl *inject.Template, values inject.Values) ([]byte, error) {
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if err := sigsyaml.Unmarshal(doc, &head); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	if head.Kind == "" {
		return nil, errors.New("no kind")
	}
	// The pod template's workload is the object itself, as Istio's
	// kube-inject (pkg/kube/inject's IntoObject) gives its template the
	// object's name and type: what Istio's proxyv2 sidecar reports as
	// ISTIO_META_WORKLOAD_NAME and ISTIO_META_OWNER.
	owner := &inject.Workload{Name: head.Metadata.Name, Namespace: head.Metadata.Namespace, Kind: head.Kind, APIVersion: head.APIVersion}
	switch head.APIVersion + " " + head.Kind {
	case "v1 Pod":
		var p corev1.Pod
		return podOf(doc, &p, func() (*metav1.ObjectMeta, *corev1.PodSpec) { return &p.ObjectMeta, &p.Spec }, nil, tmpl, values)
	case "apps/v1 Deployment":
		var d appsv1.Deployment
		return podOf(doc, &d, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec
		}, owner, tmpl, values)
	case "apps/v1 StatefulSet":
		var s appsv1.StatefulSet
		return podOf(doc, &s, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &s.Spec.Template.ObjectMeta, &s.Spec.Template.Spec
		}, owner, tmpl, values)
	case "apps/v1 DaemonSet":
		var d appsv1.DaemonSet
		return podOf(doc, &d, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec
		}, owner, tmpl, values)
	case "apps/v1 ReplicaSet":
		var r appsv1.ReplicaSet
		return podOf(doc, &r, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &r.Spec.Template.ObjectMeta, &r.Spec.Template.Spec
		}, owner, tmpl, values)
	case "batch/v1 Job":
		var j batchv1.Job
		return podOf(doc, &j, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &j.Spec.Template.ObjectMeta, &j.Spec.Template.Spec
		}, owner, tmpl, values)
	case "batch/v1 CronJob":
		var c batchv1.CronJob
		return podOf(doc, &c, func() (*metav1.ObjectMeta, *corev1.PodSpec) {
			return &c.Spec.JobTemplate.Spec.Template.ObjectMeta, &c.Spec.JobTemplate.Spec.Template.Spec
		}, owner, tmpl, values)
	}
	var any map[string]any
	if err := sigsyaml.Unmarshal(doc, &any); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	out, err := sigsyaml.Marshal(any)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return out, nil
}

// podOf decodes obj strictly, injects the pod its template (or itself)
// describes as owner's (nil: the pod's own), and encodes it again.
func podOf(doc []byte, obj any, pod func() (*metav1.ObjectMeta, *corev1.PodSpec), owner *inject.Workload, tmpl *inject.Template, values inject.Values) ([]byte, error) {
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	meta, spec := pod()
	p := &corev1.Pod{ObjectMeta: *meta, Spec: *spec}
	ns := p.Namespace
	if ns == "" {
		ns = "default"
	}
	// kube-inject is asked to inject: the namespace counts as enabled, and
	// only the pod's own opt-out, host networking or an earlier injection
	// keep it as it is.
	if ok, _ := inject.Decide(p, ns, map[string]string{inject.NamespaceLabel: "enabled"}, inject.Policy{}); ok {
		w := inject.WorkloadOf(p)
		w.Namespace = ns
		if owner != nil {
			w = *owner
			w.Namespace = cmp.Or(w.Namespace, "default")
		}
		injected, err := tmpl.InjectAs(p, w, values)
		if err != nil {
			return nil, err
		}
		*meta, *spec = injected.ObjectMeta, injected.Spec
	}
	out, err := sigsyaml.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return out, nil
}
