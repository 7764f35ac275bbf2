// Package capture builds the traffic capture the init container installs
// in a pod's network namespace, as Istio's istio-init does, and installs
// it with one of two backends:
//
//   - nftables (the default): programmed over netlink, with no binary, so
//     the agent's image stays FROM scratch. Its table and chains are
//     those of Istio's native nftables mode (table inet istio-proxy-nat,
//     chains prerouting, output, istio-inbound, istio-in-redirect,
//     istio-output, istio-output-dns, istio-redirect; with DNS capture,
//     table inet istio-proxy-raw for its conntrack zones).
//   - iptables: the nat table (and with DNS capture the raw table)
//     through iptables-restore, for nodes that need it, and
//     ip6tables-restore for DNS to IPv6 resolvers; the binaries must be
//     on the PATH.
//
// Build is pure: the same settings give the same Plan, and both backends
// install the same rules from it, in the same order. The whole capture is
// replaced atomically: a failure leaves what was there.
package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Ports the sidecar itself uses, never captured inbound.
const (
	PortHBONE      = 15008                      // mTLS tunnel
	PortAgent      = 15020                      // agent's merged metrics and health
	PortHealth     = 15021                      // readiness
	PortPrometheus = 15090                      // Envoy's stats
	PortDNSProxy   = proxycontract.DNSProxyPort // the agent's DNS proxy
	portDNS        = 53
)

// Settings say what to capture.
type Settings struct {
	// ProxyUID and ProxyGID run the sidecar; its own traffic is not
	// captured (default 1337).
	ProxyUID, ProxyGID uint32
	// InboundPort and OutboundPort are Envoy's virtualInbound and
	// virtualOutbound listeners (defaults proxycontract.InboundCapturePort
	// and OutboundCapturePort, where discovery puts them).
	InboundPort, OutboundPort uint16
	// InboundPorts to capture; empty means all TCP ports (unless
	// NoInbound).
	InboundPorts []uint16
	// NoInbound captures no inbound traffic (Istio's includeInboundPorts
	// set to "").
	NoInbound bool
	// ExcludeInboundPorts are never captured inbound (the sidecar's own
	// ports are added).
	ExcludeInboundPorts []uint16
	// IncludeOutboundIPRanges to capture: "*" captures all, no range
	// captures no outbound traffic (as Istio's includeOutboundIPRanges
	// annotation set to ""). ExcludeOutboundIPRanges and
	// ExcludeOutboundPorts are never captured.
	IncludeOutboundIPRanges []string
	ExcludeOutboundIPRanges []string
	ExcludeOutboundPorts    []uint16
	// IncludeOutboundPorts are captured outbound whatever their
	// destination (but the excluded ranges).
	IncludeOutboundPorts []uint16
	// ExcludeInterfaces: nothing arriving or leaving through them is
	// captured.
	ExcludeInterfaces []string
	// RedirectDNS captures the pod's DNS to the agent's DNS proxy on
	// DNSPort (Istio's --redirect-dns, ISTIO_META_DNS_CAPTURE): UDP and
	// TCP to port 53 of DNSServers (the pod's resolvers, IPv4 and IPv6),
	// or of any address with CaptureAllDNS. The proxy's own queries pass.
	RedirectDNS   bool
	CaptureAllDNS bool
	DNSServers    []netip.Addr
	DNSPort       uint16
	// RerouteInterfaces (Istio's kubevirtInterfaces and
	// reroute-virtual-interfaces): what arrives through them is sent to
	// Envoy's outbound listener as if the pod sent it (a VM's traffic in a
	// KubeVirt pod), for the included ranges.
	RerouteInterfaces []string
}

func (s *Settings) defaults() {
	if s.ProxyUID == 0 {
		s.ProxyUID = proxycontract.ProxyUID
	}
	if s.ProxyGID == 0 {
		s.ProxyGID = proxycontract.ProxyGID
	}
	if s.InboundPort == 0 {
		s.InboundPort = proxycontract.InboundCapturePort
	}
	if s.OutboundPort == 0 {
		s.OutboundPort = proxycontract.OutboundCapturePort
	}
	if s.DNSPort == 0 {
		s.DNSPort = PortDNSProxy
	}
}

