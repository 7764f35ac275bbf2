package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPodAnnotationsAreReadAsTheDownwardAPIWritesThem(t *testing.T) {
	// Kubernetes' fieldpath.FormatMap: key=%q per line, sorted.
	annotations := map[string]string{
		"sidecar.istio.io/statsInclusionPrefixes": "cluster.outbound,http.{pod_ip}_",
		"sidecar.istio.io/statsHistogramBuckets":  `{"cluster.outbound": [1, 5, 10]}`,
		"example.com/multi-line":                  "a\nb \"quoted\" ü",
	}
	var b strings.Builder
	for _, k := range []string{"example.com/multi-line", "sidecar.istio.io/statsHistogramBuckets", "sidecar.istio.io/statsInclusionPrefixes"} {
		fmt.Fprintf(&b, "%s=%q\n", k, annotations[k])
	}
	path := filepath.Join(t.TempDir(), "annotations")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readPodAnnotations(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(annotations) {
		t.Fatalf("got %v", got)
	}
	for k, v := range annotations {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if got, err := readPodAnnotations(filepath.Join(t.TempDir(), "none")); err != nil || got != nil {
		t.Errorf("no file: %v, %v; want no annotations", got, err)
	}
}

func TestAMalformedOrOversizedAnnotationsFileIsRefusedWithTheReason(t *testing.T) {
	for want, text := range map[string]string{
		"line 2 is not key":  "a=\"1\"\nno-equals\n",
		"line 1 (a)":         "a=unquoted\n",
		"more than 1048576":  "a=\"" + strings.Repeat("x", maxPodAnnotations) + "\"\n",
		"line 1 is not key=": "=\"v\"\n",
		"the value is not q": "a=\"open\n",
	} {
		_, err := parsePodAnnotations(strings.NewReader(text))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", want, err)
		}
	}
}

func FuzzParsePodAnnotations(f *testing.F) {
	f.Add("a=\"1\"\nb=\"x\\ny\"\n")
	f.Add("=\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		got, err := parsePodAnnotations(strings.NewReader(text))
		if err != nil {
			return
		}
		// What parses says again what it read.
		var b strings.Builder
		for k, v := range got {
			fmt.Fprintf(&b, "%s=%q\n", k, v)
		}
		again, err := parsePodAnnotations(strings.NewReader(b.String()))
		if err != nil || len(again) != len(got) {
			t.Fatalf("%q: parsed %v, then %v (%v)", text, got, again, err)
		}
	})
}
