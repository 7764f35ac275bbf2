// Package binaries_test checks what every Flotilla binary has in common:
// --help, --version, the exit codes, configuration errors, and that each
// service module builds on its own outside the workspace (as image builds do).
package binaries_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const version = "v0.0.0-crosstest"

type binary struct {
	name  string // file name in bin/
	pkg   string // import path of its main package
	issue int    // the issue that builds the service; 0 for the CLI
}

var binaries = []binary{
	{"flotilla-galley", "github.com/flotilla-mesh/flotilla/services/galley/cmd/galley", 3},
	{"flotilla-discovery", "github.com/flotilla-mesh/flotilla/services/discovery/cmd/discovery", 4},
	{"flotilla-ca", "github.com/flotilla-mesh/flotilla/services/ca/cmd/ca", 5},
	{"flotilla-injector", "github.com/flotilla-mesh/flotilla/services/injector/cmd/injector", 6},
	{"flotilla-agent", "github.com/flotilla-mesh/flotilla/services/agent/cmd/agent", 6},
	{"flotilla", "github.com/flotilla-mesh/flotilla/cli/cmd/flotilla", 0},
}

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "flotilla-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := 1
	if err := buildAll(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildAll builds every binary the way `make build` does.
func buildAll(dir string) error {
	ldflags := "-X github.com/flotilla-mesh/flotilla/internal/platform/buildinfo.version=" + version +
		" -X github.com/flotilla-mesh/flotilla/internal/platform/buildinfo.commit=abc123"
	for _, b := range append(binaries, binary{"devrun", "github.com/flotilla-mesh/flotilla/internal/cmd/devrun", 0}) {
		cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", filepath.Join(dir, b.name), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", b.name, err, out)
		}
	}
	return nil
}

type result struct {
	code   int
	stdout string
	stderr string
}

func run(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	return result{code, out.String(), errOut.String()}
}

func TestEveryBinaryAnswersHelpAndVersion(t *testing.T) {
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			r := run(t, nil, b.name, "--version")
			want := b.name + " " + version + " (commit abc123, go"
			if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
				t.Fatalf("--version: exit %d, %q; want prefix %q", r.code, r.stdout, want)
			}
			r = run(t, nil, b.name, "--help")
			if r.code != 0 || !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stdout, b.name) {
				t.Fatalf("--help: exit %d, %q", r.code, r.stdout)
			}
		})
	}
}

func TestEveryServiceTakesTheSharedFlagsAndEnvironment(t *testing.T) {
	for _, b := range binaries {
		if b.issue == 0 {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			help := run(t, nil, b.name, "--help").stdout
			for _, want := range []string{"--config", "--log-level", "--log-format", "--admin-address", "--otlp-endpoint", "FLOTILLA_OTLP_ENDPOINT", "--shutdown-timeout"} {
				if !strings.Contains(help, want) {
					t.Errorf("--help lacks %s", want)
				}
			}
		})
	}
}

func TestServicesNotBuiltYetSaySoAndExitThree(t *testing.T) {
	for _, b := range binaries {
		if b.issue == 0 {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			r := run(t, nil, b.name, "--admin-address=127.0.0.1:0")
			want := fmt.Sprintf("is not built yet (tracked in issue #%d)", b.issue)
			if r.code != 3 || !strings.Contains(r.stderr, want) {
				t.Fatalf("exit %d, stderr %q; want 3 and %q", r.code, r.stderr, want)
			}
		})
	}
}

func TestBadConfigurationIsAUsageErrorInEveryService(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("log:\n  level: debug\nadminAdress: :1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown field in file", nil, []string{"--config", cfg}, "field adminAdress not found"},
		{"bad level in env", []string{"FLOTILLA_LOG_LEVEL=loud"}, nil, `log level "loud"`},
		{"bad duration flag", nil, []string{"--shutdown-timeout=soon"}, "soon"},
		{"bad admin address", nil, []string{"--admin-address=nowhere"}, "adminAddress"},
	}
	for _, b := range binaries {
		if b.issue == 0 {
			continue
		}
		for _, c := range cases {
			t.Run(b.name+"/"+c.name, func(t *testing.T) {
				r := run(t, c.env, b.name, c.args...)
				if r.code != 2 || !strings.Contains(r.stderr, c.want) {
					t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, c.want)
				}
			})
		}
	}
}

func TestMakeRunReportsWhichServicesAreNotBuiltYet(t *testing.T) {
	r := run(t, nil, "devrun", "--bin", binDir)
	if r.code != 0 {
		t.Fatalf("devrun exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"galley    | flotilla-galley: galley is not built yet",
		"not built yet: ",
		"no service is built yet: nothing is running",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("devrun output lacks %q:\n%s", want, r.stdout)
		}
	}
	for _, svc := range []string{"galley", "discovery", "ca", "injector"} {
		line := r.stdout[strings.Index(r.stdout, "not built yet: "):]
		if !strings.Contains(line, svc) {
			t.Errorf("summary %q does not list %s", line, svc)
		}
	}
}

func TestEachServiceModuleBuildsOutsideTheWorkspace(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{"services/galley", "services/discovery", "services/ca", "services/injector", "services/agent", "cli"} {
		t.Run(mod, func(t *testing.T) {
			cmd := exec.Command("go", "build", "-o", os.DevNull, "./...")
			cmd.Dir = filepath.Join(root, mod)
			cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("GOWORK=off go build ./... in %s: %v\n%s", mod, err, out)
			}
		})
	}
}
