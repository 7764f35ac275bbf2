// Package docs_test checks that the repository's own documentation names
// only what exists: every path in backquotes in docs/architecture.md is a
// file or directory of the repository.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pathLike is a backquoted word that names a place in the repository.
var pathLike = regexp.MustCompile("`((?:api|cli|deploy|docs|examples|internal|services|test|tools)(?:/[A-Za-z0-9_.<>-]+)*)`")

func TestEveryPathTheArchitecturePageNamesExists(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	matches := pathLike.FindAllStringSubmatch(string(data), -1)
	if len(matches) < 20 {
		t.Fatalf("found only %d paths in docs/architecture.md; the pattern is out of step with the page", len(matches))
	}
	for _, m := range matches {
		p := m[1]
		if strings.Contains(p, "<") {
			p = p[:strings.Index(p, "<")] // a pattern such as services/<service>/app: its fixed head
		}
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/architecture.md names %s, which does not exist", m[1])
		}
	}
}

func TestTheReadmeLinksTheArchitecturePage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"docs/architecture.md", "internal/translate", "internal/model"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("README.md does not mention %s", want)
		}
	}
}
