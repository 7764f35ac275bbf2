package normalize

import (
	"net/netip"
	"slices"
	"strings"

	"istio.io/api/label"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// AutoAllocates reports whether a ServiceEntry takes allocated addresses
// (in its status), as Istio's shouldV2AutoAllocateIPFromPieces: not with
// resolution NONE (the data plane could not honour them), not when the
// label networking.istio.io/enable-autoallocate-ip is "false", not when
// the ServiceEntry has addresses of its own.
func AutoAllocates(o *istio.Object) bool {
	spec, ok := o.Spec.(*networking.ServiceEntry)
	if !ok || spec.GetResolution() == networking.ServiceEntry_NONE || len(spec.GetAddresses()) > 0 {
		return false
	}
	v, set := o.Meta.Labels[label.NetworkingEnableAutoallocateIp.Name]
	return !set || !strings.EqualFold(v, "false")
}

// AllocatableHosts are the hosts of a ServiceEntry that get an address, in
// the ServiceEntry's order without repeats: not wildcards, unless the
// resolution is DYNAMIC_DNS (Istio's ipallocate keepHost).
func AllocatableHosts(spec *networking.ServiceEntry) []string {
	var out []string
	for _, h := range spec.GetHosts() {
		if (strings.HasPrefix(h, "*") && spec.GetResolution() != networking.ServiceEntry_DYNAMIC_DNS) || slices.Contains(out, h) {
			continue
		}
		out = append(out, h)
	}
	return out
}

// AllocatedAddresses returns the addresses a ServiceEntry's status holds
// per host (Istio's GetHostAddressesFromConfig), nil when it takes none
// (AutoAllocates).
func AllocatedAddresses(o *istio.Object) map[string][]netip.Addr {
	if !AutoAllocates(o) {
		return nil
	}
	return StatusAddresses(o)
}

// StatusAddresses returns the addresses in a ServiceEntry's status per
// host, whether or not it takes them: those that parse as IP addresses,
// canonical, in status order (a value that does not was not written by an
// allocator: unusable). Nil when there are none.
func StatusAddresses(o *istio.Object) map[string][]netip.Addr {
	st, _ := o.Status.(*networking.ServiceEntryStatus)
	var out map[string][]netip.Addr
	for _, a := range st.GetAddresses() {
		ip, err := netip.ParseAddr(a.GetValue())
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string][]netip.Addr{}
		}
		out[a.GetHost()] = append(out[a.GetHost()], ip.Unmap())
	}
	return out
}
