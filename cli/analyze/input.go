package analyze

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/normalize/kube"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// Stdin names standard input among the files.
const Stdin = "-"

// DocumentKind is the kind of the messages about a document that is not
// an object: its Ref's name is "file:line".
const DocumentKind = "Document"

// Files is what local files hold, with where each object came from.
type Files struct {
	Objects   []*istio.Object
	Services  []*registryv1.Service
	Workloads []validation.Workload
	// Namespaces are the files' Namespace objects' labels, by name.
	Namespaces map[string]map[string]string
	// Messages are the documents that could not be read and the objects
	// defined twice.
	Messages []validation.Message
	// origins says where each object starts and how to find a field's
	// line in it.
	origins map[validation.Ref]*istio.Document
	// gateway are the Gateway API objects, and the Secrets and
	// namespaces their conversion reads.
	gateway *gatewayFiles
	// kube are the Kubernetes objects the annotation, injection and
	// Deployment checks read.
	kube kubeFiles
}

// Origin returns "file:line" of the message's object and field, or "" for
// an object that came from no file.
func (f *Files) Origin(m validation.Message) string {
	if f == nil {
		return ""
	}
	d := f.origins[m.Object]
	if d == nil {
		return ""
	}
	return fmt.Sprintf("%s:%d", d.File, d.LineOf(m.Path))
}

// ReadFiles reads files and directories (their .yaml, .yml and .json
// files; with recursive their subdirectories' too) and "-" for standard
// input. Objects without a namespace get namespace. What cannot be read
// as a whole (a missing file) is an error; a bad document is a message.
func ReadFiles(paths []string, recursive bool, stdin io.Reader, namespace, domainSuffix string) (*Files, error) {
	f := &Files{origins: map[validation.Ref]*istio.Document{}, gateway: newGatewayFiles(domainSuffix)}
	for _, p := range paths {
		if p == Stdin {
			data, err := io.ReadAll(io.LimitReader(stdin, istio.MaxFileBytes+1))
			if err != nil {
				return nil, fmt.Errorf("standard input: %w", err)
			}
			f.add("<stdin>", data, namespace, domainSuffix)
			continue
		}
		files, err := expand(p, recursive)
		if err != nil {
			return nil, err
		}
		for _, file := range files {
			data, err := readBounded(file)
			if err != nil {
				return nil, err
			}
			f.add(file, data, namespace, domainSuffix)
		}
	}
	return f, nil
}

