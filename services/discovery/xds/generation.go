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

// named is one encoded resource.
type named struct {
	name    string
	any     *anypb.Any
	version string
}

// generate builds the resources of one type for the names asked (all when
// nil), encoded once.
func (c *conn) generate(t string, gen *translate.Generator, names []string) []named {
	msgs := gen.Resources(t, names)
	out := make([]named, 0, len(msgs))
	opts := proto.MarshalOptions{Deterministic: true}
	for _, m := range msgs {
		b, err := opts.Marshal(m)
		if err != nil {
			c.s.log.Error("encoding a resource", "proxy", c.id, "type_url", t, "error", err)
			continue
		}
		h := fnv.New64a()
		_, _ = h.Write(b)
		out = append(out, named{
			name:    translate.ResourceName(m),
			any:     &anypb.Any{TypeUrl: t, Value: b},
			version: strconv.FormatUint(h.Sum64(), 36),
		})
	}
	return out
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
