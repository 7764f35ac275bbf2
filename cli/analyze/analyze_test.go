package analyze_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
	"github.com/flotilla-mesh/flotilla/cli/root"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// run runs `flotilla args...` with stdin and returns its output and exit
// code. Tests run it in testdata (t.Chdir), so that file names in the
// output are short.
func run(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := root.NewCommand()
	cmd.SetIn(strings.NewReader(stdin))
	code = root.Execute(t.Context(), cmd, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

// codes returns the codes of log lines.
func codes(out string) []validation.Code {
	var got []validation.Code
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if _, rest, ok := strings.Cut(l, "["); ok {
			c, _, _ := strings.Cut(rest, "]")
			got = append(got, validation.Code(c))
		}
	}
	return got
}

func TestADirectoryWithOneExampleOfEveryMessageGivesThemAllWithFileAndLine(t *testing.T) {
	t.Chdir("testdata")
	out, stderr, code := run(t, "", "analyze", "-R", "every-message")
	golden.Check(t, "every-message.golden", []byte(out), *update)
	if code != analyze.ExitFoundIssues {
		t.Errorf("exit code %d, want %d (errors found); stderr: %s", code, analyze.ExitFoundIssues, stderr)
	}
	if !strings.Contains(stderr, "at or above Error") {
		t.Errorf("stderr %q does not say why it failed", stderr)
	}
}

func TestWithoutRecursiveASubdirectoryIsNotRead(t *testing.T) {
	t.Chdir("testdata")
	out, _, _ := run(t, "", "analyze", "-f", "every-message")
	if strings.Contains(out, "gateway.yaml") {
		t.Errorf("read every-message/gateways without -R:\n%s", out)
	}
	// Its Gateway is gone, so the VirtualService names a missing one.
	if !strings.Contains(out, `gateway "bookinfo-gateway": there is no Gateway bookinfo/bookinfo-gateway`) {
		t.Errorf("the missing gateway is not reported:\n%s", out)
	}
}

func TestStandardInputAloneSaysWhichChecksItCouldNotRun(t *testing.T) {
	t.Chdir("testdata")
	in := `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: demo}
spec:
  hosts: [a]
  http:
  - route:
    - destination: {host: b}
`
	out, _, code := run(t, in, "analyze", "-o", "json", "-")
	var msgs []analyze.Output
	if err := json.Unmarshal([]byte(out), &msgs); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if len(msgs) != 2 || msgs[0].Code != validation.CodeAnalyzerSkipped || msgs[1].Code != validation.CodeAnalyzerSkipped {
		t.Fatalf("messages %+v: want the two skipped-check notes only (nothing is known of host b)", msgs)
	}
	if code != 0 {
		t.Errorf("exit code %d for Info messages, want 0", code)
	}
	// A warning fails at --failure-threshold Warning.
	in = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: demo}
spec:
  hosts: [a]
  http:
  - route:
    - destination: {host: b}
      weight: 50
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: b, namespace: demo}
spec:
  host: b
  trafficPolicy: {tls: {mode: DISABLE, sni: b.example.com}}
