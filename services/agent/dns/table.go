package dns

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// ttl is the answers' TTL, low so that a client that caches them soon
// asks again (Istio's defaultTTLInSeconds).
const ttl = 30

// TableOptions say where the pod is, which decides the short names the
// table answers.
type TableOptions struct {
	// Namespace is the pod's namespace: "<name>." is answered for its
	// own namespace's Services.
	Namespace string
	// Domain is the pod's DNS domain, "<namespace>.svc.<cluster domain>"
	// (pilot-agent's --domain) or "svc.<cluster domain>".
	Domain string
	// Search are the resolver's search domains (resolv.conf), in order:
	// every name is also answered with the first appended, by a CNAME to
	// the name, so the first query of a search walk ends it.
	Search []string
}

// entry is what a name answers: addresses, or a CNAME to another name of
// the table (an expansion by the first search domain).
type entry struct {
	v4, v6 []netip.Addr
	cname  string
}

// Table is the lookup table built from one name table, Istio's
// LookupTable (pkg/dns/client/dns.go): names are lower case, fully
// qualified, with the trailing dot. It is immutable once built: queries
// read it without locks and an update replaces it.
type Table struct {
	names map[string]*entry
	// source is the name table it was built from, for /debug/ndsz.
	source *ndsv1.NameTable
}

// NewTable builds the lookup table of nt for a pod, as Istio's
// LocalDNSServer.UpdateLookupTable: a Kubernetes Service's host is also
// answered as "<name>.<namespace>.", "<name>.<namespace>.svc." and, in
// the pod's namespace, "<name>."; every name also with the first search
// domain appended (a CNAME to it). Hosts without a valid address are
// left out.
func NewTable(nt *ndsv1.NameTable, o TableOptions) *Table {
	t := &Table{names: make(map[string]*entry, len(nt.GetTable())), source: nt}
	// The domain without the namespace: "svc.cluster.local" (Istio's
	// NewLocalDNSServer strips a leading "<namespace>.").
	parts := strings.Split(o.Domain, ".")
	if len(parts) > 0 && parts[0] == o.Namespace {
		parts = parts[1:]
	}
	domain := strings.Join(parts, ".")
	var search string
	if len(o.Search) > 0 {
		search = strings.ToLower(strings.TrimSuffix(o.Search[0], ".")) + "."
	}
	// Sorted, so a name two hosts claim answers the same whatever order
	// the table came in; expansions after every host's own names, so an
	// expansion never hides a host.
	hosts := slices.Sorted(maps.Keys(nt.GetTable()))
	var expand []string
	for _, host := range hosts {
		info := nt.GetTable()[host]
		e := &entry{}
		for _, s := range info.GetIps() {
			a, err := netip.ParseAddr(s)
			switch {
			case err != nil || a.Zone() != "":
			case a.Is4() || a.Is4In6():
				e.v4 = append(e.v4, a.Unmap())
			default:
				e.v6 = append(e.v6, a)
			}
		}
		if len(e.v4) == 0 && len(e.v6) == 0 {
			continue
		}
		for _, name := range altHosts(host, info, o.Namespace, domain, parts) {
			if _, taken := t.names[name]; !taken {
				t.names[name] = e
				expand = append(expand, name)
			}
		}
	}
	if search != "" {
		for _, name := range expand {
			if strings.HasSuffix(name, search) {
				continue
			}
			if expanded := name + search; t.names[expanded] == nil {
				t.names[expanded] = &entry{cname: name}
			}
		}
	}
	return t
}

// altHosts are the names host is answered by (Istio's generateAltHosts
// for a Kubernetes Service, else the host alone), lower case and fully
// qualified.
func altHosts(host string, info *ndsv1.NameTable_NameInfo, namespace, domain string, domainParts []string) []string {
	host = strings.ToLower(host)
	if info.GetRegistry() != proxycontract.NameTableKubernetes {
		return []string{strings.TrimSuffix(host, ".") + "."}
	}
	if strings.HasSuffix(host, ".") {
		return nil // Istio answers no Kubernetes host given fully qualified
	}
	out := []string{host + "."}
	// Only in the pod's own cluster domain: elsewhere "<name>.<namespace>"
	// would be ambiguous.
	if domain == "" || !strings.HasSuffix(host, domain) || info.GetShortname() == "" {
		return out
	}
	short, ns := strings.ToLower(info.GetShortname()), strings.ToLower(info.GetNamespace())
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	add(short + "." + ns + ".")
	if ns == strings.ToLower(namespace) {
		add(short + ".")
	}
	add(short + "." + ns + "." + domainParts[0] + ".")
	return out
}

// Len is the number of names the table answers (expansions included).
func (t *Table) Len() int { return len(t.names) }

// Lookup answers a question as Istio's lookupHost: known is false for a
// name the table does not hold (the query goes upstream); a known name
// with no address of the type asked has no answers (NOERROR, never
// NXDOMAIN, so a client asking A and AAAA at once does not give up). A
// wildcard host "*.example.com" answers every name under it with the name
// asked. Only A and AAAA are answered: other types of known names go
// upstream. name is matched without regard to case.
func (t *Table) Lookup(qtype uint16, name string) (answers []dns.RR, known bool) {
	if t == nil || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
		return nil, false
	}
	question := dns.Fqdn(name)
	key := strings.ToLower(question)
	e, ok := t.names[key]
	wildcard := false
	if !ok {
		labels := dns.SplitDomainName(key)
		for i := range labels {
			if e, ok = t.names["*."+strings.Join(labels[i+1:], ".")+"."]; ok {
				wildcard = true
				break
			}
		}
	}
	if !ok {
		return nil, false
	}
	owner := question
	if e.cname != "" {
		answers = append(answers, &dns.CNAME{Hdr: header(question, dns.TypeCNAME), Target: e.cname})
		owner = e.cname
		if e = t.names[e.cname]; e == nil {
			return nil, true
		}
	}
	if wildcard && len(answers) == 0 {
		owner = question
	}
	var addrs []dns.RR
	if qtype == dns.TypeA {
		for _, a := range e.v4 {
			addrs = append(addrs, &dns.A{Hdr: header(owner, dns.TypeA), A: a.AsSlice()})
		}
	} else {
		for _, a := range e.v6 {
			addrs = append(addrs, &dns.AAAA{Hdr: header(owner, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	if len(addrs) == 0 {
		return nil, true // the CNAME alone is not an answer (Istio's)
	}
	return append(answers, addrs...), true
}

func header(name string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: ttl}
}
