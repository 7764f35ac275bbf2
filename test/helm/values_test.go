package helm_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The chart README's values table and the values schema (which refuses
// any key it does not name, and which values.yaml passes: helm lint) name
// the same keys: every key of the table is one the schema takes, and
// every key the schema takes is in the table, itself or under a key of
// it (a row for `<service>.resources` covers its requests and limits).
func TestTheValuesTableAndTheSchemaNameTheSameKeys(t *testing.T) {
	_, dir := chart(t)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := tableKeys(t, string(readme))
	if len(documented) < 50 {
		t.Fatalf("only %d keys read from the values table", len(documented))
	}
	data, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	taken := map[string]bool{} // every key the schema takes, leaf or not
	var leaves []string
	var walk func(path string, node map[string]any)
	walk = func(path string, node map[string]any) {
		node = resolve(t, schema, node)
		props, _ := node["properties"].(map[string]any)
		if len(props) == 0 {
			leaves = append(leaves, path)
			return
		}
		for k, v := range props {
			p := strings.TrimPrefix(path+"."+k, ".")
			taken[p] = true
			walk(p, v.(map[string]any))
		}
	}
	walk("", schema)
	for _, k := range documented {
		if !taken[k] {
			t.Errorf("the values table names %s, which the schema does not take", k)
		}
	}
	for _, leaf := range leaves {
		if !slices.ContainsFunc(documented, func(k string) bool { return leaf == k || strings.HasPrefix(leaf, k+".") }) {
			t.Errorf("the schema takes %s, which the values table does not name", leaf)
		}
	}
}

// resolve follows a node's local $ref.
func resolve(t *testing.T, schema, node map[string]any) map[string]any {
	t.Helper()
	for {
		ref, ok := node["$ref"].(string)
		if !ok {
			return node
		}
		cur := any(schema)
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("bad $ref %s", ref)
			}
			cur = m[part]
		}
		next, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("$ref %s names nothing", ref)
		}
		node = next
	}
}

// tableKeys reads the keys of the values table (the rows after its
// "| key | default | meaning |" header): each backticked name of the
// first column, a name starting with "." or without a dot being the
// sibling of the name before it, "<service>" and "<g>" standing for each
// service and gateway.
func tableKeys(t *testing.T, readme string) []string {
	t.Helper()
	_, table, ok := strings.Cut(readme, "| key | default | meaning |")
	if !ok {
		t.Fatal("no values table in the chart README")
	}
	name := regexp.MustCompile("`([^`]+)`")
	var out []string
	for _, line := range strings.Split(table, "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		first := strings.Split(line, "|")[1]
		prev := ""
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			k := m[1]
			if strings.HasPrefix(k, ".") || !strings.Contains(k, ".") && prev != "" {
				k = prev[:strings.LastIndex(prev, ".")+1] + strings.TrimPrefix(k, ".")
			}
			prev = k
			out = append(out, expand(k)...)
		}
	}
	return out
}

func expand(k string) []string {
	for placeholder, names := range map[string][]string{"<service>": {"galley", "discovery", "ca", "injector"}, "<g>": {"ingress", "egress"}} {
		if strings.Contains(k, placeholder) {
			var out []string
			for _, n := range names {
				out = append(out, expand(strings.Replace(k, placeholder, n, 1))...)
			}
			return out
		}
	}
	return []string{k}
}
