package memlimit

import (
	"runtime/debug"
	"strings"
	"testing"
	"testing/fstest"
)

func files(kv ...string) fstest.MapFS {
	m := fstest.MapFS{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = &fstest.MapFile{Data: []byte(kv[i+1])}
	}
	return m
}

func TestLimitIsTheProcesssOwnCgroupsMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fs      fstest.MapFS
		limit   int64
		ok      bool
		wantErr string
	}{
		{"cgroup v2, its own cgroup", files(
			"proc/self/cgroup", "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max", "268435456\n",
			"sys/fs/cgroup/memory.max", "max\n",
		), 268435456, true, ""},
		{"cgroup v2 in its own namespace (the mount's root)", files(
			"proc/self/cgroup", "0::/\n",
			"sys/fs/cgroup/memory.max", "134217728\n",
		), 134217728, true, ""},
		{"cgroup v2, no limit", files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "max\n"), 0, false, ""},
		{"cgroup v1, the memory controller's path", files(
			"proc/self/cgroup", "9:name=systemd:/\n4:cpu,memory:/process_api/abc\n0::/\n",
			"sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "536870912",
		), 536870912, true, ""},
		{"cgroup v1, no limit (a page-rounded maximum)", files(
			"proc/self/cgroup", "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n",
		), 0, false, ""},
		{"no cgroup memory files", files("proc/self/cgroup", "0::/\n"), 0, false, ""},
		{"lines that are no cgroup", files("proc/self/cgroup", "garbage\n\n::\n"), 0, false, ""},
		{"no /proc", files(), 0, false, "reading the process's cgroups"},
		{"a limit that is no number", files(
			"proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", strings.Repeat("x", 100),
		), 0, false, `not a limit in bytes`},
		{"a negative limit", files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "-1"), 0, false, "not a limit in bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit, ok, err := Limit(tc.fs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				if len(err.Error()) > 200 {
					t.Fatalf("error not cut short: %d bytes", len(err.Error()))
				}
				return
			}
			if err != nil || limit != tc.limit || ok != tc.ok {
				t.Fatalf("Limit = %d, %v, %v; want %d, %v", limit, ok, err, tc.limit, tc.ok)
			}
		})
	}
}

func TestApplySetsNinetyPercentUnlessGOMEMLIMITIsSet(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	limited := files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "1000000000\n")
	noEnv := func(string) string { return "" }

	if got, err := Apply(limited, noEnv); err != nil || got != 900_000_000 || debug.SetMemoryLimit(-1) != 900_000_000 {
		t.Fatalf("Apply = %d, %v; runtime limit %d; want 900000000", got, err, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(before)
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "150MiB"
		}
		return ""
	}
	if got, err := Apply(limited, env); err != nil || got != 0 || debug.SetMemoryLimit(-1) != before {
		t.Fatalf("with GOMEMLIMIT set: Apply = %d, %v; runtime limit %d, want it left at %d", got, err, debug.SetMemoryLimit(-1), before)
	}
	if got, err := Apply(files("proc/self/cgroup", "0::/\n", "sys/fs/cgroup/memory.max", "max"), noEnv); err != nil || got != 0 || debug.SetMemoryLimit(-1) != before {
		t.Fatalf("without a limit: Apply = %d, %v; runtime limit %d, want it left at %d", got, err, debug.SetMemoryLimit(-1), before)
	}
}
