package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestJSONLoggerAddsServiceAndDropsRecordsBelowLevel(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "flotilla-galley", Options{Format: "json", Level: "warn"})
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept", "resource_count", 3)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want exactly one record, got %q", buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("record is not JSON: %v", err)
	}
	if rec["msg"] != "kept" || rec["service"] != "flotilla-galley" || rec["resource_count"] != float64(3) {
		t.Fatalf("unexpected record %v", rec)
	}
}

func TestTextLoggerWritesKeyValuePairs(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "flotilla-ca", Options{Format: "text", Level: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("issued", "spiffe_id", "spiffe://cluster.local/ns/a/sa/b")
	out := buf.String()
	for _, want := range []string{"level=DEBUG", "msg=issued", "service=flotilla-ca", "spiffe_id=spiffe://cluster.local/ns/a/sa/b"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
}

func TestUnknownFormatOrLevelIsRejected(t *testing.T) {
	for _, o := range []Options{{Format: "xml", Level: "info"}, {Format: "json", Level: "loud"}} {
		if _, err := New(&bytes.Buffer{}, "x", o); err == nil {
			t.Errorf("New(%+v) succeeded, want error", o)
		}
	}
}
