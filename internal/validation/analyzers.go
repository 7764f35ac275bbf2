package validation

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	telemetry "istio.io/api/telemetry/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// certificateVerification: a DestinationRule originating SIMPLE or
// MUTUAL TLS without caCertificates, for the whole host or a port, as
// Istio's CaCertificateAnalyzer (IST0128, IST0129): the proxy then checks
// the server's certificate against the system's roots only, or, with a
// credentialName, against what that Secret holds. As Istio's, a
// credentialName counts only on a rule with a workload selector.
func (a *analysis) certificateVerification() {
	for _, o := range a.in.Objects {
		dr, ok := o.Spec.(*networking.DestinationRule)
		if !ok {
			continue
		}
		unverified := func(tls *networking.ClientTLSSettings) bool {
			m := tls.GetMode()
			return (m == networking.ClientTLSSettings_SIMPLE || m == networking.ClientTLSSettings_MUTUAL) && tls.GetCaCertificates() == "" &&
				(tls.GetCredentialName() == "" || dr.GetWorkloadSelector() == nil)
		}
		if tls := dr.GetTrafficPolicy().GetTls(); unverified(tls) {
			a.report(CodeNoServerCertificateVerification, refOf(o), "spec.trafficPolicy.tls",
				"TLS mode %s without caCertificates: the server's certificate for host %s is not verified against a CA of this rule's", tls.GetMode(), dr.GetHost())
		}
		for i, p := range dr.GetTrafficPolicy().GetPortLevelSettings() {
			if tls := p.GetTls(); unverified(tls) {
				a.report(CodeNoServerCertificateVerification, refOf(o), fmt.Sprintf("spec.trafficPolicy.portLevelSettings[%d].tls", i),
					"TLS mode %s without caCertificates: the server's certificate for host %s at port %d is not verified against a CA of this rule's", tls.GetMode(), dr.GetHost(), p.GetPort().GetNumber())
			}
		}
	}
}

// serviceEntryAddresses: a ServiceEntry without addresses with a TCP (or
// unset) protocol port, as Istio's ProtocolAddressesAnalyzer (IST0134):
// TCP traffic is told apart by destination address, so without one the
// port's traffic to this host cannot be routed as its own. Not reported
// when the mesh's proxies capture DNS and allocate addresses
// (ISTIO_META_DNS_CAPTURE with ISTIO_META_DNS_AUTO_ALLOCATE or
// PILOT_ENABLE_IP_AUTOALLOCATE in defaultConfig.proxyMetadata).
func (a *analysis) serviceEntryAddresses() {
	md := a.in.Mesh.GetDefaultConfig().GetProxyMetadata()
	if md["ISTIO_META_DNS_CAPTURE"] == "true" && (md["ISTIO_META_DNS_AUTO_ALLOCATE"] == "true" || md["PILOT_ENABLE_IP_AUTOALLOCATE"] == "true") {
		return
	}
	for _, o := range a.in.Objects {
		se, ok := o.Spec.(*networking.ServiceEntry)
		if !ok || len(se.GetAddresses()) > 0 {
			continue
		}
		for i, p := range se.GetPorts() {
			if p.GetProtocol() == "" || strings.EqualFold(p.GetProtocol(), "TCP") {
				a.report(CodeServiceEntryAddressesRequired, refOf(o), fmt.Sprintf("spec.ports[%d]", i),
					"port %d serves TCP (or no protocol) and the ServiceEntry has no addresses: its traffic cannot be told apart from other TCP traffic to that port", p.GetNumber())
			}
		}
	}
}

// telemetrySelectors: more than one Telemetry of a namespace without a
// workload selector, as Istio's DefaultSelectorAnalyzer (IST0160): which
// applies is undefined. A Telemetry with targetRefs applies to what it
// targets, not to the namespace, and is not counted (Istio counts it).
func (a *analysis) telemetrySelectors() {
	byNamespace := map[string][]*istio.Object{}
	for _, o := range a.in.Objects {
		t, ok := o.Spec.(*telemetry.Telemetry)
		if !ok || t.GetSelector() != nil || len(t.GetTargetRefs()) > 0 || t.GetTargetRef() != nil {
			continue
		}
		byNamespace[o.Meta.Namespace] = append(byNamespace[o.Meta.Namespace], o)
	}
	for ns, ts := range byNamespace {
		if len(ts) < 2 {
			continue
		}
		names := make([]string, len(ts))
		for i, t := range ts {
			names[i] = t.Meta.Name
		}
		slices.SortFunc(names, cmp.Compare)
		for _, t := range ts {
			a.report(CodeMultipleTelemetriesWithoutSelector, refOf(t), "",
				"Telemetries %s of namespace %s have no workload selector: which one applies is undefined", strings.Join(names, ", "), ns)
		}
	}
}
