package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestStampedVersionWinsOverBuildInfo(t *testing.T) {
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			Main:     debug.Module{Version: "v9.9.9"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}},
		}, true
	}
	got := resolve("v1.2.3", "def", read)
	if got.Version != "v1.2.3" || got.Commit != "def" {
		t.Fatalf("got %+v, want stamped v1.2.3/def", got)
	}
}

func TestUnstampedBuildFallsBackToModuleAndVCSInfo(t *testing.T) {
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			Main:     debug.Module{Version: "v0.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}},
		}, true
	}
	got := resolve("", "", read)
	if got.Version != "v0.4.0" || got.Commit != "abc123" {
		t.Fatalf("got %+v, want v0.4.0/abc123", got)
	}
}

func TestDevelBuildWithoutInformationSaysDevAndUnknown(t *testing.T) {
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true
	}
	got := resolve("", "", read)
	if got.Version != "dev" || got.Commit != "unknown" {
		t.Fatalf("got %+v, want dev/unknown", got)
	}
	if !strings.Contains(got.String(), "dev (commit unknown, go") {
		t.Fatalf("String() = %q", got.String())
	}
}
