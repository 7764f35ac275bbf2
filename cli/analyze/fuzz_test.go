package analyze_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
)

// FuzzAnalyze feeds any bytes to analyze as standard input: it never
// panics, and whatever it cannot read is a message, not a failure.
func FuzzAnalyze(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "every-message", "*.yaml"))
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 99999999}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		files, err := analyze.ReadFiles([]string{analyze.Stdin}, false, bytes.NewReader(data), "default", "cluster.local")
		if err != nil {
			t.Fatalf("reading standard input failed: %v", err)
		}
		msgs := append(files.Messages, analyze.Analyze(analyze.Input(files, "cluster.local"), files)...)
		for _, format := range []string{"log", "json"} {
			if err := analyze.Print(io.Discard, format, msgs, files); err != nil {
				t.Fatal(err)
			}
		}
	})
}
