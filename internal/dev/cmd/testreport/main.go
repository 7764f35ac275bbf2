// Command testreport reads `go test -json` on its input and prints what
// plain `go test` prints — each package's result line, and the output of
// every test that fails — then lists every test that skipped, with its
// reason, which plain `go test` hides. With -skipped it also appends them
// to a file, one per line, which .ci/run reads to fail a run where a test
// skipped on a machine that could run it. It exits 1 when a test or a
// package failed, or when its input is not go test's JSON.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// maxBuffered bounds what is kept of one running test's output: its
// tail, which holds the reason it failed or skipped.
const maxBuffered = 1 << 20

func main() {
	skippedFile := flag.String("skipped", "", "append the skipped tests to this file")
	flag.Parse()
	failed, skipped, err := report(os.Stdin, os.Stdout)
	if err == nil && len(skipped) > 0 && *skippedFile != "" {
		err = appendLines(*skippedFile, skipped)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

// report prints what plain go test prints of the events on in, then the
// skipped tests; it returns whether anything failed, and the skipped
// tests ("package test: reason").
func report(in io.Reader, out io.Writer) (failed bool, skipped []string, err error) {
	running := map[string]*strings.Builder{}
	s := bufio.NewScanner(in)
	s.Buffer(make([]byte, 1<<20), 64<<20)
	for s.Scan() {
		line := s.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not an event (a build error go test printed as it is).
			fmt.Fprintln(out, string(line))
			continue
		}
		if e.Test == "" {
			switch e.Action {
			case "output", "build-output":
				if e.Output != "PASS\n" { // plain go test prints it only with -v
					fmt.Fprint(out, e.Output)
				}
			case "fail", "build-fail":
				failed = true
			}
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "run":
			running[key] = &strings.Builder{}
		case "output":
			b := running[key]
			if b == nil {
				b = &strings.Builder{}
				running[key] = b
			}
			if b.Len() > maxBuffered {
				tail := b.String()[b.Len()-maxBuffered/2:]
				b.Reset()
				b.WriteString("…\n" + tail)
			}
			b.WriteString(e.Output)
		case "fail":
			failed = true
			if b := running[key]; b != nil {
				fmt.Fprint(out, b.String())
			}
			delete(running, key)
		case "skip":
			skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(running[key])))
			delete(running, key)
		case "pass":
			delete(running, key)
		}
	}
	if err := s.Err(); err != nil {
		return failed, skipped, err
	}
	if len(skipped) > 0 {
		fmt.Fprintf(out, "\n%d test(s) skipped:\n", len(skipped))
		for _, sk := range skipped {
			fmt.Fprintln(out, "  "+sk)
		}
	}
	return failed, skipped, nil
}

func appendLines(path string, lines []string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644) //nolint:gosec // a report in the build directory
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// reason is a skipped test's last line of its own (the t.Skip message).
func reason(b *strings.Builder) string {
	if b == nil {
		return "no reason given"
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "--- SKIP") && !strings.HasPrefix(l, "=== ") {
			return l
		}
	}
	return "no reason given"
}
