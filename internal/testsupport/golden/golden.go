// Package golden compares what a test produced with a file under testdata
// and, when asked to (each test package's -update flag), rewrites the file.
// A mismatch is reported as a line diff with context, so that the change
// is read where it is, not found by hand.
package golden

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/textdiff"
)

// Check compares got with the file at path; with update it writes got
// there first.
func Check(tb testing.TB, path string, got []byte, update bool) {
	tb.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		tb.Errorf("%s differs; run go test -update if the change is intended (- want, + got):\n%s", path, Diff(string(want), string(got)))
	}
}

// JSON renders messages as an indented JSON list ending in a newline: the
// golden form of a list of resources, stable across runs.
func JSON[T proto.Message](tb testing.TB, msgs []T) []byte {
	tb.Helper()
	return Indent(tb, Raw(tb, msgs))
}

// Raw marshals each message with protojson, for golden documents that hold
// lists of resources among other fields.
func Raw[T proto.Message](tb testing.TB, msgs []T) []json.RawMessage {
	tb.Helper()
	parts := make([]json.RawMessage, 0, len(msgs))
	for _, m := range msgs {
		b, err := protojson.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		parts = append(parts, b)
	}
	return parts
}

// Indent marshals v as indented JSON ending in a newline.
func Indent(tb testing.TB, v any) []byte {
	tb.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		tb.Fatal(err)
	}
	buf.WriteByte('\n')
	return buf.Bytes()
}

// Diff returns a line diff of want and got (textdiff.Diff).
func Diff(want, got string) string { return textdiff.Diff(want, got) }
