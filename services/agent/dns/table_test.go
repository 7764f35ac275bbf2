package dns

import (
	"fmt"
	"slices"
	"testing"

	"github.com/miekg/dns"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
)

// testTable is a pod in ns1 of cluster.local, with Kubernetes' search
// domains, and the name table Istio's dns_test.go uses (in part).
func testTable() *Table {
	nt := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"productpage.ns1.svc.cluster.local": {Ips: []string{"10.10.10.10"}, Registry: "Kubernetes", Shortname: "productpage", Namespace: "ns1"},
		"reviews.ns2.svc.cluster.local":     {Ips: []string{"10.10.10.11", "fd00::11"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "ns2"},
		"details.ns3.svc.remote.local":      {Ips: []string{"10.10.10.12"}, Registry: "Kubernetes", Shortname: "details", Namespace: "ns3"},
		"www.google.com":                    {Ips: []string{"1.1.1.1"}, Registry: "External"},
		"v6.example.com":                    {Ips: []string{"2001:2::1"}, Registry: "External"},
		"*.wildcard.example.com":            {Ips: []string{"11.11.11.11"}, Registry: "External"},
		"pg.example.com":                    {Ips: []string{"240.240.0.1", "2001:2::1:1"}, Registry: "External"},
		"broken.example.com":                {Ips: []string{"not-an-ip", "fe80::1%eth0"}, Registry: "External"},
	}}
	return NewTable(nt, TableOptions{
		Namespace: "ns1", Domain: "ns1.svc.cluster.local",
		Search: []string{"ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"},
	})
}

// answerStrings renders answers as "type name value" without TTL, for
// comparison.
func answerStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, fmt.Sprintf("A %s %s", r.Hdr.Name, r.A))
		case *dns.AAAA:
			out = append(out, fmt.Sprintf("AAAA %s %s", r.Hdr.Name, r.AAAA))
		case *dns.CNAME:
			out = append(out, fmt.Sprintf("CNAME %s %s", r.Hdr.Name, r.Target))
		}
		if rr.Header().Ttl != ttl {
			out = append(out, fmt.Sprintf("ttl %d", rr.Header().Ttl))
		}
	}
	return out
}

func TestTheTableAnswersAsIstiosAgent(t *testing.T) {
	table := testTable()
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  []string
		known bool
	}{
		{"productpage.ns1.svc.cluster.local.", dns.TypeA, []string{"A productpage.ns1.svc.cluster.local. 10.10.10.10"}, true},
		// Short forms of a Service in the pod's namespace and another's.
		{"productpage.", dns.TypeA, []string{"A productpage. 10.10.10.10"}, true},
		{"productpage.ns1.", dns.TypeA, []string{"A productpage.ns1. 10.10.10.10"}, true},
		{"productpage.ns1.svc.", dns.TypeA, []string{"A productpage.ns1.svc. 10.10.10.10"}, true},
		{"reviews.ns2.", dns.TypeA, []string{"A reviews.ns2. 10.10.10.11"}, true},
		{"reviews.", dns.TypeA, nil, false}, // another namespace: no bare name
		{"reviews.ns2.svc.cluster.local.", dns.TypeAAAA, []string{"AAAA reviews.ns2.svc.cluster.local. fd00::11"}, true},
		// Another cluster's domain: the full name only.
		{"details.ns3.svc.remote.local.", dns.TypeA, []string{"A details.ns3.svc.remote.local. 10.10.10.12"}, true},
		{"details.ns3.", dns.TypeA, nil, false},
		// The first search domain appended: a CNAME and its addresses.
		{"productpage.ns1.ns1.svc.cluster.local.", dns.TypeA, []string{
			"CNAME productpage.ns1.ns1.svc.cluster.local. productpage.ns1.",
			"A productpage.ns1. 10.10.10.10",
		}, true},
		{"www.google.com.ns1.svc.cluster.local.", dns.TypeA, []string{
			"CNAME www.google.com.ns1.svc.cluster.local. www.google.com.",
			"A www.google.com. 1.1.1.1",
		}, true},
		// Only the first search domain is expanded.
		{"www.google.com.svc.cluster.local.", dns.TypeA, nil, false},
		// A known name without an address of the type: no answers, known.
		{"www.google.com.", dns.TypeAAAA, nil, true},
		{"v6.example.com.", dns.TypeA, nil, true},
		{"v6.example.com.", dns.TypeAAAA, []string{"AAAA v6.example.com. 2001:2::1"}, true},
		// Allocated addresses, both families.
		{"pg.example.com.", dns.TypeA, []string{"A pg.example.com. 240.240.0.1"}, true},
		{"pg.example.com.", dns.TypeAAAA, []string{"AAAA pg.example.com. 2001:2::1:1"}, true},
		// Wildcards answer with the name asked.
		{"foo.wildcard.example.com.", dns.TypeA, []string{"A foo.wildcard.example.com. 11.11.11.11"}, true},
		{"a.b.wildcard.example.com.", dns.TypeA, []string{"A a.b.wildcard.example.com. 11.11.11.11"}, true},
		{"foo.wildcard.example.com.ns1.svc.cluster.local.", dns.TypeA, []string{
			"CNAME foo.wildcard.example.com.ns1.svc.cluster.local. *.wildcard.example.com.",
			"A *.wildcard.example.com. 11.11.11.11",
		}, true},
		// Case does not matter; the question's is kept.
		{"WWW.Google.COM.", dns.TypeA, []string{"A WWW.Google.COM. 1.1.1.1"}, true},
		// Not fully qualified: as if it were.
		{"www.google.com", dns.TypeA, []string{"A www.google.com. 1.1.1.1"}, true},
		// Other types go upstream, as unknown names and hosts whose
		// addresses are all malformed.
		{"www.google.com.", dns.TypeMX, nil, false},
		{"www.bing.com.", dns.TypeA, nil, false},
		{"broken.example.com.", dns.TypeA, nil, false},
		{".", dns.TypeA, nil, false},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.name, dns.TypeToString[tc.qtype]), func(t *testing.T) {
			got, known := table.Lookup(tc.qtype, tc.name)
			if known != tc.known || !slices.Equal(answerStrings(got), tc.want) {
				t.Errorf("Lookup = %q, known %v; want %q, known %v", answerStrings(got), known, tc.want, tc.known)
			}
		})
	}
}