// Chain is one chain of the capture.
type Chain int

// The chains: the two hooks (nat PREROUTING and OUTPUT) and the four
// chains of the capture itself.
const (
	ChainPrerouting Chain = iota
	ChainOutput
	ChainInbound    // ISTIO_INBOUND: what arrives
	ChainInRedirect // ISTIO_IN_REDIRECT: to Envoy's inbound listener
	ChainOutbound   // ISTIO_OUTPUT: what leaves
	ChainRedirect   // ISTIO_REDIRECT: to Envoy's outbound listener
	ChainOutputDNS  // ISTIO_OUTPUT_DNS: DNS to the agent's DNS proxy

	// The raw table's, for DNS's conntrack zones.
	ChainRawPrerouting // PREROUTING hook
	ChainRawOutput     // OUTPUT hook
	ChainRawInbound    // ISTIO_INBOUND: answers from the resolvers
	ChainRawOutputDNS  // ISTIO_OUTPUT_DNS: queries to and from them
)

// Raw reports whether the chain is in the raw table (else the nat table).
func (c Chain) Raw() bool { return c >= ChainRawPrerouting }

// RawChains lists the raw table's own chains when the plan has rules
// there, in the order they are declared; none otherwise.
func (p Plan) RawChains() []Chain {
	for _, r := range p.Rules {
		if r.Chain.Raw() {
			return []Chain{ChainRawInbound, ChainRawOutputDNS}
		}
	}
	return nil
}

// Chains lists the capture's own chains (not the hooks), in the order
// they are declared (iptables-save's, by name); ISTIO_OUTPUT_DNS only
// when the plan captures DNS.
func (p Plan) Chains() []Chain {
	for _, r := range p.Rules {
		if r.Chain == ChainOutputDNS {
			return []Chain{ChainInbound, ChainInRedirect, ChainOutbound, ChainOutputDNS, ChainRedirect}
		}
	}
	return []Chain{ChainInbound, ChainInRedirect, ChainOutbound, ChainRedirect}
}

// IPTables is the chain's name in the nat table.
func (c Chain) IPTables() string {
	switch c {
	case ChainPrerouting:
		return "PREROUTING"
	case ChainOutput:
		return "OUTPUT"
	case ChainInbound:
		return "ISTIO_INBOUND"
	case ChainInRedirect:
		return "ISTIO_IN_REDIRECT"
	case ChainOutbound:
		return "ISTIO_OUTPUT"
	case ChainRedirect:
		return "ISTIO_REDIRECT"
	case ChainOutputDNS, ChainRawOutputDNS:
		return "ISTIO_OUTPUT_DNS"
	case ChainRawPrerouting:
		return "PREROUTING"
	case ChainRawOutput:
		return "OUTPUT"
	case ChainRawInbound:
		return "ISTIO_INBOUND"
	}
	return fmt.Sprintf("UNKNOWN_%d", int(c))
}

// NFTables is the chain's name in Istio's nftables table.
func (c Chain) NFTables() string {
	switch c {
	case ChainPrerouting:
		return "prerouting"
	case ChainOutput:
		return "output"
	case ChainInbound:
		return "istio-inbound"
	case ChainInRedirect:
		return "istio-in-redirect"
	case ChainOutbound:
		return "istio-output"
	case ChainRedirect:
		return "istio-redirect"
	case ChainOutputDNS, ChainRawOutputDNS:
		return "istio-output-dns"
	case ChainRawPrerouting:
		return "prerouting"
	case ChainRawOutput:
		return "output"
	case ChainRawInbound:
		return "istio-inbound"
	}
	return fmt.Sprintf("unknown-%d", int(c))
}

// Action is what a rule does with a matching packet.
type Action int

