package capture

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// cases are the settings every test runs; testdata/<case>.iptables is the
// iptables-restore input Build renders, testdata/<case>.nft what nft
// lists after the nftables backend installed it.
var cases = map[string]Settings{
	"defaults": {IncludeOutboundIPRanges: []string{"*"}},
	// Istio's includeOutboundIPRanges: "" — inbound only.
	"no-outbound-capture": {},
	"include-and-exclude": {
		IncludeOutboundIPRanges: []string{"10.96.0.0/12, 10.0.0.0/8"},
		ExcludeOutboundIPRanges: []string{"10.96.0.1", "169.254.169.254/32"},
		ExcludeOutboundPorts:    []uint16{3306, 5432, 3306},
		ExcludeInboundPorts:     []uint16{9999},
	},
	"listed-inbound-ports": {
		InboundPorts:            []uint16{8080, 9090, 15090},
		IncludeOutboundIPRanges: []string{"*"},
		ExcludeOutboundPorts:    []uint16{53},
		ProxyUID:                1000, ProxyGID: 1001,
		InboundPort: 16006, OutboundPort: 16001,
	},
	"no-outbound-capture-of-a-range": {
		IncludeOutboundIPRanges: []string{"*"},
		ExcludeOutboundIPRanges: []string{"192.168.0.0/16"},
	},
	// Istio's includeInboundPorts "", includeOutboundPorts,
	// excludeInterfaces and kubevirtInterfaces: no inbound capture;
	// ports 6379 and 11211 captured to any address but the excluded
	// range; nothing through eth1; what the VM sends through vm0 to the
	// included ranges captured outbound.
	"interfaces-and-outbound-ports": {
		NoInbound:               true,
		IncludeOutboundIPRanges: []string{"10.96.0.0/12"},
		ExcludeOutboundIPRanges: []string{"10.96.0.1"},
		IncludeOutboundPorts:    []uint16{11211, 6379},
		ExcludeInterfaces:       []string{"eth1"},
		RerouteInterfaces:       []string{"vm0"},
	},
	// Istio's ISTIO_META_DNS_CAPTURE: DNS to the pod's resolvers, one of
	// them on loopback and one IPv6, goes to the agent's DNS proxy.
	"dns": {
		IncludeOutboundIPRanges: []string{"*"},
		RedirectDNS:             true,
		DNSServers:              []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("127.0.0.53"), netip.MustParseAddr("fd00::a"), netip.MustParseAddr("10.96.0.10")},
	},
	// CAPTURE_ALL_DNS: port 53 of any address.
	"dns-all": {
		IncludeOutboundIPRanges: []string{"10.0.0.0/8"},
		RedirectDNS:             true, CaptureAllDNS: true,
	},
	// Redirect asked without resolvers: nothing of DNS is captured (as
	// Istio's, which warns).
	"dns-without-resolvers": {
		IncludeOutboundIPRanges: []string{"*"},
		RedirectDNS:             true,
	},
}

// checkGolden compares got with testdata/name (-update writes it).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if got != string(want) {
		t.Fatalf("%s differs; got:\n%s", path, got)
	}
}

func TestIPTablesGoldens(t *testing.T) {
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Build(s)
			if again.IPTables() != p.IPTables() {
				t.Fatal("two builds differ")
			}
			checkGolden(t, name+".iptables", p.IPTables())
			if v6 := p.IP6Tables(); v6 != "" {
				checkGolden(t, name+".ip6tables", v6)
			}
		})
	}
}

func TestBadRangesAreRefused(t *testing.T) {
	for _, s := range []Settings{
		{IncludeOutboundIPRanges: []string{"10.0.0.0/33"}},
		{ExcludeOutboundIPRanges: []string{"not-an-ip"}},
		{ExcludeOutboundIPRanges: []string{"*"}},
		{IncludeOutboundIPRanges: []string{"fd00::/8"}},
		{ExcludeInterfaces: []string{"eth0 -j ACCEPT"}},
		{RerouteInterfaces: []string{"a-name-longer-than-15"}},
		{ExcludeInterfaces: []string{""}},
		{RerouteInterfaces: []string{`"lo"`}},
	} {
		if _, err := Build(s); err == nil {
			t.Errorf("%+v: accepted", s)
		}
	}
}
