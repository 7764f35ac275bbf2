// Package build compiles Flotilla's binaries for the cross-service tests,
// the way `make build` does (static, version stamped).
package build

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	"devrun":             "github.com/flotilla-mesh/flotilla/internal/cmd/devrun",
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
