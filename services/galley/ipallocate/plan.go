// Package ipallocate gives every ServiceEntry host without an address of
// its own an IPv4 and an IPv6 address from reserved ranges, written to the
// ServiceEntry's status.addresses, as Istio's IP autoallocate controller
// (pilot/pkg/controllers/ipallocate): the status is the one record, so
// every discovery replica, and every galley replica after a failover,
// serves the same addresses, and a host keeps its address for as long as
// it is in the ServiceEntry. Proxies that capture DNS route TCP to such a
// host by its own listener on that address, and the name table answers the
// host with it. Only the elected galley replica writes.
//
// The planning (plan.go) is pure; Controller (controller.go) is its shell.
package ipallocate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/normalize"
)

// Istio's default ranges (PILOT_IP_AUTOALLOCATE_IPV4_PREFIX and
// PILOT_IP_AUTOALLOCATE_IPV6_PREFIX).
const (
	DefaultIPv4Prefix = "240.240.0.0/16"
	DefaultIPv6Prefix = "2001:2::/48"
)

// Allocator plans status.addresses. It remembers where it allocated last
// in each range, so that an address given up (its ServiceEntry deleted)
// is not handed out again until the range has been gone through, as
// Istio's allocator. Not safe for concurrent use; one per leadership term.
type Allocator struct {
	v4, v6 *prefix
}

// New returns an allocator over the two ranges.
func New(v4, v6 netip.Prefix) (*Allocator, error) {
	if !v4.IsValid() || !v4.Addr().Is4() {
		return nil, fmt.Errorf("IPv4 range %q: not an IPv4 prefix", v4)
	}
	if !v6.IsValid() || !v6.Addr().Is6() || v6.Addr().Is4In6() {
		return nil, fmt.Errorf("IPv6 range %q: not an IPv6 prefix", v6)
	}
	return &Allocator{v4: newPrefix(v4.Masked()), v6: newPrefix(v6.Masked())}, nil
}

// Change is one ServiceEntry whose status.addresses must become Addresses
// (empty: cleared), from what they are now (Current, for the write to
// check that they still are).
type Change struct {
	ID        istio.ID
	Current   []*networking.ServiceEntryAddress
	Addresses []*networking.ServiceEntryAddress
	// Allocated are the addresses among Addresses new to this plan: give
	// them back (Release) if the change is not written.
	Allocated []netip.Addr
}

// Plan returns the changes that bring every ServiceEntry among objects
// to its addresses, sorted by object, and what could not be done. It
// follows Istio's controller, given the state of the world rather than
// one event at a time:
//   - every address in a ServiceEntry's spec or status is in use
//     (populateControllerDatastructures);
//   - a host keeps the addresses its status gives it; a ServiceEntry
//     whose status address another one uses (in its spec, or in its
//     status and created earlier) gets new addresses for all of its hosts
//     (resolveConflict);
//   - a host in the spec without addresses gets the next free IPv4 and
//     IPv6 address, in order of creation, then of hosts; hosts no longer
//     in the spec lose theirs (statusPatchForAddresses);
//   - a ServiceEntry that no longer takes addresses (normalize.AutoAllocates)
//     has its status addresses cleared (clearStaleAddresses).
func (a *Allocator) Plan(objects []*istio.Object) ([]Change, []string) {
	type entry struct {
		o      *istio.Object
		spec   *networking.ServiceEntry
		status map[string][]netip.Addr // status.addresses by host
	}
	var entries []entry
	for _, o := range objects {
		if spec, ok := o.Spec.(*networking.ServiceEntry); ok {
			entries = append(entries, entry{o: o, spec: spec, status: normalize.StatusAddresses(o)})
		}
	}
	slices.SortFunc(entries, func(x, y entry) int { return istio.CreationOrder(x.o, y.o) })

	// In use: what specs say first (the user's addresses always win),
	// then statuses, oldest first.
	used := map[netip.Addr]istio.ID{}
	for _, e := range entries {
		for _, s := range e.spec.GetAddresses() {
			if ip, err := netip.ParseAddr(s); err == nil {
				if _, taken := used[ip.Unmap()]; !taken {
					used[ip.Unmap()] = e.o.ID()
				}
			}
		}
	}
	conflicted := map[istio.ID]bool{}
	for _, e := range entries {
		id := e.o.ID()
		for _, addrs := range e.status {
			for _, ip := range addrs {
				if owner, taken := used[ip]; taken && owner != id {
					conflicted[id] = true
					continue
				}
				used[ip] = id
			}
		}
	}

	var changes []Change
	var problems []string
	for _, e := range entries {
		id := e.o.ID()
		if !normalize.AutoAllocates(e.o) {
			if current := currentAddresses(e.o); len(current) > 0 {
				changes = append(changes, Change{ID: id, Current: current})
				a.free(e.status, id, used)
			}
			continue
		}
		forced := conflicted[id]
		var want []*networking.ServiceEntryAddress
		var allocated []netip.Addr
		for _, host := range normalize.AllocatableHosts(e.spec) {
			ips, ok := e.status[host]
			if !ok || forced {
				ips = nil
				for _, p := range []*prefix{a.v4, a.v6} {
					ip, err := p.next(used, id)
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s host %s: %v", e.o, host, err))
						continue
					}
					ips = append(ips, ip)
					allocated = append(allocated, ip)
				}
			}
			for _, ip := range ips {
				want = append(want, &networking.ServiceEntryAddress{Value: ip.String(), Host: host})
			}
		}
		if !forced && sameHosts(e.status, want) {
			continue // Istio patches only when the hosts with addresses change
		}
		changes = append(changes, Change{ID: id, Current: currentAddresses(e.o), Addresses: want, Allocated: allocated})
	}
	slices.SortFunc(changes, func(x, y Change) int {
		return cmp.Or(cmp.Compare(x.ID.Kind, y.ID.Kind), cmp.Compare(x.ID.Name, y.ID.Name))
	})
	return changes, problems
}

