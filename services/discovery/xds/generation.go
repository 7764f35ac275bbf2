package xds

import (
	"hash/fnv"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

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
// nil). A resource the push context shares among proxies is encoded once
// per push context (model.PushContext.Encoded), the others once.
func (c *conn) generate(t string, gen *translate.Generator, names []string) []*named {
	msgs := gen.Resources(t, names)
	out := make([]*named, 0, len(msgs))
	for _, m := range msgs {
		enc := gen.PushContext().Encoded(m, func() any { return encode(t, m) }).(encoded)
		if enc.err != nil {
			c.s.log.Error("encoding a resource", "proxy", c.id, "type_url", t, "error", enc.err)
			continue
		}
		out = append(out, enc.named)
	}
	return out
}

// encoded is a resource encoded, or why it could not be.
type encoded struct {
	named *named
	err   error
}

func encode(t string, m proto.Message) encoded {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return encoded{err: err}
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	nv := &nameVersion{name: translate.ResourceName(m), version: strconv.FormatUint(h.Sum64(), 36)}
	w, a := frame(t, nv.name, nv.version, b)
	return encoded{named: &named{nameVersion: nv, any: a, wire: w}}
}

// keepProblems records what translation dropped or degraded for this
// proxy (the status endpoint shows it) and logs it when it changes.
func (c *conn) keepProblems(gen *translate.Generator) {
	p := gen.Problems()
	c.mu.Lock()
	changed := !slices.Equal(p, c.problems)
	c.problems = p
	c.mu.Unlock()
	if changed && len(p) > 0 {
		c.s.log.Warn("resources dropped or degraded for a proxy", "proxy", c.id, "problems", p)
	}
}
