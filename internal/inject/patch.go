package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Op is one JSONPatch (RFC 6902) operation.
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Patch is the JSONPatch that turns orig into injected (as Inject made
// it: containers, init containers and volumes added, annotations and
// labels added or replaced).
func Patch(orig, injected *corev1.Pod) ([]byte, error) {
	var ops []Op
	ops = append(ops, mapOps("/metadata/annotations", orig.Annotations, injected.Annotations)...)
	ops = append(ops, mapOps("/metadata/labels", orig.Labels, injected.Labels)...)
	var err error
	var o []Op
	if o, err = listOps("/spec/initContainers", names(orig.Spec.InitContainers), injected.Spec.InitContainers, func(c corev1.Container) string { return c.Name }); err != nil {
		return nil, err
	}
	ops = append(ops, o...)
	if o, err = listOps("/spec/containers", names(orig.Spec.Containers), injected.Spec.Containers, func(c corev1.Container) string { return c.Name }); err != nil {
		return nil, err
	}
	ops = append(ops, o...)
	ops = append(ops, probeOps(orig.Spec.Containers, injected.Spec.Containers)...)
	volNames := make([]string, len(orig.Spec.Volumes))
	for i, v := range orig.Spec.Volumes {
		volNames[i] = v.Name
	}
	if o, err = listOps("/spec/volumes", volNames, injected.Spec.Volumes, func(v corev1.Volume) string { return v.Name }); err != nil {
		return nil, err
	}
	ops = append(ops, o...)
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("patch: %w", err)
	}
	return b, nil
}

// probeOps replaces the probes the injection rewrote in the pod's own
// containers, and sets their environment and mounts where the injection
// added to them, at their index after the additions.
func probeOps(orig, after []corev1.Container) []Op {
	var ops []Op
	for i, c := range after {
		j := slices.IndexFunc(orig, func(o corev1.Container) bool { return o.Name == c.Name })
		if j < 0 {
			continue
		}
		for _, pr := range []struct {
			field     string
			was, want *corev1.Probe
		}{
			{"livenessProbe", orig[j].LivenessProbe, c.LivenessProbe},
			{"readinessProbe", orig[j].ReadinessProbe, c.ReadinessProbe},
			{"startupProbe", orig[j].StartupProbe, c.StartupProbe},
		} {
			if pr.was != nil && pr.want != nil && !equality.Semantic.DeepEqual(pr.was, pr.want) {
				ops = append(ops, Op{Op: "replace", Path: fmt.Sprintf("/spec/containers/%d/%s", i, pr.field), Value: pr.want})
			}
		}
		// "add" sets a member whether or not it is there (RFC 6902).
		if !equality.Semantic.DeepEqual(orig[j].Env, c.Env) {
			ops = append(ops, Op{Op: "add", Path: fmt.Sprintf("/spec/containers/%d/env", i), Value: c.Env})
		}
		if !equality.Semantic.DeepEqual(orig[j].VolumeMounts, c.VolumeMounts) {
			ops = append(ops, Op{Op: "add", Path: fmt.Sprintf("/spec/containers/%d/volumeMounts", i), Value: c.VolumeMounts})
		}
	}
	return ops
}

func names(cs []corev1.Container) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Name
	}
	return out
}

// listOps adds the elements of after that orig lacks, each at its index
// in after: applied in order, each add leaves the array's prefix equal to
// after's, so insertions before, between and after orig's elements all
// land where they belong.
func listOps[T any](path string, orig []string, after []T, name func(T) string) ([]Op, error) {
	if len(orig) == 0 {
		if len(after) == 0 {
			return nil, nil
		}
		return []Op{{Op: "add", Path: path, Value: after}}, nil
	}
	var ops []Op
	j := 0 // next element of orig expected
	for i, e := range after {
		if j < len(orig) && name(e) == orig[j] {
			j++
			continue
		}
		if slices.Contains(orig, name(e)) {
			return nil, fmt.Errorf("%s: %s moved; only additions are patched", path, name(e))
		}
		ops = append(ops, Op{Op: "add", Path: fmt.Sprintf("%s/%d", path, i), Value: e})
	}
	if j != len(orig) {
		return nil, fmt.Errorf("%s: elements were removed; only additions are patched", path)
	}
	return ops, nil
}

// mapOps adds or replaces the keys after has that orig lacks or has with
// another value.
func mapOps(path string, orig, after map[string]string) []Op {
	if len(after) == 0 {
		return nil
	}
	if orig == nil {
		return []Op{{Op: "add", Path: path, Value: after}}
	}
	var ops []Op
	for _, k := range sortedKeys(after) {
		if v, ok := orig[k]; ok && v == after[k] {
			continue
		}
		ops = append(ops, Op{Op: "add", Path: path + "/" + escape(k), Value: after[k]})
	}
	return ops
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// escape a JSON Pointer segment (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
