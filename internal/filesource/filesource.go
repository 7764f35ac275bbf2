// Package filesource is Flotilla's one way of reading Istio YAML from a
// directory: galley's no-cluster mode, discovery's --config-dir and the
// translation goldens all read through it (and through package publish).
//
// The rules, in one place:
//   - Only the directory's own regular files whose names end in .yaml, .yml
//     or .json are read, not subdirectories (a ConfigMap volume's ..data
//     links and a mesh/ folder beside the config stay out); names starting
//     with "." (editors' swap files, atomic-rename temporaries) are skipped.
//     Each file is at most istio.MaxFileBytes.
//   - Each file holds any number of YAML documents and is applied
//     atomically: all of its valid objects at once. The directory is
//     watched and re-read after a burst of changes.
//   - An invalid document is reported as "file:line: Kind ns/name: reason"
//     and the last valid state of that object is kept.
//   - An object (kind, namespace, name) defined in two files belongs to the
//     file first in name order; the later definition is reported ("already
//     defined in") and taken once the first file lets go of it.
package filesource

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/boundedfile"
	"github.com/flotilla-mesh/flotilla/internal/platform/fswatch"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// Sink receives the objects of the directory. Apply gets, per change, the
// objects that appeared or changed and the IDs of those that went away,
// within the change's span (ctx's). It is called from one goroutine.
type Sink interface {
	Apply(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error
}

// Key identifies an object.
type Key = istio.ID

func keyOf(o *istio.Object) Key { return o.ID() }

// Problem is one rejected document.
type Problem struct {
	// Message is "file:line: Kind ns/name: reason".
	Message string
	// Object is "Kind ns/name", when the document names one.
	Object string
	// Since is the scan that first found it (as it is now).
	Since time.Time
}

// Options configures a Source.
type Options struct {
	Dir              string
	DefaultNamespace string
	// DomainSuffix resolves short host names for cross-object warnings.
	DomainSuffix string
	Log          *slog.Logger
	// Debounce coalesces bursts of file events (an editor's save, a
	// ConfigMap volume swap: a few ms apart). Default 25ms.
	Debounce time.Duration
	// Tracer traces each scan that changed something (a span
	// "files.change", with "validate" and "publish" under it); none when
	// nil.
	Tracer trace.TracerProvider
}

// Source reads and watches a directory.
type Source struct {
	o      Options
	sink   Sink
	tracer trace.Tracer

	mu       sync.Mutex
	files    map[string]*fileState // path → what it last contributed
	problems []Problem
	loaded   chan struct{} // closed after the first full load
	loadOnce sync.Once
}

type fileState struct {
	hash    [32]byte
	objects map[Key]*istio.Object
	// problems are the file's rejected documents: a file with problems is
	// read again on every scan, since a change elsewhere (another file
	// letting go of a duplicate) may resolve them.
	problems []Problem
}

// New returns a source for o.Dir that feeds sink.
func New(o Options, sink Sink) *Source {
	if o.Debounce == 0 {
		o.Debounce = 25 * time.Millisecond
	}
	if o.DomainSuffix == "" {
		o.DomainSuffix = controlplane.DefaultDomainSuffix
	}
	o.Log = o.Log.With("component", "filesource", "dir", o.Dir)
	if o.Tracer == nil {
		o.Tracer = noop.NewTracerProvider()
	}
	return &Source{o: o, sink: sink, files: map[string]*fileState{}, loaded: make(chan struct{}), tracer: o.Tracer.Tracer("flotilla/filesource")}
}

// Loaded is closed once the directory has been read completely once.
func (s *Source) Loaded() <-chan struct{} { return s.loaded }

// Problems returns the documents rejected in the last scan.
func (s *Source) Problems() []Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.problems)
}

// Run reads the directory, then watches it until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	return fswatch.Run(ctx, fswatch.Options{
		Dirs:     []string{s.o.Dir},
		Debounce: s.o.Debounce,
		Relevant: relevant,
		OnStart:  s.Scan,
		OnChange: s.Scan,
		Log:      s.o.Log,
	})
}

