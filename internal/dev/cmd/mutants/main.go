// Command mutants checks that tests fail on broken code: each
// testdata/mutations.txt under the directories given (default: the
// repository) lists changes to its package's code, and for each one the
// package's named tests are run with the change applied in memory (go
// test -overlay; the checkout is untouched). A change whose tests still
// pass survived: the tests do not check what it breaks, and mutants fails.
// A change that no longer applies (its line is gone) fails too, so the
// cases follow the code. `make mutations` runs it.
//
// A mutations.txt holds cases separated by blank lines, each of lines
// "key: value" ("#" starts a comment line):
//
//	name: what the change breaks
//	file: the file changed, relative to the package
//	old: text that occurs exactly once in the file (\n and \t stand for
//	     a newline and a tab)
//	new: what replaces it (the same)
//	run: the -run pattern of the tests that must fail
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// mutation is one case.
type mutation struct {
	name, file, old, new, run string
	at                        string // where it is written, for messages
}

func main() {
	timeout := flag.Duration("timeout", 5*time.Minute, "how long one case's tests may run")
	flag.Parse()
	roots := flag.Args()
	if len(roots) == 0 {
		roots = []string{"."}
	}
	var files []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			if !d.IsDir() && d.Name() == "mutations.txt" && filepath.Base(filepath.Dir(path)) == "testdata" {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			fail(err)
		}
	}
	failed := 0
	for _, f := range files {
		cases, err := parse(f)
		if err != nil {
			fail(err)
		}
		pkg := filepath.Dir(filepath.Dir(f))
		for _, m := range cases {
			if err := check(pkg, m, *timeout); err != nil {
				fmt.Printf("FAIL %s: %v\n", m.at, err)
				failed++
				continue
			}
			fmt.Printf("ok   %s: %s (caught by %s)\n", m.at, m.name, m.run)
		}
	}
	if failed > 0 {
		fmt.Printf("%d mutation(s) not caught\n", failed)
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mutants:", err)
	os.Exit(2)
}

// unescape reads a value's \n and \t.
var unescape = strings.NewReplacer(`\n`, "\n", `\t`, "\t")

// parse reads one mutations.txt.
func parse(path string) ([]mutation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mutation
	var cur *mutation
	line := 0
	flush := func() error {
		if cur == nil {
			return nil
		}
		if cur.name == "" || cur.file == "" || cur.old == "" || cur.run == "" {
			return fmt.Errorf("%s: a case needs name, file, old and run", cur.at)
		}
		out = append(out, *cur)
		cur = nil
		return nil
	}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line++
		text := s.Text()
		if strings.HasPrefix(strings.TrimSpace(text), "#") {
			continue
		}
		if strings.TrimSpace(text) == "" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		key, value, ok := strings.Cut(text, ":")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want key: value", path, line)
		}
		if cur == nil {
			cur = &mutation{at: fmt.Sprintf("%s:%d", path, line)}
		}
		value = strings.TrimPrefix(value, " ")
		switch key {
		case "name":
			cur.name = value
		case "file":
			cur.file = value
		case "old":
			cur.old = unescape.Replace(value)
		case "new":
			cur.new = unescape.Replace(value)
		case "run":
			cur.run = value
		default:
			return nil, fmt.Errorf("%s:%d: unknown key %q", path, line, key)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return out, flush()
}

// check applies m in memory and runs its tests, which must fail.
func check(pkg string, m mutation, timeout time.Duration) error {
	target, err := filepath.Abs(filepath.Join(pkg, m.file))
	if err != nil {
		return err
	}
	src, err := os.ReadFile(target)
	if err != nil {
		return err
	}
	if n := strings.Count(string(src), m.old); n != 1 {
		return fmt.Errorf("%q occurs %d times in %s, want once: the case no longer applies", m.old, n, m.file)
	}
	dir, err := os.MkdirTemp("", "mutant")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mutated := filepath.Join(dir, filepath.Base(target))
	if err := os.WriteFile(mutated, []byte(strings.Replace(string(src), m.old, m.new, 1)), 0o600); err != nil {
		return err
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {target: mutated}})
	if err != nil {
		return err
	}
	ov := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ov, overlay, 0o600); err != nil {
		return err
	}
	cmd := exec.Command("go", "test", "-overlay", ov, "-count=1", "-timeout", timeout.String(), "-run", m.run, ".")
	cmd.Dir = pkg
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return fmt.Errorf("%s: survived, %s still pass", m.name, m.run)
	case !errors.As(err, &ee):
		return err
	case !strings.Contains(string(out), "--- FAIL"):
		// A build failure is no test failing: the case is wrong.
		return fmt.Errorf("%s: the tests did not run and fail:\n%s", m.name, out)
	}
	return nil
}