func readBounded(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, istio.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

// expand lists a path's files: itself, or a directory's YAML and JSON
// files in lexical order.
func expand(path string, recursive bool) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	var out []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != path && (!recursive || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
			if !strings.HasPrefix(d.Name(), ".") {
				out = append(out, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

func (f *Files) add(file string, data []byte, namespace, domainSuffix string) {
	for _, d := range istio.DecodeWith(file, data, namespace, istio.DecodeOptions{KeepForeign: true}) {
		doc := d
		switch {
		case doc.Err != nil:
			ref := validation.Ref{Kind: DocumentKind, Name: fmt.Sprintf("%s:%d", file, doc.Line)}
			var de *istio.DecodeError
			reason := doc.Err.Error()
			if errors.As(doc.Err, &de) {
				reason = de.Reason
				if de.Object != "" {
					reason = de.Object + ": " + reason
				}
			}
			f.origins[ref] = &doc
			f.Messages = append(f.Messages, validation.Message{Code: validation.CodeUnreadable, Object: ref, Text: reason})
		case doc.Object != nil:
			ref := validation.Ref{Kind: doc.Object.Kind.Kind, Namespace: doc.Object.Meta.Namespace, Name: doc.Object.Meta.Name}
			if first := f.origins[ref]; first != nil {
				f.Messages = append(f.Messages, validation.Message{
					Code: validation.CodeInvalid, Object: ref,
					Text: fmt.Sprintf("defined again at %s:%d: that copy is not analyzed", file, doc.Line),
				})
				continue
			}
			f.origins[ref] = &doc
			f.Objects = append(f.Objects, doc.Object)
		case doc.Foreign != nil:
			f.foreign(&doc, namespace, domainSuffix)
		}
	}
}

// objectMeta is what every Kubernetes object has.
type objectMeta struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// foreign reads the Kubernetes kinds analysis uses (Services; Pods and
// the Pod templates of workload controllers) and skips the others.
func (f *Files) foreign(doc *istio.Document, namespace, domainSuffix string) {
	fr := doc.Foreign
	var meta objectMeta
	_ = json.Unmarshal(fr.JSON, &meta)
	ns := meta.Metadata.Namespace
	if ns == "" {
		ns = namespace
	}
	ref := validation.Ref{Kind: fr.Kind, Namespace: ns, Name: meta.Metadata.Name}
	group, _, _ := strings.Cut(fr.APIVersion, "/")
	if !strings.Contains(fr.APIVersion, "/") {
		group = ""
	}
	decode := func(into any) bool {
		dec := json.NewDecoder(bytes.NewReader(fr.JSON))
		if err := dec.Decode(into); err != nil {
			f.origins[ref] = doc
			f.Messages = append(f.Messages, validation.Message{Code: validation.CodeUnreadable, Object: ref, Text: fmt.Sprintf("not a %s: %v", fr.Kind, err)})
			return false
		}
		f.origins[ref] = doc
		return true
	}
	// workload adds a Pod or a controller's template (at path, the
	// prefix of its fields) with the controller's own metadata.
	workload := func(own metav1.ObjectMeta, tmpl corev1.PodTemplateSpec, path string) {
		f.Workloads = append(f.Workloads, validation.Workload{Kind: fr.Kind, Namespace: ns, Name: meta.Metadata.Name, Labels: maps.Clone(tmpl.Labels)})
		f.kube.addWorkload(ref, objectAnnotations{kind: fr.Kind, labels: own.Labels, annotations: own.Annotations}, tmpl, path)
	}
	switch {
	case group == gatewayapi.Group:
		f.origins[ref] = doc
		if err := f.gateway.addObject(fr.JSON, ns); err != nil {
			f.Messages = append(f.Messages, validation.Message{Code: validation.CodeUnreadable, Object: ref, Text: fmt.Sprintf("not a %s: %v", fr.Kind, err)})
		}
	case group == "" && fr.Kind == "Secret":
		var sec corev1.Secret
		if decode(&sec) {
			sec.Namespace = ns
			f.gateway.addSecret(&sec)
		}
	case group == "" && fr.Kind == "ConfigMap":
		var cm corev1.ConfigMap
		if decode(&cm) {
			cm.Namespace = ns
			f.gateway.addConfigMap(&cm)
		}
	case group == "" && fr.Kind == "Namespace":
		var n corev1.Namespace
		if decode(&n) {
			f.gateway.addNamespace(&n)
			if f.Namespaces == nil {
				f.Namespaces = map[string]map[string]string{}
			}
			f.Namespaces[n.Name] = maps.Clone(n.Labels)
			f.kube.addNamespace(validation.Ref{Kind: "Namespace", Name: n.Name}, &n)
		}
	case group == "" && fr.Kind == "Service":
		var svc corev1.Service
		if decode(&svc) {
			svc.Namespace = ns
			f.Services = append(f.Services, kube.Service(&svc, domainSuffix, "Kubernetes")) // Istio's default cluster ID
			f.kube.addService(&svc)
		}
	case group == "" && fr.Kind == "Pod":
		var pod corev1.Pod
		if decode(&pod) {
			workload(pod.ObjectMeta, corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}, "")
		}
	case group == "apps" && slices.Contains([]string{"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"}, fr.Kind):
		var w struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Spec     struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if decode(&w) {
			workload(w.Metadata, w.Spec.Template, "spec.template.")
		}
	case group == "batch" && fr.Kind == "Job":
		var j batchv1.Job
		if decode(&j) {
			workload(j.ObjectMeta, j.Spec.Template, "spec.template.")
		}
	case group == "batch" && fr.Kind == "CronJob":
		var j batchv1.CronJob
		if decode(&j) {
			workload(j.ObjectMeta, j.Spec.JobTemplate.Spec.Template, "spec.jobTemplate.spec.template.")
		}
	}
}
