package dns

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
)

// bigTable is a name table of n hosts: half Kubernetes Services (with
// their short forms), half ServiceEntry hosts with allocated addresses.
func bigTable(n int) *ndsv1.NameTable {
	nt := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, n)}
	for i := range n {
		if i%2 == 0 {
			ns := fmt.Sprintf("ns%d", i%50)
			nt.Table[fmt.Sprintf("svc%d.%s.svc.cluster.local", i, ns)] = &ndsv1.NameTable_NameInfo{
				Ips: []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}, Registry: "Kubernetes", Shortname: fmt.Sprintf("svc%d", i), Namespace: ns,
			}
			continue
		}
		nt.Table[fmt.Sprintf("ext%d.example.com", i)] = &ndsv1.NameTable_NameInfo{
			Ips: []string{fmt.Sprintf("240.240.%d.%d", i>>8&255, i&255), fmt.Sprintf("2001:2::%x", i)}, Registry: "External",
		}
	}
	return nt
}

var benchOptions = TableOptions{Namespace: "ns0", Domain: "ns0.svc.cluster.local", Search: []string{"ns0.svc.cluster.local", "svc.cluster.local", "cluster.local"}}

// BenchmarkNewTable builds the lookup table of 10,000 hosts, as each name
// table update does; table-bytes is the heap the built table holds.
func BenchmarkNewTable(b *testing.B) {
	nt := bigTable(10_000)
	for b.Loop() {
		_ = NewTable(nt, benchOptions)
	}
	b.StopTimer()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t := NewTable(nt, benchOptions)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "table-bytes")
	b.ReportMetric(float64(t.Len()), "names")
	runtime.KeepAlive(t)
}

// BenchmarkLookup answers names of a 10,000-host table: a ServiceEntry
// host, a short form, an expansion by the search domain (CNAME) and an
// unknown name.
func BenchmarkLookup(b *testing.B) {
	t := NewTable(bigTable(10_000), benchOptions)
	for _, q := range []struct{ label, name string }{
		{"external", "ext4321.example.com."},
		{"short", "svc4320.ns20."},
		{"expanded", "ext4321.example.com.ns0.svc.cluster.local."},
		{"unknown", "www.example.org."},
	} {
		b.Run(q.label, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = t.Lookup(dns.TypeA, q.name)
			}
		})
	}
}

// BenchmarkAnswerOverUDP is one query from the mesh's names of a
// 10,000-host table, answered over UDP on loopback: the latency an
// application sees from the proxy (client and server share the cores).
func BenchmarkAnswerOverUDP(b *testing.B) {
	s, err := New(Options{Address: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	s.Update(bigTable(10_000))
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	conn, err := c.Dial(s.Addrs()[0].String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req := new(dns.Msg)
	req.SetQuestion("ext4321.example.com.", dns.TypeA)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for b.Loop() {
		resp, _, err := c.ExchangeWithConn(req, conn)
		if err != nil || len(resp.Answer) != 1 {
			b.Fatalf("%v, %v", resp, err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	// What a flood of queries leaves on the heap once collected: nothing
	// grows with the number of queries.
	b.ReportMetric(float64(after.HeapAlloc)-float64(before.HeapAlloc), "heap-growth-bytes")
}