// free gives back the addresses of a ServiceEntry that no longer takes
// any, so the next allocation may reuse them (Istio's freeAddresses).
func (a *Allocator) free(addrs map[string][]netip.Addr, owner istio.ID, used map[netip.Addr]istio.ID) {
	for _, ips := range addrs {
		for _, ip := range ips {
			if used[ip] != owner {
				continue
			}
			delete(used, ip)
			a.Release([]netip.Addr{ip})
		}
	}
}

// Release gives back addresses a plan allocated that were not written, so
// that the next plan hands them out again (Istio's freeAddresses after a
// rejected patch): the write failed because the informer had not yet
// seen a status written before, and the next plan, made from the status
// as it is, must not skip the addresses this one took for nothing.
func (a *Allocator) Release(addrs []netip.Addr) {
	for _, ip := range addrs {
		for _, p := range []*prefix{a.v4, a.v6} {
			p.freed(ip)
		}
	}
}

func currentAddresses(o *istio.Object) []*networking.ServiceEntryAddress {
	st, _ := o.Status.(*networking.ServiceEntryStatus)
	return st.GetAddresses()
}

// sameHosts reports whether want gives addresses to exactly the hosts
// existing does.
func sameHosts(existing map[string][]netip.Addr, want []*networking.ServiceEntryAddress) bool {
	hosts := map[string]bool{}
	for _, a := range want {
		hosts[a.GetHost()] = true
	}
	if len(hosts) != len(existing) {
		return false
	}
	for h := range existing {
		if !hosts[h] {
			return false
		}
	}
	return true
}

// prefix is one range and where the next allocation starts.
type prefix struct {
	p      netip.Prefix
	cursor netip.Addr
}

func newPrefix(p netip.Prefix) *prefix { return &prefix{p: p, cursor: p.Addr().Next()} }

// next takes the first address not in use from the cursor on, wrapping
// once to the start of the range (the network address is never given),
// as Istio's allocateNext.
func (p *prefix) next(used map[netip.Addr]istio.ID, owner istio.ID) (netip.Addr, error) {
	first := p.p.Addr().Next()
	n := p.cursor
	wrapped := false
	if !n.IsValid() || !p.p.Contains(n) {
		n, wrapped = first, true
	}
	for {
		if _, taken := used[n]; !taken {
			break
		}
		n = n.Next()
		if !n.IsValid() || !p.p.Contains(n) {
			if wrapped {
				return netip.Addr{}, fmt.Errorf("range %s is exhausted", p.p)
			}
			n, wrapped = first, true
		}
	}
	used[n] = owner
	p.cursor = n.Next()
	return n, nil
}

// freed moves the cursor back to an address given back, if it is in the
// range and before the cursor (Istio's free).
func (p *prefix) freed(ip netip.Addr) {
	if p.p.Contains(ip) && (!p.cursor.IsValid() || !p.p.Contains(p.cursor) || ip.Less(p.cursor)) {
		p.cursor = ip
	}
}
