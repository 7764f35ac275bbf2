package capture

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NFTablesTable is the table the nftables backend owns, Istio's name for
// it (family inet: IPv4 and IPv6).
const NFTablesTable = "istio-proxy-nat"

// NFTablesRawTable is the table of DNS's conntrack zones, Istio's name
// for it; there only when the plan captures DNS.
const NFTablesRawTable = "istio-proxy-raw"

// ApplyNFTables installs the plan over netlink in one transaction: the
// tables (the raw one only for DNS's conntrack zones) are deleted (when
// present) and written anew in the same batch, so
// the kernel applies all of it or, on any error, none of it. netns, when
// set, is a named network namespace (/run/netns/<netns>), for tests; empty
// is the agent's own.
func ApplyNFTables(p Plan, netns string) error {
	var opts []nftables.ConnOption
	if netns != "" {
		f, err := os.Open(filepath.Join("/run/netns", netns))
		if err != nil {
			return fmt.Errorf("network namespace %s: %w", netns, err)
		}
		defer f.Close()
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: NFTablesTable}
	// Adding first makes the delete valid when the table is not there yet.
	conn.AddTable(table)
	conn.DelTable(table)
	conn.AddTable(table)
	accept := nftables.ChainPolicyAccept
	chains := map[Chain]*nftables.Chain{
		ChainPrerouting: conn.AddChain(&nftables.Chain{
			Name: ChainPrerouting.NFTables(), Table: table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept,
		}),
		ChainOutput: conn.AddChain(&nftables.Chain{
			Name: ChainOutput.NFTables(), Table: table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept,
		}),
	}
	for _, c := range p.Chains() {
		chains[c] = conn.AddChain(&nftables.Chain{Name: c.NFTables(), Table: table})
	}
	raw := &nftables.Table{Family: nftables.TableFamilyINet, Name: NFTablesRawTable}
	conn.AddTable(raw)
	conn.DelTable(raw)
	if rawChains := p.RawChains(); rawChains != nil {
		conn.AddTable(raw)
		chains[ChainRawPrerouting] = conn.AddChain(&nftables.Chain{
			Name: ChainRawPrerouting.NFTables(), Table: raw, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept,
		})
		chains[ChainRawOutput] = conn.AddChain(&nftables.Chain{
			Name: ChainRawOutput.NFTables(), Table: raw, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw, Policy: &accept,
		})
		for _, c := range rawChains {
			chains[c] = conn.AddChain(&nftables.Chain{Name: c.NFTables(), Table: raw})
		}
	}
	for _, r := range p.Rules {
		chain := chains[r.Chain]
		if chain == nil {
			return fmt.Errorf("rule in unknown chain %s", r.Chain.NFTables())
		}
		conn.AddRule(&nftables.Rule{Table: chain.Table, Chain: chain, Exprs: r.nftables()})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables: writing tables inet %s and %s: %w", NFTablesTable, NFTablesRawTable, err)
	}
	return nil
}

// nftables is the rule as netlink expressions: the matches in the order
// nft prints them, a counter (as Istio's rules have), then the verdict.
func (r Rule) nftables() []expr.Any {
	var e []expr.Any
	cmp := func(op expr.CmpOp, data []byte) { e = append(e, &expr.Cmp{Op: op, Register: 1, Data: data}) }
	if r.InIface != "" {
		e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1})
		cmp(expr.CmpOpEq, ifname(r.InIface))
	}
	if r.OutIface != "" {
		e = append(e, &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1})
		cmp(expr.CmpOpEq, ifname(r.OutIface))
	}
	if r.OutLoopback {
		e = append(e, &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1})
		cmp(expr.CmpOpEq, ifname("lo"))
	}
	for _, m := range []struct {
		p      netip.Prefix
		offset uint32
		not    bool
	}{{r.Src, 12, false}, {r.Dst, 16, r.NotDst}} {
		if !m.p.IsValid() {
			continue
		}
		family, offset, addr := byte(unix.NFPROTO_IPV4), m.offset, m.p.Addr().AsSlice()
		if m.p.Addr().Is6() {
			// IPv6's source and destination are at 8 and 24.
			family, offset = unix.NFPROTO_IPV6, 8+(m.offset-12)*4
		}
		n := uint32(len(addr)) //nolint:gosec // 4 or 16
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n},
		)
		if bits := m.p.Bits(); bits < len(addr)*8 {
			mask := make([]byte, n)
			for i := range bits {
				mask[i/8] |= 0x80 >> (i % 8)
			}
			e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)})
		}
		op := expr.CmpOpEq
		if m.not {
			op = expr.CmpOpNeq
		}
		cmp(op, addr)
	}
	if r.TCP || r.UDP {
		proto := byte(unix.IPPROTO_TCP)
		if r.UDP {
			proto = unix.IPPROTO_UDP
		}
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1})
		cmp(expr.CmpOpEq, []byte{proto})
		if r.DPort != 0 {
			op := expr.CmpOpEq
			if r.NotDPort {
				op = expr.CmpOpNeq
			}
			e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			cmp(op, binary.BigEndian.AppendUint16(nil, r.DPort))
		}
		if r.SPort != 0 {
			e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2})
			cmp(expr.CmpOpEq, binary.BigEndian.AppendUint16(nil, r.SPort))
		}
	}
	if o := r.Owner; o != nil {
		key := expr.MetaKeySKUID
		if o.Group {
			key = expr.MetaKeySKGID
		}
		e = append(e, &expr.Meta{Key: key, Register: 1})
		op := expr.CmpOpEq
		if o.Not {
			op = expr.CmpOpNeq
		}
		cmp(op, binary.NativeEndian.AppendUint32(nil, o.ID))
	}
	e = append(e, &expr.Counter{})
	switch r.Action {
	case Return:
		e = append(e, &expr.Verdict{Kind: expr.VerdictReturn})
	case Jump:
		e = append(e, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.To.NFTables()})
	case RedirectTo:
		e = append(e,
			&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, r.Port)},
			&expr.Redir{RegisterProtoMin: 1},
		)
	case SetZone:
		e = append(e,
			&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, r.Zone)},
			&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyZONE},
		)
	}
	return e
}