// The actions.
const (
	Return     Action = iota // leave the chain
	Jump                     // go to Target.Chain
	RedirectTo               // redirect to Target.Port on this host
	SetZone                  // put the connection in conntrack zone Target.Zone
)

// Target is a rule's action and its argument.
type Target struct {
	Action Action
	To     Chain  // for Jump
	Port   uint16 // for RedirectTo
	Zone   uint16 // for SetZone
}

// Owner matches the socket's user or group.
type Owner struct {
	ID    uint32
	Group bool // a group ID, not a user ID
	Not   bool // anyone but ID
}

// Rule is one rule: every match given must hold.
type Rule struct {
	Chain Chain
	// Src and Dst match source and destination ranges when valid (IPv4;
	// IPv6 only in the DNS chains, see IP6Tables); NotDst inverts Dst.
	Src, Dst netip.Prefix
	NotDst   bool
	// OutLoopback matches packets leaving through lo.
	OutLoopback bool
	// InIface and OutIface match the interface a packet arrives or
	// leaves through, when set.
	InIface, OutIface string
	// TCP and UDP match the protocol; DPort (with one) its destination
	// port, every port but it with NotDPort; SPort its source port.
	TCP, UDP bool
	DPort    uint16
	NotDPort bool
	SPort    uint16
	Owner    *Owner
	Target
}

// Plan is the capture: its rules in order.
type Plan struct{ Rules []Rule }

