package translate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path"
	"path/filepath"
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
	{"headers.go"},
	{"policy.go"},
	{"locality.go"},
	{"eds.go"},
	{"metrics.go"},
	{"dfp.go"},
	{"cds.go"},
	{"check.go"},
	{"authn.go"},
	{"authz.go"},
	{"accesslog.go"},
	{"tracing.go"},
	{"sds.go"},
	{"extensions.go"},
	{"rds.go"},
	{"lds.go"},
	{"nds.go"},
	{"envoy.go"},
	{"inbound.go", "egress.go"},
	{"sidecar.go", "gateway.go", "proxyless.go"},
	{"envoyfilter.go"},
	{"translate.go"},
	{"resources.go"},
}

// TestEachFileUsesOnlyWhatTheLayersBelowItDeclare type-checks the
// package's files and finds, for every use of a package-level function,
// constant or variable and of a method, the file that declares it. A use
// that reaches up (or sideways, within a layer) fails: the flavour files
// build on the shared per-type builders, which build on the helpers,
// never the other way round. Imported packages are stand-ins (what the
// files use of them is not checked here; the build does that), so the
// check needs nothing but the package's own source.
func TestEachFileUsesOnlyWhatTheLayersBelowItDeclare(t *testing.T) {
	layer := map[string]int{}
	for i, l := range layers {
		for _, f := range l {
			layer[f] = i
		}
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
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
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: stubImporter{}, Error: func(error) {}} // errors: only what the stand-ins lack
	pkg, _ := conf.Check("translate", fset, files, info)
	reported := map[[2]string]bool{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg {
			continue
		}
		switch o := obj.(type) {
		case *types.Func: // functions and methods
		case *types.Const:
		case *types.Var:
			if o.Parent() != pkg.Scope() {
				continue // locals, parameters, fields
			}
		default:
			continue // types, labels
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to || layer[to] < layer[from] || reported[[2]string{from, obj.Name()}] {
			continue
		}
		reported[[2]string{from, obj.Name()}] = true
		t.Errorf("%s uses %s of %s, which is not below it", from, obj.Name(), to)
	}
}

// stubImporter gives each import an empty, complete package of its name,
// so the package's own declarations resolve without its dependencies.
type stubImporter struct{}

func (stubImporter) Import(p string) (*types.Package, error) {
	pkg := types.NewPackage(p, path.Base(p))
	pkg.MarkComplete()
	return pkg, nil
}
