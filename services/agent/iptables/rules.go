// Package iptables builds the traffic-capture rules the init container
// installs in a pod's network namespace (the nat table, as Istio's
// istio-init does), and applies them atomically with iptables-restore.
// Rules is pure: the same settings give the same rules, in the canonical
// form iptables-save prints them back in.
package iptables

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Ports the sidecar itself uses, never captured inbound.
const (
	PortHBONE      = 15008 // mTLS tunnel
	PortAgent      = 15020 // agent's merged metrics and health
	PortHealth     = 15021 // readiness
	PortPrometheus = 15090 // Envoy's stats
)

// Settings say what to capture.
type Settings struct {
	// ProxyUID and ProxyGID run the sidecar; its own traffic is not
	// captured (default 1337).
	ProxyUID, ProxyGID uint32
	// InboundPort and OutboundPort are Envoy's virtualInbound and
	// virtualOutbound listeners (defaults 15006, 15001).
	InboundPort, OutboundPort uint16
	// InboundPorts to capture; empty means all TCP ports.
	InboundPorts []uint16
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
}

func (s *Settings) defaults() {
	if s.ProxyUID == 0 {
		s.ProxyUID = 1337
	}
	if s.ProxyGID == 0 {
		s.ProxyGID = 1337
	}
	if s.InboundPort == 0 {
		s.InboundPort = 15006
	}
	if s.OutboundPort == 0 {
		s.OutboundPort = 15001
	}
}

// Chains Flotilla adds to the nat table.
const (
	chainInbound    = "ISTIO_INBOUND"
	chainInRedirect = "ISTIO_IN_REDIRECT"
	chainOutput     = "ISTIO_OUTPUT"
	chainRedirect   = "ISTIO_REDIRECT"
)

// Rules returns the iptables-restore input for the nat table.
func Rules(s Settings) (string, error) {
	s.defaults()
	include, all, err := ranges(s.IncludeOutboundIPRanges, true)
	if err != nil {
		return "", fmt.Errorf("includeOutboundIPRanges: %w", err)
	}
	exclude, _, err := ranges(s.ExcludeOutboundIPRanges, false)
	if err != nil {
		return "", fmt.Errorf("excludeOutboundIPRanges: %w", err)
	}
	uid, gid := strconv.FormatUint(uint64(s.ProxyUID), 10), strconv.FormatUint(uint64(s.ProxyGID), 10)
	var r []string
	add := func(format string, args ...any) { r = append(r, fmt.Sprintf(format, args...)) }

	add("-A PREROUTING -p tcp -j %s", chainInbound)
	add("-A OUTPUT -p tcp -j %s", chainOutput)

	// Inbound: the sidecar's own ports and the excluded ones pass; the
	// rest (or the listed ports) go to Envoy's inbound listener.
	skip := slices.Concat([]uint16{PortHBONE, PortAgent, PortHealth, PortPrometheus}, s.ExcludeInboundPorts)
	slices.Sort(skip)
	skip = slices.Compact(skip)
	if len(s.InboundPorts) == 0 {
		for _, p := range skip {
			add("-A %s -p tcp -m tcp --dport %d -j RETURN", chainInbound, p)
		}
		add("-A %s -p tcp -j %s", chainInbound, chainInRedirect)
	} else {
		ports := slices.Clone(s.InboundPorts)
		slices.Sort(ports)
		for _, p := range slices.Compact(ports) {
			if !slices.Contains(skip, p) {
				add("-A %s -p tcp -m tcp --dport %d -j %s", chainInbound, p, chainInRedirect)
			}
		}
	}
	add("-A %s -p tcp -j REDIRECT --to-ports %d", chainInRedirect, s.InboundPort)

	// Outbound: traffic Envoy sends to itself through the inbound path
	// (127.0.0.6) passes; the application calling itself over a non-
	// loopback address is captured inbound; everything else the proxy
	// sends, loopback, excluded ports and ranges pass; the rest goes to
	// Envoy's outbound listener.
	add("-A %s -s 127.0.0.6/32 -o lo -j RETURN", chainOutput)
	add("-A %s ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner %s -j %s", chainOutput, uid, chainInRedirect)
	add("-A %s -o lo -m owner ! --uid-owner %s -j RETURN", chainOutput, uid)
	add("-A %s -m owner --uid-owner %s -j RETURN", chainOutput, uid)
	add("-A %s ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner %s -j %s", chainOutput, gid, chainInRedirect)
	add("-A %s -o lo -m owner ! --gid-owner %s -j RETURN", chainOutput, gid)
	add("-A %s -m owner --gid-owner %s -j RETURN", chainOutput, gid)
	add("-A %s -d 127.0.0.1/32 -j RETURN", chainOutput)
	ports := slices.Clone(s.ExcludeOutboundPorts)
	slices.Sort(ports)
	for _, p := range slices.Compact(ports) {
		add("-A %s -p tcp -m tcp --dport %d -j RETURN", chainOutput, p)
	}
	for _, p := range exclude {
		add("-A %s -d %s -j RETURN", chainOutput, p)
	}
	if all {
		add("-A %s -j %s", chainOutput, chainRedirect)
	} else {
		for _, p := range include { // none: outbound is not captured
			add("-A %s -d %s -j %s", chainOutput, p, chainRedirect)
		}
	}
	add("-A %s -p tcp -j REDIRECT --to-ports %d", chainRedirect, s.OutboundPort)

	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range []string{chainInbound, chainInRedirect, chainOutput, chainRedirect} {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, line := range r {
		b.WriteString(line + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String(), nil
}

// ranges parses CIDRs (IPv4; a bare address is a /32), sorted and without
// duplicates. With star, "*" means everything (all).
func ranges(in []string, star bool) (out []string, all bool, err error) {
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
				return nil, false, fmt.Errorf("%q: only IPv4 ranges are captured (ip6tables rules are not built)", f)
			}
			out = append(out, p.Masked().String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out), false, nil
}