func TestANameTwoHostsClaimAnswersTheSameWhateverTheOrder(t *testing.T) {
	// "a.b." is both an external host and the short form of Service a in
	// namespace b: the sorted order decides, the same every time.
	nt := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"a.b":                   {Ips: []string{"1.1.1.1"}, Registry: "External"},
		"a.b.svc.cluster.local": {Ips: []string{"2.2.2.2"}, Registry: "Kubernetes", Shortname: "a", Namespace: "b"},
	}}
	var first []string
	for i := range 20 {
		table := NewTable(nt, TableOptions{Namespace: "b", Domain: "b.svc.cluster.local", Search: []string{"b.svc.cluster.local"}})
		got, _ := table.Lookup(dns.TypeA, "a.b.")
		if i == 0 {
			first = answerStrings(got)
			continue
		}
		if !slices.Equal(answerStrings(got), first) {
			t.Fatalf("build %d answered %q, the first %q", i, answerStrings(got), first)
		}
	}
	if want := []string{"A a.b. 1.1.1.1"}; !slices.Equal(first, want) {
		t.Errorf("a.b. = %q, want %q", first, want)
	}
}

func TestAnEmptyTableKnowsNoName(t *testing.T) {
	for _, table := range []*Table{nil, NewTable(nil, TableOptions{}), NewTable(&ndsv1.NameTable{}, TableOptions{Search: []string{"x"}})} {
		if got, known := table.Lookup(dns.TypeA, "www.google.com."); known || got != nil {
			t.Errorf("Lookup = %v, %v; want nothing", got, known)
		}
	}
}

func FuzzLookup(f *testing.F) {
	f.Add("productpage.ns1.svc.cluster.local.", uint16(dns.TypeA))
	f.Add("x.wildcard.example.com.ns1.svc.cluster.local.", uint16(dns.TypeAAAA))
	f.Add("..", uint16(dns.TypeA))
	f.Add("*.", uint16(dns.TypeA))
	table := testTable()
	f.Fuzz(func(t *testing.T, name string, qtype uint16) {
		answers, known := table.Lookup(qtype, name)
		if !known && answers != nil {
			t.Fatalf("answers %v for an unknown name", answers)
		}
		for _, rr := range answers {
			if rr.Header().Ttl != ttl {
				t.Fatalf("answer %v: ttl %d", rr, rr.Header().Ttl)
			}
		}
	})
}
