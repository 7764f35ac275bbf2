package inject

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// The injection ConfigMap, in the control-plane namespace: galley reads it
// and publishes it to the injectors, so they watch nothing in the cluster.
// Its keys are Flotilla's (Istio's istio-sidecar-injector ConfigMap holds a
// differently shaped template), hence its own name.
const (
	// ConfigMapName is the default revision's ConfigMap; revision r reads
	// ConfigMapName + "-" + r.
	ConfigMapName = "flotilla-sidecar-injector"
	// ConfigMapTemplateKey holds the template (empty or absent: built-in).
	ConfigMapTemplateKey = "template"
	// ConfigMapValuesKey holds the values as YAML, laid over the built-in
	// values (empty or absent: built-in).
	ConfigMapValuesKey = "values"
	// MaxConfigBytes bounds the template and the values together.
	MaxConfigBytes = 512 << 10
)

// RevisionName is the name of revision's injection ConfigMap and
// MutatingWebhookConfiguration: ConfigMapName, or ConfigMapName-<revision>
// for a revision other than the default.
func RevisionName(revision string) string {
	if revision == "" || revision == controlplane.DefaultRevision {
		return ConfigMapName
	}
	return ConfigMapName + "-" + revision
}

// TagWebhookName is the MutatingWebhookConfiguration of revision tag
// tag, as istioctl tag names it.
func TagWebhookName(tag string) string { return "istio-revision-tag-" + tag }

// TagWebhooksOf selects the tag webhook configurations pointing at
// revision (as istioctl's GetWebhooksWithTag and the revision's label).
func TagWebhooksOf(revision string) string {
	return controlplane.TagLabel + "," + controlplane.RevisionLabel + "=" + cmp.Or(revision, controlplane.DefaultRevision)
}

// ConfigMapRevision returns the revision an injection ConfigMap is for, and
// whether name is an injection ConfigMap at all.
func ConfigMapRevision(name string) (string, bool) {
	if name == ConfigMapName {
		return controlplane.DefaultRevision, true
	}
	if rev, ok := strings.CutPrefix(name, ConfigMapName+"-"); ok && rev != "" {
		return rev, true
	}
	return "", false
}

// Config is a parsed injection configuration.
type Config struct {
	Template *Template
	Values   Values
}

// DefaultConfig is the built-in template and values for a revision.
func DefaultConfig(revision string) Config {
	c, err := ParseConfig(revision, "", "")
	if err != nil {
		panic("the built-in sidecar template is broken: " + err.Error())
	}
	return c
}

// ParseConfig parses an injection configuration: the template (empty: the
// built-in one of the sidecar the values choose) and values as YAML laid
// over that sidecar's built-in values (empty: the built-in values of
// Flotilla's sidecar). The revision is the values' unless they name
// another. To refuse a configuration that parses but cannot inject, it
// renders a probe pod, which must come out with the istio-proxy container
// (what marks a pod as injected).
func ParseConfig(revision, template, values string) (Config, error) {
	if n := len(template) + len(values); n > MaxConfigBytes {
		return Config{}, fmt.Errorf("injection configuration is %d bytes, more than the %d allowed", n, MaxConfigBytes)
	}
	// The sidecar is chosen first: it decides the defaults the values are
	// laid over, and the built-in template.
	var choice struct {
		Sidecar string `json:"sidecar"`
	}
	if strings.TrimSpace(values) != "" {
		if err := sigsyaml.Unmarshal([]byte(values), &choice); err != nil {
			return Config{}, fmt.Errorf("injection values: %w", err)
		}
	}
	sidecar := cmp.Or(choice.Sidecar, SidecarFlotilla)
	v, err := defaultValuesFor(sidecar, revision)
	if err != nil {
		return Config{}, fmt.Errorf("injection values: %w", err)
	}
	if template == "" {
		if template, err = BuiltinTemplate(sidecar); err != nil {
			return Config{}, err
		}
	}
	t, err := ParseTemplate(template)
	if err != nil {
		return Config{}, err
	}
	v.Revision = ""
	if strings.TrimSpace(values) != "" {
		if err := sigsyaml.UnmarshalStrict([]byte(values), &v); err != nil {
			return Config{}, fmt.Errorf("injection values: %w", err)
		}
	}
	switch {
	case v.Revision == "":
		v.Revision = revision
	case v.Revision != revision:
		return Config{}, fmt.Errorf("injection values name revision %q, but the configuration is revision %q's", v.Revision, revision)
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "probe"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	injected, err := t.Inject(probe, v)
	if err != nil {
		return Config{}, fmt.Errorf("injection configuration does not render: %w", err)
	}
	if !slices.ContainsFunc(injected.Spec.Containers, func(c corev1.Container) bool { return c.Name == ProxyContainer }) {
		return Config{}, errors.New("injection template renders no " + ProxyContainer + " container")
	}
	return Config{Template: t, Values: v}, nil
}

// ConfigFromFiles reads a template file and a values file (either may be
// empty: built-in) and parses them as ParseConfig does.
func ConfigFromFiles(revision, templateFile, valuesFile string) (Config, error) {
	var texts [2]string
	for i, path := range []string{templateFile, valuesFile} {
		if path == "" {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("injection configuration: %w", err)
		}
		texts[i] = string(data)
	}
	c, err := ParseConfig(revision, texts[0], texts[1])
	if err != nil {
		return Config{}, fmt.Errorf("%s %s: %w", templateFile, valuesFile, err)
	}
	return c, nil
}
