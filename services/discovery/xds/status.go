package xds

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/translate"
)

// TypeStatus is what a proxy was sent and acknowledged for one type.
type TypeStatus struct {
	Type         string    `json:"type"`
	SentVersion  string    `json:"sentVersion,omitempty"`
	SentNonce    string    `json:"sentNonce,omitempty"`
	SentAt       time.Time `json:"sentAt,omitzero"`
	Resources    int       `json:"resources"`
	AckedVersion string    `json:"ackedVersion,omitempty"`
	AckedAt      time.Time `json:"ackedAt,omitzero"`
	Synced       bool      `json:"synced"`
	LastNack     *Nack     `json:"lastNack,omitempty"`
}

// ProxyStatus is one connected proxy's sync status (`flotilla
// proxy-status` reads it).
type ProxyStatus struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	// Identity is the SPIFFE ID of the proxy's client certificate, on the
	// mTLS port; empty on the plain-text one.
	Identity    string       `json:"identity,omitempty"`
	Generator   string       `json:"generator,omitempty"`
	Delta       bool         `json:"delta"`
	ConnectedAt time.Time    `json:"connectedAt"`
	PushVersion string       `json:"pushVersion,omitempty"`
	Types       []TypeStatus `json:"types"`
	Problems    []string     `json:"problems,omitempty"`
}

func (c *conn) status() ProxyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := ProxyStatus{
		ID: c.id, Namespace: c.proxy.Namespace, Identity: c.identity, Generator: c.proxy.Generator, Delta: c.delta,
		ConnectedAt: c.connectedAt, Problems: c.problems,
	}
	if c.pcSeen != nil {
		ps.PushVersion = c.pcSeen.Version
	}
	for _, t := range translate.Types() {
		w := c.watches[t]
		if w == nil {
			continue
		}
		ts := TypeStatus{
			Type: shortType(t), SentVersion: w.sentVersion, SentNonce: w.sentNonce, SentAt: w.sentAt,
			Resources: w.sentCount, AckedVersion: w.ackedVersion, AckedAt: w.ackedAt, LastNack: w.nack,
		}
		ts.Synced = w.sentNonce != "" && w.ackedNonce == w.sentNonce
		ps.Types = append(ps.Types, ts)
	}
	return ps
}

// Status returns every connected proxy's sync status, by ID.
func (s *Server) Status() []ProxyStatus {
	var out []ProxyStatus
	for _, c := range s.Conns() {
		out = append(out, c.status())
	}
	slices.SortFunc(out, func(a, b ProxyStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// SynczHandler serves the sync status as JSON; ?proxy=<id> narrows it,
// ?pretty indents it.
func (s *Server) SynczHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		all := s.Status()
		if id := r.URL.Query().Get("proxy"); id != "" {
			all = slices.DeleteFunc(all, func(p ProxyStatus) bool { return p.ID != id })
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		if r.URL.Query().Has("pretty") {
			enc.SetIndent("", "  ")
		}
		_ = enc.Encode(all)
	})
}

// ConfigDumpHandler serves, for ?proxy=<id>, the configuration the current
// push context gives that proxy (clusters, endpoints, listeners, routes
// and what was dropped), as JSON.
func (s *Server) ConfigDumpHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("proxy")
		var target *conn
		for _, c := range s.Conns() {
			if c.id == id {
				target = c
			}
		}
		pc, _ := s.current()
		if target == nil || pc == nil {
			http.Error(w, "no connected proxy "+clip.String(id, 200)+" (see /debug/syncz)", http.StatusNotFound)
			return
		}
		out := translate.Generate(pc, target.proxy)
		list := func(ms []proto.Message) []json.RawMessage {
			raw := make([]json.RawMessage, 0, len(ms))
			for _, m := range ms {
				b, err := protojson.Marshal(m)
				if err == nil {
					raw = append(raw, b)
				}
			}
			return raw
		}
		doc := map[string]any{
			"proxy":       id,
			"pushVersion": pc.Version,
			"clusters":    list(asMessages(out.Clusters)),
			"endpoints":   list(asMessages(out.Endpoints)),
			"listeners":   list(asMessages(out.Listeners)),
			"routes":      list(asMessages(out.Routes)),
			"problems":    out.Problems,
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(doc)
	})
}

func asMessages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}
