// Package buildinfo reports the version a binary was built as. The Makefile
// stamps the version and commit with -ldflags "-X"; a plain `go build` falls
// back to the module and VCS information Go records in the binary.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker: -X github.com/flotilla-mesh/flotilla/internal/platform/buildinfo.version=v0.1.0.
// These are the only package-level variables the linker can reach.
var (
	version = ""
	commit  = ""
)

// Info describes a build.
type Info struct {
	Version   string
	Commit    string
	GoVersion string
}

// Get returns the build information of the running binary.
func Get() Info {
	return resolve(version, commit, debug.ReadBuildInfo)
}

func resolve(v, c string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Commit: c, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					info.Commit = s.Value
				}
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String renders the information the way --version prints it.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}
