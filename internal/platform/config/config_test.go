package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

type logOpts struct {
	Format string `yaml:"format" usage:"log format"`
	Level  string `yaml:"level"`
}

type Common struct {
	Log          logOpts `yaml:"log"`
	OTLPEndpoint string  `yaml:"otlpEndpoint"`
}

type testConfig struct {
	Common          `yaml:",inline"`
	ListenAddress   string            `yaml:"listenAddress"`
	ShutdownTimeout time.Duration     `yaml:"shutdownTimeout"`
	Replicas        int               `yaml:"replicas"`
	MaxBytes        uint32            `yaml:"maxBytes"`
	Ratio           float64           `yaml:"ratio"`
	Debug           bool              `yaml:"debug"`
	Namespaces      []string          `yaml:"namespaces"`
	Labels          map[string]string `yaml:"labels"`
	Ignored         string            `yaml:"-"`
}

func (c *testConfig) Validate() error {
	if c.Replicas < 0 {
		return errors.New("replicas must not be negative")
	}
	return nil
}

func defaults() testConfig {
	return testConfig{
		Common:          Common{Log: logOpts{Format: "json", Level: "info"}},
		ListenAddress:   ":15010",
		ShutdownTimeout: 10 * time.Second,
		Replicas:        1,
		Labels:          map[string]string{"app": "flotilla"},
	}
}