`
	out, _, code = run(t, in, "analyze", "--failure-threshold", "warning", "--output-threshold", "Warning", "-")
	if code != analyze.ExitFoundIssues || !slices.Equal(codes(out), []validation.Code{validation.CodeSchemaWarning, validation.CodeSchemaWarning}) {
		t.Errorf("exit %d, output:\n%s\nwant 79 and only the warnings (the notes are below the output threshold)", code, out)
	}
	if !strings.Contains(out, "(VirtualService demo/a <stdin>:9) spec.http[0].route[0].weight:") {
		t.Errorf("standard input is not named as the origin:\n%s", out)
	}
}

func TestEveryCodeIsProducedByTheTestdataAndDocumented(t *testing.T) {
	t.Chdir("testdata")
	seen := map[validation.Code]bool{}
	out, _, _ := run(t, "", "analyze", "-R", "every-message")
	for _, c := range codes(out) {
		seen[c] = true
	}
	out, _, _ = run(t, "kind: x", "analyze", "-")
	for _, c := range codes(out) {
		seen[c] = true
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "analyze.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range validation.Codes() {
		if !seen[c.Code] {
			t.Errorf("%s (%s): no test input produces it", c.Code, c.Name)
		}
		if !strings.Contains(string(doc), "| "+string(c.Code)+" | "+c.Name+" | "+c.Severity.String()+" |") {
			t.Errorf("docs/analyze.md has no row for %s %s %s", c.Code, c.Name, c.Severity)
		}
	}
}

func TestInputThatCannotBeReadIsAnErrorNotAFinding(t *testing.T) {
	t.Chdir("testdata")
	for name, args := range map[string][]string{
		"a missing file":        {"analyze", "no-such-file.yaml"},
		"no input":              {"analyze"},
		"an unknown output":     {"analyze", "-o", "xml", "every-message"},
		"an unknown threshold":  {"analyze", "--failure-threshold", "fatal", "every-message"},
		"an unknown threshold2": {"analyze", "--output-threshold", "", "every-message"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := run(t, "", args...)
			if code != 1 || stderr == "" {
				t.Errorf("exit %d, stderr %q: want 1 and a reason", code, stderr)
			}
		})
	}
}

func TestHostileInputIsReportedPerDocumentAndBounded(t *testing.T) {
	t.Chdir("testdata")
	big := strings.Repeat("# padding\n", (8<<20)/10+1)
	for name, in := range map[string]string{
		"larger than a file may be":                          big,
		"a document that is a list":                          "- a\n- b\n",
		"an unknown Istio kind":                              "apiVersion: networking.istio.io/v1\nkind: Nonsense\nmetadata: {name: x}\n",
		"a Service that is no Service":                       "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: nope}\n",
		"a Gateway that is no Gateway":                       "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: x}\nspec: {listeners: nope}\n",
		"an HTTPRoute with a field Kubernetes does not know": "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rulez: []}\n",
		"deeply nested flow":                                 strings.Repeat("[", 10000),
	} {
		t.Run(name, func(t *testing.T) {
			out, stderr, code := run(t, in, "analyze", "-")
			if code != analyze.ExitFoundIssues || !slices.Contains(codes(out), validation.CodeUnreadable) {
				t.Errorf("exit %d, output %q, stderr %q: want an unreadable-document error", code, clip(out), stderr)
			}
		})
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// The cases around Istio's annotation, image-auto and application-UID
// analyzers that the every-message directory does not show: what is not
// reported.
func TestTheWorkloadChecksLeaveAloneWhatIstiosLeaveAlone(t *testing.T) {
	t.Chdir("testdata")
	for name, c := range map[string]struct {
		yaml string
		want []validation.Code
	}{
		"the inject annotation beside the label of that name is not called deprecated": {
			yaml: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {sidecar.istio.io/inject: "true"}, annotations: {sidecar.istio.io/inject: "true"}}
spec: {containers: [{name: app, image: app}]}
`,
		},
		"an annotation Istio attaches to any kind, and those Istio writes itself": {
			yaml: `apiVersion: v1
kind: Service
metadata: {name: s, namespace: a, annotations: {networking.istio.io/exportTo: ".", istio.io/rev: canary, sidecar.istio.io/status: "{}"}}
spec: {selector: {app: s}, ports: [{name: http, port: 80}]}
`,
		},
		"a Service annotation on a Pod is misplaced": {
			yaml: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, annotations: {networking.istio.io/traffic-distribution: PreferClose}}
spec: {containers: [{name: app, image: app}]}
`,
			want: []validation.Code{validation.CodeMisplacedAnnotation},
		},
		"the control plane's own workloads are skipped, as Istio's IsIstioControlPlane": {
			yaml: `apiVersion: apps/v1
kind: Deployment
metadata: {name: gw, namespace: a, labels: {istio: ingressgateway}}
spec:
  selector: {matchLabels: {app: gw}}
  template:
    metadata: {labels: {app: gw}}
    spec: {securityContext: {runAsUser: 1337}, containers: [{name: istio-proxy, image: proxy}]}
`,
		},
		"the proxy container itself may run as 1337": {
			yaml: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {containers: [{name: app, image: app}, {name: istio-proxy, image: proxy, securityContext: {runAsUser: 1337}}]}
`,
		},
		"an application container running as 1337": {
			yaml: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {containers: [{name: app, image: app, securityContext: {runAsUser: 1337}}]}
`,
			want: []validation.Code{validation.CodeInvalidApplicationUID},
		},
		"image auto where the namespace's labels are not in the input is not judged": {
			yaml: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {containers: [{name: app, image: app}, {name: istio-proxy, image: auto}]}
`,
		},
		"image auto in a namespace a revision injects": {
			yaml: `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {istio.io/rev: canary}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {containers: [{name: app, image: app}, {name: istio-proxy, image: auto}]}
`,
		},
		"image auto in a pod that opts out of its namespace's injection": {
			yaml: `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {istio-injection: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {sidecar.istio.io/inject: "false"}}
spec: {containers: [{name: app, image: app}, {name: istio-proxy, image: auto}]}
`,
			want: []validation.Code{validation.CodeImageAutoPodWithoutInjection},
		},
		"Services with clashing ports in front of a workload no injector selects": {
			yaml: `apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {istio-injection: disabled}}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: a}
spec: {selector: {app: p}, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: s-udp, namespace: a}
spec: {selector: {app: p}, ports: [{name: udp, port: 80, protocol: UDP}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a, labels: {app: p}}
spec: {containers: [{name: app, image: app}]}
`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			out, _, _ := run(t, c.yaml, "analyze", "--output-threshold", "Info", "-")
			got := slices.DeleteFunc(codes(out), func(c validation.Code) bool {
				return c == validation.CodeAnalyzerSkipped || c == validation.CodeNamespaceNotInjected || c == validation.CodePortNameWithoutProtocol
			})
			if !slices.Equal(got, c.want) {
				t.Errorf("codes %v, want %v; output:\n%s", got, c.want, out)
			}
		})
	}
}
