package ingest

import (
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/flotilla-mesh/flotilla/internal/filesource"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/publish"
)

// FileOptions configures the file source.
type FileOptions struct {
	Dir              string
	MeshConfigFile   string
	DefaultNamespace string
	DomainSuffix     string
	Log              *slog.Logger
	// Tracer traces each change of the directory (filesource.Options).
	Tracer trace.TracerProvider
}

// Files serves a directory of Istio YAML without galley, through galley's
// own file source and publisher (package filesource says which files are
// read, and what happens to invalid and duplicate objects): their
// collections reach the Ingest through mcp.Local exactly as galley's
// stream would bring them, so the same directory yields the same xDS.
type Files struct {
	src   *filesource.Source
	local *mcp.Local
	mesh  string
}

// NewFiles returns a file source applying to in.
func NewFiles(o FileOptions, in mcp.Handler) *Files {
	local := mcp.NewLocal(in, model.TypeURLs())
	src := filesource.New(filesource.Options{
		Dir: o.Dir, DefaultNamespace: o.DefaultNamespace, DomainSuffix: o.DomainSuffix, Log: o.Log, Tracer: o.Tracer,
	}, publish.New(local))
	return &Files{src: src, local: local, mesh: o.MeshConfigFile}
}

// Run reads the mesh configuration and the directory, then watches the
// directory until ctx ends. Once the directory was read, every collection
// the files did not fill is handed on empty, so that the Ingest's first
// push has the whole directory.
func (f *Files) Run(ctx context.Context) error {
	if f.mesh != "" {
		if err := publish.MeshFile(f.local, f.mesh); err != nil {
			return err
		}
	}
	errs := make(chan error, 1)
	go func() { errs <- f.src.Run(ctx) }()
	select {
	case <-f.src.Loaded():
		if err := f.local.Complete(); err != nil {
			return fmt.Errorf("config dir: %w", err)
		}
	case err := <-errs:
		return err
	}
	return <-errs
}
