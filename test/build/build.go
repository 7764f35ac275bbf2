// Package build compiles Flotilla's binaries for the cross-service tests,
// the way `make build` does (static, version stamped).
package build

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

// Version is stamped into test builds.
const Version = "v0.0.0-crosstest"

// Packages maps binary names to their main packages.
var Packages = map[string]string{
	"flotilla-galley":    "github.com/flotilla-mesh/flotilla/services/galley/cmd/galley",
	"flotilla-discovery": "github.com/flotilla-mesh/flotilla/services/discovery/cmd/discovery",
	"flotilla-ca":        "github.com/flotilla-mesh/flotilla/services/ca/cmd/ca",
	"flotilla-injector":  "github.com/flotilla-mesh/flotilla/services/injector/cmd/injector",
	"xdsload":            "github.com/flotilla-mesh/flotilla/test/cmd/xdsload",
	"flotilla-agent":     "github.com/flotilla-mesh/flotilla/services/agent/cmd/agent",
	"flotilla":           "github.com/flotilla-mesh/flotilla/cli/cmd/flotilla",
	"flotilla-demo":      "github.com/flotilla-mesh/flotilla/examples/demo/cmd/flotilla-demo",
	"devrun":             "github.com/flotilla-mesh/flotilla/internal/dev/cmd/devrun",
	// fakeenvoy stands in for Envoy, which cannot be installed here.
	"fakeenvoy": "github.com/flotilla-mesh/flotilla/services/agent/envoy/testdata/fakeenvoy",
	// standinenvoy stands in for the Envoy Istio's pilot-agent starts.
	"standinenvoy": "github.com/flotilla-mesh/flotilla/test/istioagent/testdata/standinenvoy",
}

// Binaries builds the named binaries into dir.
func Binaries(dir string, names ...string) error {
	ldflags := "-X github.com/flotilla-mesh/flotilla/internal/platform/buildinfo.version=" + Version +
		" -X github.com/flotilla-mesh/flotilla/internal/platform/buildinfo.commit=abc123"
	for _, n := range names {
		pkg, ok := Packages[n]
		if !ok {
			return fmt.Errorf("unknown binary %q", n)
		}
		cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", filepath.Join(dir, n), pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", n, err, out)
		}
	}
	return nil
}

// RepoRoot is the directory holding go.work above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above %s", dir)
		}
		dir = parent
	}
}

// Main is the TestMain body of a package that tests built binaries: it
// builds names into a temporary directory, stores the directory in *dir,
// runs the tests (with a kube-apiserver and etcd in *env when env is not
// nil, see kubeenv.RunTests) and removes the directory. A failed build
// fails the run with the reason, never skips it.
func Main(m *testing.M, dir *string, env **kubeenv.Env, names ...string) int {
	d, err := buildTemp(names)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(d)
	*dir = d
	if env == nil {
		return m.Run()
	}
	return kubeenv.RunTests(m, env, kubeenv.Options{})
}

// binDirEnv hands the binaries' directory to the test binary re-executed
// in its network namespace.
const binDirEnv = "FLOTILLA_TEST_BIN_DIR"

// MainInNetworkNamespace is the TestMain body of a package that tests
// built binaries in a whole cluster (o.Cluster): the binaries are built
// first, where the module proxy is reachable, then the tests run with a
// kube-apiserver and the cluster in *env inside a network namespace of
// their own (kubeenv.RunInNetworkNamespace), where nothing is.
func MainInNetworkNamespace(m *testing.M, dir *string, env **kubeenv.Env, o kubeenv.Options, names ...string) int {
	if os.Getenv(binDirEnv) == "" {
		d, err := buildTemp(names)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(d)
		if err := os.Setenv(binDirEnv, d); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	*dir = os.Getenv(binDirEnv)
	return kubeenv.RunInNetworkNamespace(func() int { return kubeenv.RunTests(m, env, o) })
}

// buildTemp builds names into a new temporary directory; the caller
// removes it. Nothing is left behind when the build fails.
func buildTemp(names []string) (string, error) {
	d, err := os.MkdirTemp("", "flotilla-test-")
	if err != nil {
		return "", err
	}
	if err := Binaries(d, names...); err != nil {
		os.RemoveAll(d)
		return "", err
	}
	return d, nil
}