func noEnv(string) (string, bool) { return "", false }

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func bind(t *testing.T, args ...string) *Binding[testConfig] {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	b, err := Bind(fs, defaults, "FLOTILLA_")
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEveryLeafFieldGetsAFlagAndAnEnvironmentVariable(t *testing.T) {
	got := bind(t).Fields()
	want := [][3]string{
		{"log.format", "--log-format", "FLOTILLA_LOG_FORMAT"},
		{"log.level", "--log-level", "FLOTILLA_LOG_LEVEL"},
		{"otlpEndpoint", "--otlp-endpoint", "FLOTILLA_OTLP_ENDPOINT"},
		{"listenAddress", "--listen-address", "FLOTILLA_LISTEN_ADDRESS"},
		{"shutdownTimeout", "--shutdown-timeout", "FLOTILLA_SHUTDOWN_TIMEOUT"},
		{"replicas", "--replicas", "FLOTILLA_REPLICAS"},
		{"maxBytes", "--max-bytes", "FLOTILLA_MAX_BYTES"},
		{"ratio", "--ratio", "FLOTILLA_RATIO"},
		{"debug", "--debug", "FLOTILLA_DEBUG"},
		{"namespaces", "--namespaces", "FLOTILLA_NAMESPACES"},
		{"labels", "--labels", "FLOTILLA_LABELS"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("fields (-want +got):\n%s", d)
	}
}

func TestDefaultsApplyWhenNothingElseIsGiven(t *testing.T) {
	got, err := bind(t).Load("", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(defaults(), got, cmp.AllowUnexported(testConfig{})); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestLaterSourcesOverrideEarlierOnes(t *testing.T) {
	file := writeFile(t, `
log:
  level: debug
  format: text
listenAddress: 127.0.0.1:1
replicas: 3
shutdownTimeout: 30s
namespaces: [a, b]
`)
	b := bind(t, "--replicas=5", "--listen-address=127.0.0.1:2", "--debug")
	got, err := b.Load(file, env(map[string]string{
		"FLOTILLA_LISTEN_ADDRESS": "127.0.0.1:3",
		"FLOTILLA_LABELS":         "tier=cp,team=mesh",
		"FLOTILLA_MAX_BYTES":      "4096",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.Log = logOpts{Format: "text", Level: "debug"}            // file
	want.ShutdownTimeout = 30 * time.Second                       // file
	want.Namespaces = []string{"a", "b"}                          // file
	want.Replicas = 5                                             // flag over file
	want.Debug = true                                             // flag
	want.ListenAddress = "127.0.0.1:3"                            // env over flag over file
	want.Labels = map[string]string{"tier": "cp", "team": "mesh"} // env replaces
	want.MaxBytes = 4096                                          // env
	if d := cmp.Diff(want, got, cmp.AllowUnexported(testConfig{})); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestLoadDoesNotLeakStateIntoDefaults(t *testing.T) {
	file := writeFile(t, "labels:\n  extra: x\n")
	b := bind(t)
	if _, err := b.Load(file, noEnv); err != nil {
		t.Fatal(err)
	}
	got, err := b.Load("", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Labels["extra"]; ok {
		t.Fatalf("a previous load changed the defaults: %v", got.Labels)
	}
}

func TestUnknownFileFieldIsAnErrorNamingTheFieldAndLine(t *testing.T) {
	file := writeFile(t, "replicas: 2\nlistenAdress: x\n")
	_, err := bind(t).Load(file, noEnv)
	if err == nil {
		t.Fatal("want error for unknown field")
	}
	for _, want := range []string{"listenAdress", "line 2", file} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestBadInputIsRejectedWithTheSourceNamed(t *testing.T) {
	tests := map[string]struct {
		file string
		env  map[string]string
		want string
	}{
		"wrong type in file":     {file: "replicas: many\n", want: "line 1: cannot unmarshal !!str `many` into int"},
		"bad duration in file":   {file: "debug: true\nshutdownTimeout: soon\n", want: "line 2: cannot unmarshal !!str `soon` into time.Duration"},
		"two documents":          {file: "replicas: 1\n---\nreplicas: 2\n", want: "more than one YAML document"},
		"not yaml":               {file: "{{{{", want: "config file"},
		"bad integer in env":     {env: map[string]string{"FLOTILLA_REPLICAS": "1e9x"}, want: "FLOTILLA_REPLICAS"},
		"overflowing uint32 env": {env: map[string]string{"FLOTILLA_MAX_BYTES": "99999999999"}, want: "FLOTILLA_MAX_BYTES"},
		"bad bool in env":        {env: map[string]string{"FLOTILLA_DEBUG": "yes please"}, want: "FLOTILLA_DEBUG"},
		"bad map in env":         {env: map[string]string{"FLOTILLA_LABELS": "novalue"}, want: "key=value"},
		"validation fails":       {env: map[string]string{"FLOTILLA_REPLICAS": "-1"}, want: "invalid configuration: replicas must not be negative"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			_, err := bind(t).Load(path, env(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestOversizedFileIsRejected(t *testing.T) {
	file := writeFile(t, "listenAddress: "+strings.Repeat("x", MaxFileBytes)+"\n")
	_, err := bind(t).Load(file, noEnv)
	if err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v, want size error", err)
	}
}

func TestEmptyFileChangesNothing(t *testing.T) {
	got, err := bind(t).Load(writeFile(t, ""), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got.ListenAddress != ":15010" {
		t.Fatalf("got %q", got.ListenAddress)
	}
}

func TestMissingFileIsAnError(t *testing.T) {
	_, err := bind(t).Load(filepath.Join(t.TempDir(), "nope.yaml"), noEnv)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not-exist", err)
	}
}

func TestUnsupportedFieldTypeIsReportedAtBind(t *testing.T) {
	type bad struct {
		Ch chan int `yaml:"ch"`
	}
	_, err := Bind(pflag.NewFlagSet("x", pflag.ContinueOnError), func() bad { return bad{} }, "FLOTILLA_")
	if err == nil || !strings.Contains(err.Error(), "ch") {
		t.Fatalf("err = %v", err)
	}
}

func TestKebabCase(t *testing.T) {
	tests := map[string]string{
		"otlpEndpoint":  "otlp-endpoint",
		"OTLPEndpoint":  "otlp-endpoint",
		"maxRecvMsgMiB": "max-recv-msg-mi-b",
		"http2Port":     "http2-port",
		"level":         "level",
		"servingIPs":    "serving-ips",
		"caBundleURLs":  "ca-bundle-urls",
		"clusterID":     "cluster-id",
		"defaultTTL":    "default-ttl",
		"isTLS":         "is-tls",
	}
	for in, want := range tests {
		if got := kebab([]string{in}); got != want {
			t.Errorf("kebab(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzLoadFile(f *testing.F) {
	f.Add("replicas: 2\nlog: {level: debug}\n")
	f.Add("labels: {a: b}\nnamespaces: [x]\n")
	f.Add("&a [*a, *a]")
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
		b, err := Bind(fs, defaults, "FLOTILLA_")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = b.Load(p, noEnv) // must not panic
	})
}
