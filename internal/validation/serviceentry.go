package validation

import (
	"net/netip"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

func (v *validator) serviceEntry() {
	se := v.obj.Spec.(*networking.ServiceEntry)
	if len(se.GetHosts()) == 0 {
		v.r.errorf("spec.hosts", "at least one host is required")
	}
	wildcard := false
	for i, h := range se.GetHosts() {
		p := at("spec.hosts", i)
		if h == "*" {
			v.r.errorf(p, "wildcard host * is not allowed in a ServiceEntry")
			continue
		}
		v.host(p, h, false)
		wildcard = wildcard || strings.HasPrefix(h, "*.")
	}
	for i, a := range se.GetAddresses() {
		v.addressOrCIDR(at("spec.addresses", i), a)
	}
	portNames := map[string]bool{}
	portNumbers := map[uint32]bool{}
	for i, port := range se.GetPorts() {
		p := at("spec.ports", i)
		v.port(field(p, "number"), port.GetNumber())
		v.sniffedProtocol(field(p, "protocol"), port.GetProtocol())
		v.portName(field(p, "name"), port.GetName())
		if port.GetTargetPort() != 0 {
			v.port(field(p, "targetPort"), port.GetTargetPort())
		}
		if portNames[port.GetName()] {
			v.r.errorf(field(p, "name"), "port name %q is used twice", port.GetName())
		}
		if portNumbers[port.GetNumber()] {
			v.r.errorf(field(p, "number"), "port %d is listed twice", port.GetNumber())
		}
		portNames[port.GetName()] = true
		portNumbers[port.GetNumber()] = true
	}
	if len(se.GetEndpoints()) > 0 && se.GetWorkloadSelector() != nil {
		v.r.errorf("spec.workloadSelector", "workloadSelector and endpoints cannot both be set")
	}
	if ws := se.GetWorkloadSelector(); ws != nil {
		v.optionalSelector("spec.workloadSelector.labels", ws.GetLabels())
	}
	switch se.GetResolution() {
	case networking.ServiceEntry_NONE:
		if len(se.GetEndpoints()) > 0 {
			v.r.errorf("spec.endpoints", "endpoints are not allowed with resolution NONE (traffic goes to the original destination)")
		}
	case networking.ServiceEntry_STATIC:
		if len(se.GetEndpoints()) == 0 && se.GetWorkloadSelector() == nil {
			v.r.errorf("spec.endpoints", "resolution STATIC needs endpoints or a workloadSelector")
		}
		if wildcard {
			v.r.errorf("spec.hosts", "wildcard hosts need resolution NONE or DNS with endpoints")
		}
	case networking.ServiceEntry_DNS, networking.ServiceEntry_DNS_ROUND_ROBIN:
		if wildcard && len(se.GetEndpoints()) == 0 {
			v.r.errorf("spec.hosts", "a wildcard host cannot be resolved by DNS: add endpoints or use resolution NONE")
		}
	case networking.ServiceEntry_DYNAMIC_DNS:
		v.dynamicDNS(se)
	default:
	}
	for i, ep := range se.GetEndpoints() {
		p := at("spec.endpoints", i)
		v.workloadEntrySpec(p, ep, se.GetResolution() == networking.ServiceEntry_STATIC)
		for name := range ep.GetPorts() {
			if !portNames[name] {
				v.r.errorf(key(field(p, "ports"), name), "port %q is not a port of this ServiceEntry", name)
			}
		}
	}
	v.exportTo("spec.exportTo", se.GetExportTo())
	for i, san := range se.GetSubjectAltNames() {
		if san == "" {
			v.r.errorf(at("spec.subjectAltNames", i), "must not be empty")
		}
	}
}

func (v *validator) workloadEntry() {
	we := v.obj.Spec.(*networking.WorkloadEntry)
	v.workloadEntrySpec("spec", we, false)
}

// workloadEntrySpec checks a WorkloadEntry or a ServiceEntry endpoint.
// static requires the address to be an IP (or a Unix socket).
func (v *validator) workloadEntrySpec(path string, we *networking.WorkloadEntry, static bool) {
	addr := we.GetAddress()
	ap := field(path, "address")
	switch {
	case addr == "" && we.GetNetwork() == "":
		v.r.errorf(ap, "address is required (it may be empty only when network names a remote network)")
	case strings.HasPrefix(addr, "unix://"):
		v.unixAddress(ap, strings.TrimPrefix(addr, "unix://"))
		if len(we.GetPorts()) > 0 {
			v.r.errorf(field(path, "ports"), "a Unix socket endpoint has no ports")
		}
	case addr != "":
		if _, err := netip.ParseAddr(addr); err != nil {
			if static {
				v.r.errorf(ap, "%q is not an IP address (resolution STATIC needs IPs)", addr)
			} else {
				v.host(ap, addr, false)
			}
		}
	}
	for name, port := range we.GetPorts() {
		pp := key(field(path, "ports"), name)
		v.portName(pp, name)
		v.port(pp, port)
	}
	v.labels(field(path, "labels"), we.GetLabels())
	if sa := we.GetServiceAccount(); sa != "" && dns1123Subdomain(sa) != "" {
		v.r.errorf(field(path, "serviceAccount"), "%q is not a valid service account name", sa)
	}
	if loc := we.GetLocality(); loc != "" {
		parts := strings.Split(loc, "/")
		if len(parts) > 3 {
			v.r.errorf(field(path, "locality"), "%q must be region/zone/subzone (at most three parts)", loc)
		}
		for _, part := range parts {
			if part == "" {
				v.r.errorf(field(path, "locality"), "%q has an empty part", loc)
				break
			}
		}
	}
	if n := we.GetNetwork(); n != "" && strings.ContainsAny(n, " /") {
		v.r.errorf(field(path, "network"), "%q must not contain spaces or '/'", n)
	}
}

// dynamicDNS checks a DYNAMIC_DNS ServiceEntry as Istio's
// ValidateServiceEntry does (wildcard hosts only, no addresses or
// endpoints, HTTP, HTTP2, gRPC or TLS ports, an explicit location).
func (v *validator) dynamicDNS(se *networking.ServiceEntry) {
	if len(se.GetHosts()) == 0 {
		v.r.errorf("spec.hosts", "at least one wildcard host must be provided for resolution type DYNAMIC_DNS")
	}
	for i, h := range se.GetHosts() {
		if !strings.HasPrefix(h, "*") {
			v.r.errorf(at("spec.hosts", i), "host must be wildcarded for resolution mode DYNAMIC_DNS")
		}
	}
	if len(se.GetAddresses()) > 0 {
		v.r.errorf("spec.addresses", "addresses cannot be set for resolution type DYNAMIC_DNS. HTTP route domains will only be generated from the hosts field values")
	}
	if len(se.GetEndpoints()) > 0 {
		v.r.errorf("spec.endpoints", "endpoints cannot be set for resolution type DYNAMIC_DNS. Destination IP address determined from hosts field values")
	}
	for i, p := range se.GetPorts() {
		switch strings.ToUpper(p.GetProtocol()) {
		case "HTTP", "HTTP2", "GRPC", "TLS":
		default:
			v.r.errorf(field(at("spec.ports", i), "protocol"), "only HTTP, TLS, GRPC, and HTTP2 protocols are supported for resolution type DYNAMIC_DNS")
		}
	}
	if se.GetLocation() != networking.ServiceEntry_MESH_EXTERNAL && se.GetLocation() != networking.ServiceEntry_MESH_INTERNAL {
		v.r.errorf("spec.location", "location must be MESH_EXTERNAL or MESH_INTERNAL for resolution type DYNAMIC_DNS")
	}
}
