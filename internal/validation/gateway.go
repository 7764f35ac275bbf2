package validation

import (
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

func (v *validator) gateway() {
	gw := v.obj.Spec.(*networking.Gateway)
	if len(gw.GetServers()) == 0 {
		v.r.errorf("spec.servers", "at least one server is required")
	}
	if gw.GetSelector() != nil {
		v.labels("spec.selector", gw.GetSelector())
	}
	names := map[string]bool{}
	protoByPort := map[uint32]string{}
	for i, s := range gw.GetServers() {
		p := at("spec.servers", i)
		if s.GetName() != "" {
			if names[s.GetName()] {
				v.r.errorf(field(p, "name"), "server name %q is used twice", s.GetName())
			}
			names[s.GetName()] = true
		}
		proto := ""
		if s.GetPort() == nil {
			v.r.errorf(field(p, "port"), "port is required")
		} else {
			pp := field(p, "port")
			v.port(field(pp, "number"), s.GetPort().GetNumber())
			v.protocol(field(pp, "protocol"), s.GetPort().GetProtocol())
			if s.GetPort().GetName() == "" {
				v.r.errorf(field(pp, "name"), "port name is required")
			}
			proto = strings.ToUpper(s.GetPort().GetProtocol())
			n := s.GetPort().GetNumber()
			if prev, ok := protoByPort[n]; ok && prev != proto {
				v.r.errorf(field(pp, "protocol"), "port %d is already served as %s; one port cannot serve %s too", n, prev, proto)
			}
			protoByPort[n] = proto
		}
		if len(s.GetHosts()) == 0 {
			v.r.errorf(field(p, "hosts"), "at least one host is required")
		}
		for j, h := range s.GetHosts() {
			hp := at(field(p, "hosts"), j)
			if strings.Contains(h, "/") {
				v.namespacedHost(hp, h)
			} else {
				v.host(hp, h, true)
			}
		}
		v.serverTLS(field(p, "tls"), s.GetTls(), proto)
	}
}

func (v *validator) serverTLS(path string, t *networking.ServerTLSSettings, proto string) {
	needsTLS := proto == "HTTPS" || proto == "TLS"
	if t == nil {
		if needsTLS {
			v.r.errorf(path, "a %s server needs TLS settings", proto)
		}
		return
	}
	if !needsTLS {
		if proto == "HTTP" && t.GetHttpsRedirect() && t.GetMode() == networking.ServerTLSSettings_PASSTHROUGH && !hasCerts(t) {
			return // httpsRedirect only: the usual way to redirect port 80 to 443
		}
		if proto != "" {
			v.r.errorf(path, "TLS settings on a %s server are only allowed for httpsRedirect", proto)
		}
		return
	}
	switch t.GetMode() {
	case networking.ServerTLSSettings_SIMPLE, networking.ServerTLSSettings_OPTIONAL_MUTUAL:
		if !hasCerts(t) {
			v.r.errorf(path, "%s needs credentialName (or credentialNames), or serverCertificate and privateKey", t.GetMode())
		}
	case networking.ServerTLSSettings_MUTUAL:
		if !hasCerts(t) {
			v.r.errorf(path, "MUTUAL needs credentialName (or credentialNames), or serverCertificate and privateKey")
		}
		if t.GetCredentialName() == "" && len(t.GetCredentialNames()) == 0 && t.GetCaCertificates() == "" {
			v.r.errorf(field(path, "caCertificates"), "MUTUAL needs caCertificates (or a credentialName holding the CA)")
		}
	case networking.ServerTLSSettings_PASSTHROUGH, networking.ServerTLSSettings_AUTO_PASSTHROUGH:
		if proto != "TLS" {
			v.r.errorf(field(path, "mode"), "%s only applies to protocol TLS, not %s", t.GetMode(), proto)
		}
		if hasCerts(t) {
			v.r.warnf(path, "certificates are ignored with %s: the backend terminates TLS", t.GetMode())
		}
	case networking.ServerTLSSettings_ISTIO_MUTUAL:
		if hasCerts(t) {
			v.r.errorf(path, "ISTIO_MUTUAL uses the mesh's certificates: serverCertificate, privateKey and credentialName must not be set")
		}
	default:
	}
	if t.GetCredentialName() != "" && len(t.GetCredentialNames()) > 0 {
		v.r.errorf(field(path, "credentialNames"), "credentialName and credentialNames cannot both be set")
	}
	if t.GetMinProtocolVersion() != networking.ServerTLSSettings_TLS_AUTO && t.GetMaxProtocolVersion() != networking.ServerTLSSettings_TLS_AUTO &&
		t.GetMinProtocolVersion() > t.GetMaxProtocolVersion() {
		v.r.errorf(field(path, "minProtocolVersion"), "%s is above maxProtocolVersion %s", t.GetMinProtocolVersion(), t.GetMaxProtocolVersion())
	}
}

func hasCerts(t *networking.ServerTLSSettings) bool {
	return t.GetCredentialName() != "" || len(t.GetCredentialNames()) > 0 || len(t.GetTlsCertificates()) > 0 ||
		(t.GetServerCertificate() != "" && t.GetPrivateKey() != "")
}
