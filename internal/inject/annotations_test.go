package inject

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEveryIstioPodAnnotationIsListedWithWhatFlotillaDoes(t *testing.T) {
	all := PodAnnotations()
	if len(all) < 40 {
		t.Fatalf("%d annotations: Istio's list reads more", len(all))
	}
	names := map[string]bool{}
	for _, s := range all {
		names[s.Name] = true
		if s.How == "" {
			t.Errorf("%s says nothing of what Flotilla does", s.Name)
		}
	}
	// Every annotation said to be honoured or not is one of Istio's: a
	// renamed one would be silently dropped from the table.
	for _, m := range []map[string]string{honoured, notHonoured} {
		for n := range m {
			if !names[n] {
				t.Errorf("%s is not an annotation Istio reads on pods or namespaces", n)
			}
		}
	}
}

func TestDocsAnnotationsIsTheTable(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "annotations.md")
	if os.Getenv("FLOTILLA_UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, []byte(AnnotationsMarkdown()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != AnnotationsMarkdown() {
		t.Fatal("docs/annotations.md differs from internal/inject's table: run FLOTILLA_UPDATE_DOCS=1 go test -run TestDocsAnnotationsIsTheTable ./internal/inject")
	}
}

func TestOnlyIstioAnnotationsFlotillaDoesNotHonourAreWarnedOf(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		AnnotationProxyCPU:                         "100m", // honoured
		"sidecar.istio.io/bootstrapOverride":       "custom",
		"networking.istio.io/traffic-distribution": "PreferClose",
		"example.com/anything":                     "x", // not Istio's: never named
	}}}
	got := NotHonouredOn(pod)
	if len(got) != 2 || !strings.HasPrefix(got[0], "networking.istio.io/traffic-distribution is not honoured by Flotilla") ||
		!strings.HasPrefix(got[1], "sidecar.istio.io/bootstrapOverride is not honoured by Flotilla") {
		t.Fatalf("warnings %q", got)
	}
	if slices.ContainsFunc(got, func(w string) bool { return strings.Contains(w, "example.com") || strings.Contains(w, "proxyCPU") }) {
		t.Fatalf("warned of an annotation that is honoured or not Istio's: %q", got)
	}
}
