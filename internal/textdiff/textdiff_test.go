package textdiff

import (
	"strings"
	"testing"
)

func TestDiffShowsEachChangeWithItsContextAndLine(t *testing.T) {
	want := strings.Join([]string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"}, "\n")
	got := strings.Join([]string{"a", "b", "c", "d", "e", "F", "g", "h", "i", "j", "k", "l", "m", "n"}, "\n")
	d := Diff(want, got)
	for _, line := range []string{"@@ line 3\n  c\n  d\n  e\n- f\n+ F\n  g", "@@ line 11\n  k\n  l\n  m\n+ n"} {
		if !strings.Contains(d, line+"\n") {
			t.Errorf("diff lacks %q:\n%s", line, d)
		}
	}
	if strings.Contains(d, "  a\n") {
		t.Errorf("diff shows a line four away from any change:\n%s", d)
	}
}

func TestDiffOfEqualInputsIsEmpty(t *testing.T) {
	if d := Diff("x\ny\n", "x\ny\n"); d != "" {
		t.Fatalf("diff of equal inputs: %q", d)
	}
}

func TestDiffOfInputsTooLargeForTheTableStillShowsTheChange(t *testing.T) {
	big := strings.Repeat("same\n", 5000)
	want := big + strings.Repeat("w\n", 5000) + big
	got := big + strings.Repeat("g\n", 5000) + big
	d := Diff(want, got)
	if !strings.Contains(d, "- w\n") || !strings.Contains(d, "+ g\n") || !strings.Contains(d, "@@ line 4998\n") {
		t.Fatalf("diff misses the change: %.300s", d)
	}
}
