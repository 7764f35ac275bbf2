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

	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

type binary struct {
	name  string // file name in bin/
	issue int    // the issue that builds the service; 0 for the CLI
	built bool   // the service runs (rather than saying it is not built)
}

var binaries = []binary{
	{"flotilla-galley", 3, true},
	{"flotilla-discovery", 4, true},
	{"flotilla-ca", 5, true},
	{"flotilla-injector", 6, true},
	{"flotilla-agent", 6, false},
	{"flotilla", 0, false},
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
	names := []string{"devrun"}
	for _, b := range binaries {
		names = append(names, b.name)
	}
	if err := build.Binaries(dir, names...); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
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
			want := b.name + " " + build.Version + " (commit abc123, go"
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
		if b.issue == 0 || b.built {
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

func TestGalleyWithoutAClusterOrADirectorySaysWhatItNeeds(t *testing.T) {
	r := run(t, []string{"KUBERNETES_SERVICE_HOST="}, "flotilla-galley", "--admin-address=127.0.0.1:0", "--mcp-address=127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "no --config-dir, no --kubeconfig and not running in a cluster") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestGalleyRefusesAnInvalidMeshConfigFile(t *testing.T) {
	dir := t.TempDir()
	mesh := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(mesh, []byte("trustDomain: [not, a, string]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "flotilla-galley", "--config-dir", dir, "--mesh-config-file", mesh,
		"--admin-address=127.0.0.1:0", "--mcp-address=127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "mesh config "+mesh) {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
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

func TestMakeRunStartsWhatIsBuiltReportsTheRestAndStopsOnCtrlC(t *testing.T) {
	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "devrun"), "--bin", binDir, "--config-dir", filepath.Join(root, "examples"), "--state-dir", t.TempDir())
	var out proc.Output
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	for _, want := range []string{
		"msg=serving service=flotilla-galley source=files:",
		"msg=serving service=flotilla-discovery source=galley:127.0.0.1:15019",
		"msg=serving service=flotilla-ca",
		"msg=serving service=flotilla-injector",
	} {
		out.WaitFor(t, want)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("devrun after Ctrl-C: %v\n%s", err, out.String())
	}
	for _, want := range []string{"galley    | ", "msg=\"grpc server drained\"", "stopped: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "stopped: "); ok && (!strings.Contains(rest, "galley") || !strings.Contains(rest, "discovery") || !strings.Contains(rest, "ca") || !strings.Contains(rest, "injector")) {
			t.Errorf("stopped %q, want galley, discovery, ca and injector", rest)
		}
	}
}

func TestEachServiceModuleBuildsOutsideTheWorkspace(t *testing.T) {
	root, err := build.RepoRoot()
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