func relevant(path string) bool {
	base := filepath.Base(path)
	if strings.HasPrefix(base, ".") {
		return false // editors' swap files, atomic-rename temporaries
	}
	switch strings.ToLower(filepath.Ext(base)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Scan reads every file, applies what changed, and reports rejected
// documents. It returns an error only when the directory cannot be read or
// the sink fails.
func (s *Source) Scan() error {
	start := time.Now()
	entries, err := os.ReadDir(s.o.Dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.o.Dir, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	present := map[string]bool{}
	var paths []string
	for _, e := range entries {
		if e.Type().IsRegular() && relevant(e.Name()) {
			p := filepath.Join(s.o.Dir, e.Name())
			present[p] = true
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)

	var upserts []*istio.Object
	var deletes []Key
	// Files that went away take their objects with them.
	for p, st := range s.files {
		if present[p] {
			continue
		}
		for k := range st.objects {
			deletes = append(deletes, k)
		}
		delete(s.files, p)
		s.o.Log.Info("file removed", "file", p, "objects", len(st.objects))
	}
	since := make(map[string]time.Time, len(s.problems))
	for _, pr := range s.problems {
		since[pr.Message] = pr.Since
	}
	s.problems = nil
	for _, p := range paths {
		ups, dels, probs := s.readFile(p)
		upserts = append(upserts, ups...)
		deletes = append(deletes, dels...)
		for _, pr := range probs {
			pr.Since = start
			if t, ok := since[pr.Message]; ok {
				pr.Since = t
			}
			s.problems = append(s.problems, pr)
		}
	}
	// An object one file let go of and another took over in the same scan
	// is an update, not a deletion.
	upserted := map[Key]bool{}
	for _, o := range upserts {
		upserted[keyOf(o)] = true
	}
	deletes = slices.DeleteFunc(deletes, func(k Key) bool { return upserted[k] })
	for _, pr := range s.problems {
		s.o.Log.Error("rejected", "problem", pr.Message)
	}
	if len(upserts) > 0 || len(deletes) > 0 {
		// A change: traced from the scan's start, its reading and
		// validation as one span, its publishing as another.
		ctx, span := s.tracer.Start(context.Background(), "files.change", trace.WithTimestamp(start),
			trace.WithAttributes(attribute.String("dir", s.o.Dir), attribute.Int("changed", len(upserts)), attribute.Int("deleted", len(deletes)),
				attribute.Int("problems", len(s.problems))))
		_, validate := s.tracer.Start(ctx, "validate", trace.WithTimestamp(start))
		validate.End()
		pctx, publish := s.tracer.Start(ctx, "publish")
		err := s.sink.Apply(pctx, upserts, deletes)
		publish.End()
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			return fmt.Errorf("apply %s: %w", s.o.Dir, err)
		}
		span.End()
		s.o.Log.Info("applied", "changed", len(upserts), "deleted", len(deletes))
	}
	s.o.Log.Info("scanned", "files", len(paths), "problems", len(s.problems))
	s.loadOnce.Do(func() { close(s.loaded) })
	return nil
}

// readFile returns what one file changes. Must be called with s.mu held.
func (s *Source) readFile(path string) (upserts []*istio.Object, deletes []Key, problems []Problem) {
	data, err := boundedfile.Read(path, istio.MaxFileBytes)
	if err != nil {
		return nil, nil, []Problem{{Message: err.Error()}} // names the path
	}
	hash := sha256.Sum256(data)
	prev := s.files[path]
	if prev != nil && prev.hash == hash && len(prev.problems) == 0 {
		return nil, nil, nil // unchanged and clean: nothing to redo
	}
	prevObjects := map[Key]*istio.Object{}
	if prev != nil {
		prevObjects = prev.objects
	}
	next := map[Key]*istio.Object{}
	unidentified := false
	docs := istio.Decode(path, data, s.o.DefaultNamespace)
	subsets := s.subsetContext(path, docs)
	for _, doc := range docs {
		if doc.Err != nil {
			var de *istio.DecodeError
			isDecode := errors.As(doc.Err, &de)
			pr := Problem{Message: doc.Err.Error()}
			if isDecode {
				pr.Object = de.Object
			}
			problems = append(problems, pr)
			if isDecode {
				if k, ok := parseObjectRef(de.Object); ok {
					if old, ok := prevObjects[k]; ok {
						next[k] = old // keep its last valid state
					}
					continue
				}
			}
			unidentified = true
			continue
		}
		obj := doc.Object
		k := keyOf(obj)
		if _, dup := next[k]; dup {
			problems = append(problems, Problem{Message: fmt.Sprintf("%s:%d: %s: defined twice in this file", path, doc.Line, obj), Object: obj.String()})
			continue
		}
		if owner := s.ownerOf(k, path); owner != "" {
			problems = append(problems, Problem{Message: fmt.Sprintf("%s:%d: %s: already defined in %s", path, doc.Line, obj, owner), Object: obj.String()})
			continue
		}
		res := validation.Validate(obj, subsets)
		for _, w := range res.Warnings {
			s.o.Log.Warn("validation warning", "object", obj.String(), "file", path, "line", doc.LineOf(w.Path), "code", w.Code, "warning", w.String())
		}
		if !res.OK() {
			for _, e := range res.Errors {
				problems = append(problems, Problem{Message: fmt.Sprintf("%s:%d: %s: %s", path, doc.LineOf(e.Path), obj, e), Object: obj.String()})
			}
			if old, ok := prevObjects[k]; ok {
				next[k] = old
			}
			continue
		}
		next[k] = obj
	}
	if unidentified {
		// A document we could not even name may be any of the file's
		// previous objects: keep them all rather than delete one by mistake.
		for k, old := range prevObjects {
			if _, ok := next[k]; !ok {
				next[k] = old
			}
		}
	}
	for k, obj := range next {
		if old, ok := prevObjects[k]; !ok || !old.SameContent(obj) {
			upserts = append(upserts, obj)
		}
	}
	for k := range prevObjects {
		if _, ok := next[k]; !ok {
			deletes = append(deletes, k)
		}
	}
	s.files[path] = &fileState{hash: hash, objects: next, problems: problems}
	return upserts, deletes, problems
}

// ownerOf returns another file that already provides k.
func (s *Source) ownerOf(k Key, path string) string {
	for p, st := range s.files {
		if p == path {
			continue
		}
		if _, ok := st.objects[k]; ok && p < path {
			return p
		}
	}
	return ""
}

// parseObjectRef reads "Kind namespace/name" back into a key.
func parseObjectRef(s string) (Key, bool) {
	kind, name, ok := strings.Cut(s, " ")
	if !ok || !strings.Contains(name, "/") || strings.HasSuffix(name, "/") {
		return Key{}, false
	}
	return Key{Kind: kind, Name: name}, true
}

// subsetContext answers subset lookups from the DestinationRules of the
// other files and of this file's new documents, wherever they stand in it.
func (s *Source) subsetContext(path string, docs []istio.Document) validation.Context {
	var objs []*istio.Object
	for p, st := range s.files {
		if p == path {
			continue
		}
		for _, o := range st.objects {
			objs = append(objs, o)
		}
	}
	for _, d := range docs {
		if d.Object != nil {
			objs = append(objs, d.Object)
		}
	}
	return validation.NewSubsetIndex(objs, s.o.DomainSuffix)
}

// Objects returns every object currently in force, for other validators
// (the webhook) that need the same context.
func (s *Source) Objects() []*istio.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*istio.Object
	for _, st := range s.files {
		for _, o := range st.objects {
			out = append(out, o)
		}
	}
	return out
}
