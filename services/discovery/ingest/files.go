package ingest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
	"github.com/flotilla-mesh/flotilla/internal/platform/fswatch"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// FileOptions configures the file source.
type FileOptions struct {
	Dir              string
	MeshConfigFile   string
	DefaultNamespace string
	DomainSuffix     string
	Log              *slog.Logger
}

// Files serves a directory of Istio YAML (ServiceEntries and
// WorkloadEntries become registry services, as galley makes them) through
// the same Apply path as galley's stream, re-reading on every change. An
// invalid object is reported with its file and line and left out; the
// rest is served.
type Files struct {
	o    FileOptions
	sink mcp.Handler
	held map[string]map[string][32]byte // type URL → name → content hash
}

// NewFiles returns a file source applying to sink.
func NewFiles(o FileOptions, sink mcp.Handler) *Files {
	return &Files{o: o, sink: sink, held: map[string]map[string][32]byte{}}
}

// Run reads the directory and then every change to it until ctx ends.
func (f *Files) Run(ctx context.Context) error {
	dirs, err := f.dirs()
	if err != nil {
		return err
	}
	return fswatch.Run(ctx, fswatch.Options{
		Dirs:     dirs,
		Debounce: 50 * time.Millisecond,
		Relevant: isConfigFile,
		OnStart:  f.load,
		OnChange: f.load,
		Log:      f.o.Log,
	})
}

func (f *Files) dirs() ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(f.o.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("config dir: %w", err)
	}
	return dirs, nil
}

func isConfigFile(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// load reads everything and applies what changed since the last load.
func (f *Files) load() error {
	objects := f.read()
	resources := map[string][]*mcp.Resource{}
	for _, t := range model.TypeURLs() {
		resources[t] = nil
	}
	add := func(t, name string, body proto.Message, labels, annotations map[string]string) error {
		r, err := mcp.NewResource(name, body, labels, annotations)
		if err != nil {
			return err
		}
		resources[t] = append(resources[t], r)
		return nil
	}
	var entries, workloads []*istio.Object
	for _, o := range objects {
		if err := add(o.Kind.TypeURL(), o.Key(), o.Spec, o.Meta.Labels, o.Meta.Annotations); err != nil {
			return err
		}
		switch o.Kind.Kind {
		case "ServiceEntry":
			entries = append(entries, o)
		case "WorkloadEntry":
			workloads = append(workloads, o)
		}
	}
	for _, se := range entries {
		svcs, sets := normalize.ServiceEntry(se, workloads)
		for _, s := range svcs {
			if err := add(registry.ServiceTypeURL, registry.ServiceName(s.GetNamespace(), s.GetHostname()), s, nil, nil); err != nil {
				return err
			}
		}
		for _, es := range sets {
			if err := add(registry.EndpointSetTypeURL, registry.EndpointSetName(es.GetServiceNamespace(), es.GetServiceHostname(), es.GetShard()), es, nil, nil); err != nil {
				return err
			}
		}
	}
	if f.o.MeshConfigFile != "" {
		mesh, err := readMesh(f.o.MeshConfigFile)
		if err != nil {
			return err
		}
		if err := add(registry.MeshConfigTypeURL, registry.MeshConfigName, mesh, nil, nil); err != nil {
			return err
		}
	}
	for _, t := range model.TypeURLs() {
		f.apply(t, resources[t])
	}
	return nil
}

// apply hands one collection's changes to the sink: what is new or
// different, and what is gone. A collection is applied once even when
// empty, so that the sink knows it was read.
func (f *Files) apply(t string, all []*mcp.Resource) {
	prev, seen := f.held[t]
	next := map[string][32]byte{}
	var changed []*mcp.Resource
	for _, r := range all {
		if _, dup := next[r.Name]; dup {
			continue
		}
		h := sha256.Sum256(r.Body.GetValue())
		next[r.Name] = h
		if old, ok := prev[r.Name]; !ok || old != h {
			changed = append(changed, r)
		}
	}
	var removed []string
	for n := range prev {
		if _, ok := next[n]; !ok {
			removed = append(removed, n)
		}
	}
	slices.Sort(removed)
	f.held[t] = next
	if seen && len(changed) == 0 && len(removed) == 0 {
		return
	}
	if err := f.sink.Apply(t, changed, removed); err != nil {
		f.o.Log.Error("applying files", "type_url", t, "error", err)
	}
}

// read decodes and validates every file; the first definition of an
// object wins.
func (f *Files) read() []*istio.Object {
	var paths []string
	_ = filepath.WalkDir(f.o.Dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && isConfigFile(path) {
			paths = append(paths, path)
		}
		return nil
	})
	slices.Sort(paths)
	type decoded struct {
		obj  *istio.Object
		doc  istio.Document
		path string
	}
	var all []decoded
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.o.Log.Error("reading a config file", "file", p, "error", err)
			continue
		}
		for _, d := range istio.Decode(p, data, f.o.DefaultNamespace) {
			if d.Err != nil {
				f.o.Log.Error("invalid configuration", "error", d.Err.Error())
				continue
			}
			all = append(all, decoded{obj: d.Object, doc: d, path: p})
		}
	}
	objs := make([]*istio.Object, 0, len(all))
	for _, d := range all {
		objs = append(objs, d.obj)
	}
	subsets := validation.NewSubsetIndex(objs, f.o.DomainSuffix)
	seen := map[istio.ID]string{}
	var out []*istio.Object
	for _, d := range all {
		id := d.obj.ID()
		if first, dup := seen[id]; dup {
			f.o.Log.Error("invalid configuration", "error", fmt.Sprintf("%s:%d: %s: already defined in %s", d.path, d.doc.Line, d.obj, first))
			continue
		}
		res := validation.Validate(d.obj, subsets)
		if !res.OK() {
			for _, e := range res.Errors {
				f.o.Log.Error("invalid configuration", "error", fmt.Sprintf("%s:%d: %s: %s", d.path, d.doc.LineOf(e.Path), d.obj, e))
			}
			continue
		}
		seen[id] = d.path
		out = append(out, d.obj)
	}
	return out
}

func readMesh(path string) (*meshv1alpha1.MeshConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	mesh := &meshv1alpha1.MeshConfig{}
	if err := istio.DecodeProtoYAML(data, mesh); err != nil {
		return nil, fmt.Errorf("mesh config %s: %w", path, err)
	}
	return mesh, nil
}
