package inject

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigMapRevision(t *testing.T) {
	for name, want := range map[string]string{
		"flotilla-sidecar-injector":        "default",
		"flotilla-sidecar-injector-canary": "canary",
		"flotilla-sidecar-injector-":       "",
		"istio-sidecar-injector":           "",
		"istio":                            "",
	} {
		rev, ok := ConfigMapRevision(name)
		if rev != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", name, rev, ok, want)
		}
		if ok && RevisionName(rev) != name {
			t.Errorf("RevisionName(%q) = %s, want %s", rev, RevisionName(rev), name)
		}
	}
	if RevisionName("") != ConfigMapName {
		t.Errorf("no revision: %s", RevisionName(""))
	}
}

func TestParseConfig(t *testing.T) {
	proxyOnly := "containers:\n- name: istio-proxy\n  image: {{ quote .Values.ProxyImage }}\n"
	for _, tc := range []struct {
		name, revision, template, values string
		want                             func(Config) string // "" when as expected
		err                              string
	}{
		{name: "built-in", revision: "default", want: func(c Config) string {
			if c.Values != DefaultValues() {
				return "values differ from the built-in ones"
			}
			return ""
		}},
		{name: "values over the built-in", revision: "canary", values: "proxyImage: agent:2\nlogLevel: debug\n", want: func(c Config) string {
			want := DefaultValues()
			want.ProxyImage, want.LogLevel, want.Revision = "agent:2", "debug", "canary"
			if c.Values != want {
				return "values not laid over the built-in ones"
			}
			return ""
		}},
		{name: "own template", revision: "default", template: proxyOnly, want: func(c Config) string {
			p, err := c.Template.Inject(pod(nil), c.Values)
			if err != nil || len(p.Spec.InitContainers) != 0 || len(p.Spec.Containers) != 2 {
				return "the template was not used"
			}
			return ""
		}},
		{name: "values naming their revision", revision: "canary", values: "revision: canary\n"},
		{name: "values naming another revision", revision: "default", values: "revision: canary\n", err: `name revision "canary"`},
		{name: "unknown value", revision: "default", values: "proxyImg: x\n", err: "unknown field"},
		{name: "values not YAML", revision: "default", values: "[", err: "injection values"},
		{name: "template does not parse", revision: "default", template: "{{ .Values", err: "sidecar template"},
		{name: "template names a missing value", revision: "default", template: "containers: [{name: istio-proxy, image: {{ .Values.Nope }}}]", err: "does not render"},
		{name: "no proxy container", revision: "default", template: "containers: [{name: other, image: x}]", err: "no istio-proxy container"},
		{name: "bad value in values", revision: "default", values: "cpuRequest: lots\n", err: "does not render"},
		{name: "oversized", revision: "default", values: "# " + strings.Repeat("x", MaxConfigBytes), err: "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(tc.revision, tc.template, tc.values)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Values.Revision != tc.revision {
				t.Errorf("revision %q, want %q", c.Values.Revision, tc.revision)
			}
			if tc.want != nil {
				if msg := tc.want(c); msg != "" {
					t.Error(msg)
				}
			}
		})
	}
}

func TestConfigFromFiles(t *testing.T) {
	dir := t.TempDir()
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte("trustDomain: example.org\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ConfigFromFiles("default", "", values)
	if err != nil || c.Values.TrustDomain != "example.org" {
		t.Fatalf("%v %+v", err, c.Values)
	}
	if _, err := ConfigFromFiles("default", filepath.Join(dir, "missing.tmpl"), ""); err == nil || !strings.Contains(err.Error(), "missing.tmpl") {
		t.Fatalf("a missing template file: %v", err)
	}
}

// FuzzParseConfig: any template and values either parse into a
// configuration that injects, or are refused; never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add("", "proxyImage: x\n")
	f.Add("containers: [{name: istio-proxy, image: {{ quote .Values.ProxyImage }}}]", "")
	f.Add("{{ range .Pod.Spec.Containers }}{{ end }}", "logLevel: nope")
	f.Add(DefaultTemplate, "excludeInboundPorts: \"1,2,x\"\n")
	f.Add("", "sidecar: proxyv2\nexcludeInboundPorts: \"15020,9090\"\n")
	f.Add(ProxyV2Template, "sidecar: proxyv2\nagentLogLevel: \"ads:debug\"\n")
	f.Fuzz(func(t *testing.T, template, values string) {
		c, err := ParseConfig("default", template, values)
		if err != nil {
			return
		}
		if _, err := c.Template.Inject(pod(nil), c.Values); err != nil {
			t.Fatalf("accepted, but does not inject: %v", err)
		}
	})
}
