package inject

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// Container overrides, as Istio's injector applies them
// (reapplyOverwrittenContainers): a container of the pod named as one the
// template adds (istio-proxy, the init container) is not a second
// container but the pod's customisation of the injected one, laid over
// it as a strategic merge (lists merged by their keys: env by name,
// mounts by path); its image "auto" keeps the template's. What was laid
// over is recorded in AnnotationOverrides, as Istio records it.
const (
	AnnotationOverrides = "proxy.istio.io/overrides"
	// AutoImage is the image a customising container names to keep the
	// injected one's (Istio's AutoImage).
	AutoImage = "auto"
)

// overridesRecord is AnnotationOverrides' JSON (Istio's ParsedContainers).
type overridesRecord struct {
	Containers     []corev1.Container `json:"containers,omitempty"`
	InitContainers []corev1.Container `json:"initContainers,omitempty"`
}

// applyOverrides lays the pod's containers named as the sidecar's over
// them and takes them out of the pod; it returns AnnotationOverrides'
// value ("" when there were none).
func applyOverrides(sc *Sidecar, pod *corev1.Pod) (string, error) {
	var rec overridesRecord
	merge := func(injected []corev1.Container, own *[]corev1.Container, record *[]corev1.Container) error {
		for i := range injected {
			j := slices.IndexFunc(*own, func(c corev1.Container) bool { return c.Name == injected[i].Name })
			if j < 0 {
				continue
			}
			overlay := *(*own)[j].DeepCopy()
			*record = append(*record, *overlay.DeepCopy())
			if overlay.Image == AutoImage {
				overlay.Image = ""
			}
			merged, err := mergeContainer(injected[i], overlay)
			if err != nil {
				return fmt.Errorf("the pod's own %s container: %w", injected[i].Name, err)
			}
			injected[i] = merged
			*own = slices.Delete(*own, j, j+1)
		}
		return nil
	}
	if err := merge(sc.Containers, &pod.Spec.Containers, &rec.Containers); err != nil {
		return "", err
	}
	if err := merge(sc.InitContainers, &pod.Spec.InitContainers, &rec.InitContainers); err != nil {
		return "", err
	}
	if len(rec.Containers) == 0 && len(rec.InitContainers) == 0 {
		return "", nil
	}
	js, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("%s: %w", AnnotationOverrides, err)
	}
	return string(js), nil
}

// mergeContainer is overlay laid over base as Kubernetes' strategic
// merge patch lays a container over another.
func mergeContainer(base, overlay corev1.Container) (corev1.Container, error) {
	b, err := json.Marshal(base)
	if err != nil {
		return base, err
	}
	o, err := json.Marshal(overlay)
	if err != nil {
		return base, err
	}
	merged, err := strategicpatch.StrategicMergePatch(b, o, corev1.Container{})
	if err != nil {
		return base, err
	}
	var out corev1.Container
	if err := json.Unmarshal(merged, &out); err != nil {
		return base, err
	}
	return out, nil
}