// ifname is an interface name as the kernel compares it: NUL-padded to
// IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// NFTables renders the plan as an nft script (nft -f) that installs what
// ApplyNFTables installs over netlink: the same table, chains and rules,
// replacing the table in one transaction.
func (p Plan) NFTables() string {
	var b strings.Builder
	t := "inet " + NFTablesTable
	fmt.Fprintf(&b, "add table %s\ndelete table %s\nadd table %s\n", t, t, t)
	fmt.Fprintf(&b, "add chain %s %s { type nat hook prerouting priority dstnat; policy accept; }\n", t, ChainPrerouting.NFTables())
	fmt.Fprintf(&b, "add chain %s %s { type nat hook output priority -100; policy accept; }\n", t, ChainOutput.NFTables())
	for _, c := range p.Chains() {
		fmt.Fprintf(&b, "add chain %s %s\n", t, c.NFTables())
	}
	raw := "inet " + NFTablesRawTable
	fmt.Fprintf(&b, "add table %s\ndelete table %s\n", raw, raw)
	if rawChains := p.RawChains(); rawChains != nil {
		fmt.Fprintf(&b, "add table %s\n", raw)
		fmt.Fprintf(&b, "add chain %s %s { type filter hook prerouting priority raw; policy accept; }\n", raw, ChainRawPrerouting.NFTables())
		fmt.Fprintf(&b, "add chain %s %s { type filter hook output priority raw; policy accept; }\n", raw, ChainRawOutput.NFTables())
		for _, c := range rawChains {
			fmt.Fprintf(&b, "add chain %s %s\n", raw, c.NFTables())
		}
	}
	for _, r := range p.Rules {
		in := t
		if r.Chain.Raw() {
			in = raw
		}
		fmt.Fprintf(&b, "add rule %s %s %s\n", in, r.Chain.NFTables(), r.nft())
	}
	return b.String()
}

// nft is the rule in nft's syntax, its matches in the order of the
// netlink expressions.
func (r Rule) nft() string {
	var parts []string
	if r.InIface != "" {
		parts = append(parts, fmt.Sprintf("iifname %q", r.InIface))
	}
	if r.OutIface != "" {
		parts = append(parts, fmt.Sprintf("oifname %q", r.OutIface))
	}
	if r.OutLoopback {
		parts = append(parts, `oifname "lo"`)
	}
	family := func(p netip.Prefix) string {
		if p.Addr().Is6() {
			return "ip6"
		}
		return "ip"
	}
	if r.Src.IsValid() {
		parts = append(parts, family(r.Src)+" saddr "+r.Src.String())
	}
	if r.Dst.IsValid() {
		op := ""
		if r.NotDst {
			op = "!= "
		}
		parts = append(parts, family(r.Dst)+" daddr "+op+r.Dst.String())
	}
	if proto := r.proto(); proto != "" {
		parts = append(parts, "meta l4proto "+proto)
		if r.DPort != 0 {
			op := ""
			if r.NotDPort {
				op = "!= "
			}
			parts = append(parts, proto+" dport "+op+strconv.Itoa(int(r.DPort)))
		}
		if r.SPort != 0 {
			parts = append(parts, proto+" sport "+strconv.Itoa(int(r.SPort)))
		}
	}
	if o := r.Owner; o != nil {
		key := "meta skuid "
		if o.Group {
			key = "meta skgid "
		}
		if o.Not {
			key += "!= "
		}
		parts = append(parts, key+strconv.FormatUint(uint64(o.ID), 10))
	}
	parts = append(parts, "counter")
	switch r.Action {
	case Return:
		parts = append(parts, "return")
	case Jump:
		parts = append(parts, "jump "+r.To.NFTables())
	case RedirectTo:
		parts = append(parts, "redirect to :"+strconv.Itoa(int(r.Port)))
	case SetZone:
		parts = append(parts, "ct zone set "+strconv.Itoa(int(r.Zone)))
	}
	return strings.Join(parts, " ")
}
