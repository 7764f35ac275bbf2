package translate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// layers are the package's files from the bottom up; a file uses only
// what files of lower layers declare (and its own). Files of one layer
// use nothing of each other's. docs/architecture.md describes them.
var layers = [][]string{
	{"gen.go"},
	{"names.go"},
	{"helpers.go"},
	{"validate.go"},
	{"flavour.go"},
	{"policy.go"},
	{"locality.go"},
	{"eds.go"},
	{"cds.go"},
	{"check.go"},
	{"authn.go"},
	{"authz.go"},
	{"sds.go"},
	{"rds.go"},
	{"lds.go"},
	{"envoy.go"},
	{"inbound.go", "egress.go"},
	{"sidecar.go", "gateway.go", "proxyless.go"},
	{"translate.go"},
	{"resources.go"},
}

// TestEachFileUsesOnlyWhatTheLayersBelowItDeclare reads the package's
// files and finds, for every use of a package-level function, constant or
// variable and of a method of gen, the file that declares it. A use that
// reaches up (or sideways, within a layer) fails: the flavour files build
// on the shared per-type builders, which build on the helpers, never the
// other way round.
func TestEachFileUsesOnlyWhatTheLayersBelowItDeclare(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	layer := map[string]int{}
	for i, l := range layers {
		for _, f := range l {
			layer[f] = i
		}
	}
	files := map[string]*ast.File{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if _, ok := layer[name]; !ok {
			t.Errorf("%s is in no layer: add it to layers (and to docs/architecture.md)", name)
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	// Where each package-level name and each method of gen is declared.
	funcs, methods := map[string]string{}, map[string]string{}
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					funcs[d.Name.Name] = name
				} else if star, ok := d.Recv.List[0].Type.(*ast.StarExpr); ok && ident(star.X) == "gen" {
					methods[d.Name.Name] = name
				}
			case *ast.GenDecl:
				if d.Tok == token.CONST || d.Tok == token.VAR {
					for _, s := range d.Specs {
						for _, n := range s.(*ast.ValueSpec).Names {
							funcs[n.Name] = name
						}
					}
				}
			}
		}
	}
	for name, f := range files {
		local := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			// Names the file binds itself shadow the package's.
			switch n := n.(type) {
			case *ast.AssignStmt:
				if n.Tok == token.DEFINE {
					for _, l := range n.Lhs {
						local[ident(l)] = true
					}
				}
			case *ast.Field:
				for _, id := range n.Names {
					local[id.Name] = true
				}
			case *ast.ValueSpec:
				for _, id := range n.Names {
					local[id.Name] = true
				}
			}
			return true
		})
		seen := map[string]bool{}
		use := func(kind, id, declared string) {
			if declared == "" || declared == name || seen[id] {
				return
			}
			seen[id] = true
			if layer[declared] >= layer[name] {
				t.Errorf("%s uses %s %s of %s, which is not below it", name, kind, id, declared)
			}
		}
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				// Its name is declared here, not used.
				for _, part := range []ast.Node{n.Recv, n.Type, n.Body} {
					if part != nil && !reflectNil(part) {
						ast.Inspect(part, visit)
					}
				}
				return false
			case *ast.SelectorExpr:
				switch x := n.X.(type) {
				case *ast.Ident:
					if x.Name == "g" || x.Name == "sub" || x.Name == "b" {
						use("method", n.Sel.Name, methods[n.Sel.Name])
					}
					return false
				case *ast.ParenExpr: // a method expression, (*gen).m
					if star, ok := x.X.(*ast.StarExpr); ok && ident(star.X) == "gen" {
						use("method", n.Sel.Name, methods[n.Sel.Name])
						return false
					}
				}
				ast.Inspect(n.X, visit)
				return false
			case *ast.Ident:
				if !local[n.Name] {
					use("name", n.Name, funcs[n.Name])
				}
			}
			return true
		}
		ast.Inspect(f, visit)
	}
}

func ident(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// reflectNil reports whether a node is a typed nil (an absent receiver
// or body).
func reflectNil(n ast.Node) bool {
	switch n := n.(type) {
	case *ast.FieldList:
		return n == nil
	case *ast.BlockStmt:
		return n == nil
	case *ast.FuncType:
		return n == nil
	}
	return false
}
