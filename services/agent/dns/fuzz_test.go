package dns

import (
	"testing"

	"github.com/miekg/dns"
)

// FuzzAnswer gives the proxy any packet a workload could send: one that
// unpacks is answered (from the table, or by the forwarder, which here
// refuses) without panicking, with the question's ID, and within the
// size the client can take.
func FuzzAnswer(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"pg.example.com.", dns.TypeA}, {"productpage.ns1.ns1.svc.cluster.local.", dns.TypeA}, {"x.", dns.TypeANY}} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(4096, false)
		b, _ := m.Pack()
		f.Add(b)
	}
	f.Add([]byte{0, 1, 1, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	s, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	s.Update(meshTable)
	refuse := func(req *dns.Msg) *dns.Msg { return reply(req, dns.RcodeRefused) }
	f.Fuzz(func(t *testing.T, packet []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(packet); err != nil {
			return
		}
		resp := s.answer(req, refuse)
		if resp.Id != req.Id {
			t.Fatalf("id %d, want %d", resp.Id, req.Id)
		}
		resp.Truncate(size("udp", req))
		if b, err := resp.Pack(); err != nil || len(b) > size("udp", req) {
			t.Fatalf("response of %d bytes (%v) for a client taking %d", len(b), err, size("udp", req))
		}
	})
}