// Build returns the capture for s.
func Build(s Settings) (Plan, error) {
	s.defaults()
	include, all, err := ranges(s.IncludeOutboundIPRanges, true)
	if err != nil {
		return Plan{}, fmt.Errorf("includeOutboundIPRanges: %w", err)
	}
	exclude, _, err := ranges(s.ExcludeOutboundIPRanges, false)
	if err != nil {
		return Plan{}, fmt.Errorf("excludeOutboundIPRanges: %w", err)
	}
	for _, iface := range slices.Concat(s.ExcludeInterfaces, s.RerouteInterfaces) {
		if !proxycontract.ValidInterfaceName(iface) {
			return Plan{}, fmt.Errorf("interface %q: want a Linux interface name (1 to 15 letters, digits, '.', '_', '-', '@')", iface)
		}
	}
	var p Plan
	add := func(r Rule) { p.Rules = append(p.Rules, r) }
	ret := Target{Action: Return}
	jump := func(c Chain) Target { return Target{Action: Jump, To: c} }

	// As Istio's iptables Run: traffic of the rerouted interfaces to the
	// included ranges goes to Envoy's outbound listener, the rest of it
	// and of the excluded interfaces passes, before any capture.
	for _, iface := range s.RerouteInterfaces {
		if all {
			add(Rule{Chain: ChainPrerouting, InIface: iface, Target: jump(ChainRedirect)})
		}
		for _, r := range include {
			add(Rule{Chain: ChainPrerouting, InIface: iface, Dst: r, Target: jump(ChainRedirect)})
		}
	}
	for _, iface := range s.RerouteInterfaces {
		add(Rule{Chain: ChainPrerouting, InIface: iface, Target: ret})
	}
	for _, iface := range s.ExcludeInterfaces {
		add(Rule{Chain: ChainPrerouting, InIface: iface, Target: ret})
	}
	add(Rule{Chain: ChainPrerouting, TCP: true, Target: jump(ChainInbound)})
	for _, iface := range s.ExcludeInterfaces {
		add(Rule{Chain: ChainOutput, OutIface: iface, Target: ret})
	}
	add(Rule{Chain: ChainOutput, TCP: true, Target: jump(ChainOutbound)})
	dns := s.RedirectDNS && (s.CaptureAllDNS || len(s.DNSServers) > 0)
	if dns {
		// Istio hooks all of OUTPUT; here only what the capture takes.
		add(Rule{Chain: ChainOutput, UDP: true, DPort: portDNS, Target: jump(ChainOutbound)})
	}

	// Inbound: the sidecar's own ports and the excluded ones pass; the
	// rest (or the listed ports) go to Envoy's inbound listener.
	skip := slices.Concat([]uint16{PortHBONE, PortAgent, PortHealth, PortPrometheus}, s.ExcludeInboundPorts)
	slices.Sort(skip)
	skip = slices.Compact(skip)
	switch {
	case s.NoInbound:
	case len(s.InboundPorts) == 0:
		for _, port := range skip {
			add(Rule{Chain: ChainInbound, TCP: true, DPort: port, Target: ret})
		}
		add(Rule{Chain: ChainInbound, TCP: true, Target: jump(ChainInRedirect)})
	default:
		ports := slices.Clone(s.InboundPorts)
		slices.Sort(ports)
		for _, port := range slices.Compact(ports) {
			if !slices.Contains(skip, port) {
				add(Rule{Chain: ChainInbound, TCP: true, DPort: port, Target: jump(ChainInRedirect)})
			}
		}
	}
	add(Rule{Chain: ChainInRedirect, TCP: true, Target: Target{Action: RedirectTo, Port: s.InboundPort}})

	// Outbound: traffic Envoy sends to itself through the inbound path
	// (proxycontract.InboundPassthroughSource) passes; the application calling itself over a non-
	// loopback address is captured inbound; everything else the proxy
	// sends, loopback, excluded ports and ranges pass; the rest goes to
	// Envoy's outbound listener.
	loopback := netip.MustParsePrefix("127.0.0.1/32")
	add(Rule{Chain: ChainOutbound, Src: netip.PrefixFrom(netip.MustParseAddr(proxycontract.InboundPassthroughSource), 32), OutLoopback: true, Target: ret})
	for _, group := range []bool{false, true} {
		id := s.ProxyUID
		if group {
			id = s.ProxyGID
		}
		toSelf := Rule{Chain: ChainOutbound, Dst: loopback, NotDst: true, OutLoopback: true, TCP: true, Owner: &Owner{ID: id, Group: group}, Target: jump(ChainInRedirect)}
		local := Rule{Chain: ChainOutbound, OutLoopback: true, Owner: &Owner{ID: id, Group: group, Not: true}, Target: ret}
		if dns {
			// As Istio's: the application's DNS to a resolver on loopback
			// is captured too, so it does not pass as local traffic, and
			// the proxy's own TCP DNS there is not sent to Envoy.
			if !group {
				toSelf.DPort, toSelf.NotDPort = portDNS, true
			}
			local.TCP, local.DPort, local.NotDPort = true, portDNS, true
		}
		add(toSelf)
		add(local)
		add(Rule{Chain: ChainOutbound, Owner: &Owner{ID: id, Group: group}, Target: ret})
	}
	if dns {
		add(Rule{Chain: ChainOutbound, Target: jump(ChainOutputDNS)})
		dnsRules(s, add)
		zoneRules(s, add)
	}
	add(Rule{Chain: ChainOutbound, Dst: loopback, Target: ret})
	ports := slices.Clone(s.ExcludeOutboundPorts)
	slices.Sort(ports)
	for _, port := range slices.Compact(ports) {
		add(Rule{Chain: ChainOutbound, TCP: true, DPort: port, Target: ret})
	}
	for _, r := range exclude {
		add(Rule{Chain: ChainOutbound, Dst: r, Target: ret})
	}
	ports = slices.Clone(s.IncludeOutboundPorts)
	slices.Sort(ports)
	for _, port := range slices.Compact(ports) {
		add(Rule{Chain: ChainOutbound, TCP: true, DPort: port, Target: jump(ChainRedirect)})
	}
	if all {
		add(Rule{Chain: ChainOutbound, Target: jump(ChainRedirect)})
	} else {
		for _, r := range include { // none: outbound is not captured
			add(Rule{Chain: ChainOutbound, Dst: r, Target: jump(ChainRedirect)})
		}
	}
	add(Rule{Chain: ChainRedirect, TCP: true, Target: Target{Action: RedirectTo, Port: s.OutboundPort}})
	return p, nil
}

