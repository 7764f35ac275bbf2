package xds

import (
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"weak"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/translate"
)

// This file turns what translate builds into what the protocol sends:
// each resource encoded once, deterministically, with a version that is
// the hash of its bytes (so an unchanged resource keeps its version
// across pushes and replicas).

// named is one encoded resource, shared by every response that carries
// it. Its name and version are apart, behind a pointer, so that what a
// proxy holds (heldSet) can point at them without keeping the encoding's
// bytes.
type named struct {
	*nameVersion
	any *anypb.Any // its value is the wire's bytes
	wire
}

// generate builds the resources of one type for the names asked (all when
// nil), encoded: what the push context shares among proxies once per push
// context (encodings), the others each time.
func (c *conn) generate(t string, gen *translate.Generator, names []string) []*named {
	msgs := gen.Resources(t, names)
	pc := gen.PushContext()
	shared := c.s.encodings.of(pc)
	out := make([]*named, 0, len(msgs))
	for _, m := range msgs {
		r, err := shared.encoded(pc, t, m)
		if err != nil {
			c.s.log.Error("encoding a resource", "proxy", c.id, "type_url", t, "error", err)
			continue
		}
		out = append(out, r)
	}
	return out
}

// encode is m, a resource of type t, encoded.
func encode(t string, m proto.Message) (*named, error) {
	name := translate.ResourceName(m)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("resource %q: %w", name, err)
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	nv := &nameVersion{name: name, version: strconv.FormatUint(h.Sum64(), 36)}
	w, a := frame(t, nv.name, nv.version, b)
	return &named{nameVersion: nv, any: a, wire: w}, nil
}

// encodings keeps the encodings of what push contexts share among
// proxies (what translation marked with model.PushContext.Share), one
// cache per push context, for as long as the push context lives: each such
// resource is encoded once per push context, and every stream that sends
// it sends the same bytes. The zero value is ready to use.
type encodings struct {
	byPC sync.Map // weak.Pointer[model.PushContext] → *sharedEncodings
}

// sharedEncodings are one push context's: shared resource
// (proto.Message) → *named.
type sharedEncodings struct{ m sync.Map }

// of is pc's cache. It goes when pc is collected.
func (e *encodings) of(pc *model.PushContext) *sharedEncodings {
	key := weak.Make(pc)
	if s, ok := e.byPC.Load(key); ok {
		return s.(*sharedEncodings)
	}
	s, loaded := e.byPC.LoadOrStore(key, new(sharedEncodings))
	if !loaded {
		runtime.AddCleanup(pc, func(key weak.Pointer[model.PushContext]) { e.byPC.Delete(key) }, key)
	}
	return s.(*sharedEncodings)
}

// encoded is m, a resource of type t built from pc, encoded: kept, and
// made once, when pc shares m; made anew otherwise (what is built for one
// proxy must not accumulate). Two callers may encode at once; one result
// wins and is kept. An encoding that failed is not kept.
func (s *sharedEncodings) encoded(pc *model.PushContext, t string, m proto.Message) (*named, error) {
	if r, ok := s.m.Load(m); ok {
		return r.(*named), nil
	}
	r, err := encode(t, m)
	if err != nil || !pc.Shared(m) {
		return r, err
	}
	kept, _ := s.m.LoadOrStore(m, r)
	return kept.(*named), nil
}

// keepProblems records what translation dropped or degraded generating a
// response of type t (what gen found since its last response, or since
// it was made: the status endpoint shows it, galley the EnvoyFilters' in
// their status) and logs it when it changes. A response of some of the
// type's resources (partial) adds to what the type found; a whole one
// replaces it.
func (c *conn) keepProblems(t string, gen *translate.Generator, partial bool) {
	p, ef := gen.Found()
	c.mu.Lock()
	before := c.allProblems()
	if c.problems == nil {
		c.problems, c.efProblems = map[string][]string{}, map[string]map[string][]string{}
	}
	if partial {
		for _, x := range p {
			if !slices.Contains(c.problems[t], x) {
				c.problems[t] = append(c.problems[t], x)
			}
		}
		if c.efProblems[t] == nil {
			c.efProblems[t] = map[string][]string{}
		}
		for k, msgs := range ef {
			for _, m := range msgs {
				if !slices.Contains(c.efProblems[t][k], m) {
					c.efProblems[t][k] = append(c.efProblems[t][k], m)
				}
			}
		}
	} else {
		c.problems[t], c.efProblems[t] = p, ef
	}
	after := c.allProblems()
	c.mu.Unlock()
	if !slices.Equal(before, after) && len(after) > 0 {
		c.s.log.Warn("resources dropped or degraded for a proxy", "proxy", c.id, "problems", after)
	}
}

// allProblems is every problem the proxy's responses found, sorted and
// once each. Call with mu held.
func (c *conn) allProblems() []string {
	var out []string
	for _, ps := range c.problems {
		out = append(out, ps...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// envoyFilterProblems is every EnvoyFilter problem the proxy's responses
// found, by EnvoyFilter key. Call with mu held.
func (c *conn) envoyFilterProblems() map[string][]string {
	out := map[string][]string{}
	for _, byKey := range c.efProblems {
		for k, msgs := range byKey {
			for _, m := range msgs {
				if !slices.Contains(out[k], m) {
					out[k] = append(out[k], m)
				}
			}
		}
	}
	return out
}
