// Package memlimit sets the Go runtime's soft memory limit from the memory
// limit of the container a service runs in, when GOMEMLIMIT does not set it
// already. Without it the runtime lets the heap grow to twice what is live
// before collecting, whatever the container allows, and a service near its
// limit is killed instead of collecting sooner. The limit is read from the
// process's own cgroup (v2 memory.max, or v1 memory.limit_in_bytes) and 90 %
// of it is given to the runtime, leaving the rest to what the runtime does
// not count (the binary's pages, kernel buffers). istiod does the same
// (automemlimit, ratio 0.9).
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// Ratio is the part of the container's limit given to the runtime.
const Ratio = 0.9

// unlimited is what cgroup v1 reports for no limit (a page-rounded
// maximum); anything above it is no limit either.
const unlimited = 1 << 62

// Limit is the memory limit of the cgroup the process is in, read from
// fsys (rooted at /: proc/self/cgroup and sys/fs/cgroup). ok is false when
// there is none.
func Limit(fsys fs.FS) (limit int64, ok bool, err error) {
	self, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return 0, false, fmt.Errorf("reading the process's cgroups: %w", err)
	}
	var v2, v1 string
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	// The process's own cgroup, then the root of the mount (a container
	// with its own cgroup namespace sees its cgroup there).
	var candidates []string
	if v1 != "" {
		candidates = append(candidates,
			path.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"), "sys/fs/cgroup/memory/memory.limit_in_bytes")
	}
	if v2 != "" {
		candidates = append(candidates, path.Join("sys/fs/cgroup", v2, "memory.max"), "sys/fs/cgroup/memory.max")
	}
	for _, name := range candidates {
		b, err := fs.ReadFile(fsys, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, fmt.Errorf("reading %s: %w", name, err)
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, false, fmt.Errorf("%s holds %q, not a limit in bytes", name, clip(s))
		}
		if n >= unlimited {
			return 0, false, nil
		}
		return n, true, nil
	}
	return 0, false, nil
}

func hasController(list, c string) bool {
	for _, l := range strings.Split(list, ",") {
		if l == c {
			return true
		}
	}
	return false
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Apply sets the runtime's soft memory limit to Ratio of the container's,
// unless GOMEMLIMIT is set (getenv) or there is no limit. It returns the
// limit set, or 0.
func Apply(fsys fs.FS, getenv func(string) string) (int64, error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, nil // the runtime read it at start
	}
	limit, ok, err := Limit(fsys)
	if err != nil || !ok {
		return 0, err
	}
	soft := int64(math.Floor(float64(limit) * Ratio))
	debug.SetMemoryLimit(soft)
	return soft, nil
}

// Root is the file system the process's cgroups are read from.
func Root() fs.FS { return os.DirFS("/") }
