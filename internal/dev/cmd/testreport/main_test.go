package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestTheReportShowsFailuresAndListsSkipsThatPlainGoTestHides(t *testing.T) {
	events := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestPass"}`,
		`{"Action":"output","Package":"p","Test":"TestPass","Output":"    a_test.go:3: quiet\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestPass"}`,
		`{"Action":"run","Package":"p","Test":"TestCompose"}`,
		`{"Action":"output","Package":"p","Test":"TestCompose","Output":"=== RUN   TestCompose\n"}`,
		`{"Action":"output","Package":"p","Test":"TestCompose","Output":"    c_test.go:9: no Docker engine here\n"}`,
		`{"Action":"output","Package":"p","Test":"TestCompose","Output":"--- SKIP: TestCompose (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestCompose"}`,
		`{"Action":"run","Package":"p","Test":"TestBroken"}`,
		`{"Action":"output","Package":"p","Test":"TestBroken","Output":"    b_test.go:5: wrong answer\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestBroken"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}`,
		`{"Action":"fail","Package":"p"}`,
		`{"Action":"output","Package":"q","Output":"ok  \tq\t0.2s\n"}`,
		`{"Action":"pass","Package":"q"}`,
	}, "\n")
	var out strings.Builder
	failed, skipped, err := report(strings.NewReader(events), &out)
	if err != nil || !failed {
		t.Fatalf("failed=%v err=%v, want a failure reported", failed, err)
	}
	if want := []string{"p TestCompose: c_test.go:9: no Docker engine here"}; !slices.Equal(skipped, want) {
		t.Errorf("skipped %q, want %q", skipped, want)
	}
	text := out.String()
	for _, want := range []string{"wrong answer", "FAIL\tp", "ok  \tq", "1 test(s) skipped:", "no Docker engine here"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "quiet") {
		t.Errorf("a passing test's log was shown:\n%s", text)
	}
	if failed, _, _ := report(strings.NewReader(`{"Action":"pass","Package":"q"}`), &strings.Builder{}); failed {
		t.Error("a passing run was reported failed")
	}
}

// go test's own events, of a build that fails, are a failure.
func TestABuildFailureIsAFailure(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "mod", "init", "broken")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if err := writeFile(dir+"/b_test.go", "package broken\nfunc broken( {\n"); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("go", "test", "-json", "./...")
	cmd.Dir = dir
	raw, _ := cmd.CombinedOutput()
	var out strings.Builder
	failed, _, err := report(strings.NewReader(string(raw)), &out)
	if err != nil || !failed || !strings.Contains(out.String(), "b_test.go:2") {
		t.Fatalf("failed=%v err=%v:\n%s", failed, err, out.String())
	}
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o600) }