// dnsRules are ISTIO_OUTPUT_DNS's (Istio's SetupDNSRedir): TCP, then
// UDP, to port 53 of each resolver (so a resolver the agent itself
// forwards to on this host is not looped back), or of any address.
func dnsRules(s Settings, add func(Rule)) {
	servers := resolvers(s)
	to := Target{Action: RedirectTo, Port: s.DNSPort}
	for _, udp := range []bool{false, true} {
		if s.CaptureAllDNS {
			add(Rule{Chain: ChainOutputDNS, TCP: !udp, UDP: udp, DPort: portDNS, Target: to})
			continue
		}
		for _, a := range servers {
			add(Rule{Chain: ChainOutputDNS, TCP: !udp, UDP: udp, DPort: portDNS, Dst: netip.PrefixFrom(a, a.BitLen()), Target: to})
		}
	}
}

// zoneRules put DNS over UDP in two conntrack zones, as Istio's
// addDNSConntrackZones: the proxy's queries to the resolvers and their
// answers in zone 1, the application's queries (redirected to the proxy)
// and the proxy's answers in zone 2 — so a query of the application and
// one of the proxy from the same source port to the same resolver are
// two connections, not one the kernel drops the second packet of.
func zoneRules(s Settings, add func(Rule)) {
	zone := func(z uint16) Target { return Target{Action: SetZone, Zone: z} }
	add(Rule{Chain: ChainRawOutput, Target: Target{Action: Jump, To: ChainRawOutputDNS}})
	for _, group := range []bool{false, true} {
		id := s.ProxyUID
		if group {
			id = s.ProxyGID
		}
		add(Rule{Chain: ChainRawOutputDNS, UDP: true, DPort: portDNS, Owner: &Owner{ID: id, Group: group}, Target: zone(1)})
		add(Rule{Chain: ChainRawOutputDNS, UDP: true, SPort: s.DNSPort, Owner: &Owner{ID: id, Group: group}, Target: zone(2)})
	}
	add(Rule{Chain: ChainRawPrerouting, Target: Target{Action: Jump, To: ChainRawInbound}})
	if s.CaptureAllDNS {
		add(Rule{Chain: ChainRawOutputDNS, UDP: true, DPort: portDNS, Target: zone(2)})
		add(Rule{Chain: ChainRawInbound, UDP: true, SPort: portDNS, Target: zone(1)})
		return
	}
	for _, a := range resolvers(s) {
		p := netip.PrefixFrom(a, a.BitLen())
		add(Rule{Chain: ChainRawOutputDNS, UDP: true, DPort: portDNS, Dst: p, Target: zone(2)})
		add(Rule{Chain: ChainRawInbound, UDP: true, SPort: portDNS, Src: p, Target: zone(1)})
	}
}

// resolvers are the settings' DNS servers, sorted, each once.
func resolvers(s Settings) []netip.Addr {
	out := make([]netip.Addr, 0, len(s.DNSServers))
	for _, a := range s.DNSServers {
		out = append(out, a.Unmap())
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// ranges parses CIDRs (IPv4; a bare address is a /32), sorted and without
// duplicates. With star, "*" means everything (all).
func ranges(in []string, star bool) (out []netip.Prefix, all bool, err error) {
	for _, s := range in {
		for _, f := range strings.Split(s, ",") {
			f = strings.TrimSpace(f)
			switch {
			case f == "":
				continue
			case f == "*" && star:
				return nil, true, nil
			case f == "*":
				return nil, false, errors.New(`"*" is not a range here`)
			}
			var p netip.Prefix
			if strings.Contains(f, "/") {
				p, err = netip.ParsePrefix(f)
			} else {
				var a netip.Addr
				a, err = netip.ParseAddr(f)
				p = netip.PrefixFrom(a, a.BitLen())
			}
			if err != nil {
				return nil, false, fmt.Errorf("%q is not an IP range", f)
			}
			if !p.Addr().Is4() {
				return nil, false, fmt.Errorf("%q: only IPv4 ranges are captured", f)
			}
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), false, nil
}
