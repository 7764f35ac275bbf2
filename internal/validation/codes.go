package validation

import (
	"fmt"
	"strings"
)

// Code names one kind of message, the same in galley's logs, the webhook's
// warnings and `flotilla analyze`. Codes are Flotilla's own (FLT, then four
// digits); Codes lists them all, and docs/analyze.md is that table.
type Code string

// Severity orders messages: a threshold of SeverityWarning includes SeverityError.
type Severity int

// Severities, least severe first.
const (
	SeverityInfo Severity = iota + 1
	SeverityWarning
	SeverityError
)

func (s Severity) String() string {
	switch s {
	case SeverityInfo:
		return "Info"
	case SeverityWarning:
		return "Warning"
	case SeverityError:
		return "Error"
	}
	return fmt.Sprintf("Severity(%d)", int(s))
}

// ParseSeverity reads "Info", "Warning" or "Error" (any case).
func ParseSeverity(s string) (Severity, error) {
	for _, v := range []Severity{SeverityInfo, SeverityWarning, SeverityError} {
		if strings.EqualFold(s, v.String()) {
			return v, nil
		}
	}
	return 0, fmt.Errorf("severity %q: want Info, Warning or Error", s)
}

// The codes. Validation of one object yields the FLT01xx codes (FLT0101 is
// the only one galley rejects an object for: the webhook admits the others
// and returns them as warnings); Analyze adds the cross-object FLT02xx;
// the Gateway API's status, as galley would write it, gives the FLT03xx.
const (
	CodeAnalyzerSkipped Code = "FLT0001"

	CodeUnreadable       Code = "FLT0100"
	CodeInvalid          Code = "FLT0101"
	CodeSchemaWarning    Code = "FLT0102"
	CodeDeprecated       Code = "FLT0103"
	CodeSubsetNotFound   Code = "FLT0104"
	CodeEnvoyFilter      Code = "FLT0105"
	CodeNotImplemented   Code = "FLT0106"
	CodeUnreachableRule  Code = "FLT0107"
	CodeIneffectiveMatch Code = "FLT0108"

	CodeEnvoyFilterRelativeOperation Code = "FLT0109"
	CodeEnvoyFilterReplaceIgnored    Code = "FLT0110"
	CodeEnvoyFilterAddIgnored        Code = "FLT0111"
	CodeEnvoyFilterRemoveIgnored     Code = "FLT0112"

	CodeHostNotFound             Code = "FLT0201"
	CodeGatewayNotFound          Code = "FLT0202"
	CodeSubsetSelectsNoWorkload  Code = "FLT0203"
	CodeConflictingDestRules     Code = "FLT0204"
	CodeSidecarEgressNothing     Code = "FLT0205"
	CodeMTLSConflict             Code = "FLT0206"
	CodeGatewaySelectsNoWorkload Code = "FLT0207"
	CodeGatewayPortNotOnService  Code = "FLT0208"
	CodePortNameWithoutProtocol  Code = "FLT0209"
	CodeSelectorMatchesNothing   Code = "FLT0210"
	CodeUnknownDestRuleHost      Code = "FLT0211"

	CodeNoServerCertificateVerification    Code = "FLT0212"
	CodeServiceEntryAddressesRequired      Code = "FLT0213"
	CodeMultipleTelemetriesWithoutSelector Code = "FLT0214"
	CodeConflictingMeshHosts               Code = "FLT0215"
	CodeConflictingGateways                Code = "FLT0216"
	CodeHostNotFoundInGateway              Code = "FLT0217"
	CodeClaimRouteWithoutAuthn             Code = "FLT0218"
	CodeConflictingSidecarSelectors        Code = "FLT0219"
	CodeMultipleSidecarsWithoutSelector    Code = "FLT0220"
	CodeConflictingTelemetrySelectors      Code = "FLT0221"
	CodeTelemetryWithoutProvider           Code = "FLT0222"
	CodeConflictingServiceEntryProtocol    Code = "FLT0223"
	CodeNamespaceMultipleInjectionLabels   Code = "FLT0224"
	CodeNamespaceNotInjected               Code = "FLT0225"
	CodeExternalNamePortName               Code = "FLT0226"
	CodeUnknownAnnotation                  Code = "FLT0227"
	CodeMisplacedAnnotation                Code = "FLT0228"
	CodeDeprecatedAnnotation               Code = "FLT0229"
	CodeInvalidAnnotation                  Code = "FLT0230"
	CodeInvalidApplicationUID              Code = "FLT0231"
	CodeImageAutoWithoutInjection          Code = "FLT0232"
	CodeImageAutoPodWithoutInjection       Code = "FLT0233"
	CodeWorkloadPortProtocols              Code = "FLT0234"
	CodeWorkloadConflictingPorts           Code = "FLT0235"
	CodeGatewayDuplicateCertificate        Code = "FLT0236"
	CodeIngressRouteRulesNotAffected       Code = "FLT0237"

	CodeGatewayNotAccepted   Code = "FLT0301"
	CodeRouteNotAttached     Code = "FLT0302"
	CodeRefNotPermitted      Code = "FLT0303"
	CodeListenerConflict     Code = "FLT0304"
	CodeGatewayAPIUnresolved Code = "FLT0305"
	CodePolicyNotAccepted    Code = "FLT0306"
)

// CodeInfo describes a code: its name, severity and what it means, with the
// Istio analyzer message it corresponds to where there is one.
type CodeInfo struct {
	Code     Code
	Name     string
	Severity Severity
	Istio    string
	Meaning  string
}

// Codes is every code, in order.
func Codes() []CodeInfo {
	return []CodeInfo{
		{
			CodeAnalyzerSkipped, "AnalyzerSkipped", SeverityInfo, "",
			"An analyzer needs what the input does not hold (Services, workloads): it was not run. Add their YAML to the input.",
		},
		{
			CodeUnreadable, "UnreadableDocument", SeverityError, "IST0106",
			"A document is not valid YAML, not a Kubernetes object, or not a kind/version Flotilla serves.",
		},
		{
			CodeInvalid, "InvalidConfig", SeverityError, "IST0106",
			"The object breaks a rule of its schema or of Istio's validation: galley (webhook and file mode) rejects it.",
		},
		{
			CodeSchemaWarning, "ConfigWarning", SeverityWarning, "IST0133",
			"Accepted, but probably not what was meant (a setting that has no effect, a selector that selects everything).",
		},
		{
			CodeDeprecated, "Deprecated", SeverityWarning, "IST0002",
			"A deprecated field: it still works, its replacement is named.",
		},
		{
			CodeSubsetNotFound, "ReferencedSubsetNotFound", SeverityError, "IST0101",
			"A VirtualService routes to a subset no DestinationRule for that host defines: those requests fail (503).",
		},
		{
			CodeEnvoyFilter, "EnvoyFilterUsage", SeverityWarning, "IST0133",
			"Every EnvoyFilter: it patches Envoy's configuration directly, which may change with any release (a patch that breaks a resource is reported and not sent).",
		},
		{
			CodeNotImplemented, "NotImplementedByFlotilla", SeverityWarning, "",
			"Istio accepts it and acts on it; Flotilla does not (a setting it does not implement): the message says what happens instead.",
		},
		{
			CodeUnreachableRule, "VirtualServiceUnreachableRule", SeverityWarning, "IST0130",
			"A VirtualService rule no request reaches: it comes after a rule without matches, or every match of it is an earlier rule's.",
		},
		{
			CodeIneffectiveMatch, "VirtualServiceIneffectiveMatch", SeverityInfo, "IST0131",
			"A VirtualService match an earlier rule takes first: the same match (its name aside), or a URI prefix an earlier rule's prefix covers with the same other conditions.",
		},
		{
			CodeEnvoyFilterRelativeOperation, "EnvoyFilterUsesRelativeOperation", SeverityWarning, "IST0151, IST0155",
			"An EnvoyFilter without a priority patches relative to what other filters may have changed (INSERT_BEFORE, INSERT_AFTER, REPLACE, REMOVE): whether it applies depends on the order filters are applied in, and with a proxyVersion match it may stop applying during an upgrade. Use INSERT_FIRST or ADD, or set the priority.",
		},
		{
			CodeEnvoyFilterReplaceIgnored, "EnvoyFilterUsesReplaceOperationIncorrectly", SeverityError, "IST0152",
			"An EnvoyFilter patch REPLACEs something other than an HTTP_FILTER, NETWORK_FILTER or VIRTUAL_HOST: the patch is ignored.",
		},
		{
			CodeEnvoyFilterAddIgnored, "EnvoyFilterUsesAddOperationIncorrectly", SeverityError, "IST0153",
			"An EnvoyFilter patch ADDs with applyTo ROUTE_CONFIGURATION or HTTP_ROUTE: the patch is ignored.",
		},
		{
			CodeEnvoyFilterRemoveIgnored, "EnvoyFilterUsesRemoveOperationIncorrectly", SeverityError, "IST0154",
			"An EnvoyFilter patch REMOVEs with applyTo ROUTE_CONFIGURATION or HTTP_ROUTE: the patch is ignored.",
		},
		{
			CodeHostNotFound, "ReferencedHostNotFound", SeverityError, "IST0101",
			"A VirtualService destination or mirror names a host that no Service or ServiceEntry visible from its namespace has.",
		},
		{
			CodeGatewayNotFound, "ReferencedGatewayNotFound", SeverityError, "IST0101",
			"A VirtualService is bound to a Gateway that does not exist: it applies to no gateway.",
		},
		{
			CodeSubsetSelectsNoWorkload, "DestinationRuleSubsetNotSelectWorkloads", SeverityError, "IST0173",
			"A DestinationRule subset's labels (with the service's selector) select no workload: traffic to it fails.",
		},
		{
			CodeConflictingDestRules, "ConflictingDestinationRules", SeverityWarning, "",
			"Two DestinationRules without workload selectors apply to one host from one namespace: they are merged as Istio merges them (the younger's new subsets added, its traffic policy used only if the older has none).",
		},
		{
			CodeSidecarEgressNothing, "SidecarEgressImportsNothing", SeverityWarning, "",
			"A Sidecar egress host (namespace/host) matches no service: it imports nothing.",
		},
		{
			CodeMTLSConflict, "MTLSConflict", SeverityError, "IST0113",
			"A DestinationRule disables TLS (or uses TLS that is not ISTIO_MUTUAL) toward workloads a PeerAuthentication makes STRICT: those connections are refused.",
		},
		{
			CodeGatewaySelectsNoWorkload, "GatewaySelectsNoWorkload", SeverityError, "IST0101",
			"A Gateway's selector matches no workload: no proxy serves it.",
		},
		{
			CodeGatewayPortNotOnService, "GatewayPortNotDefinedOnService", SeverityWarning, "IST0162",
			"A Gateway server port is on no port (or target port) of the Services in front of the gateway workloads: nothing reaches it.",
		},
		{
			CodePortNameWithoutProtocol, "PortNameIsNotUnderNamingConvention", SeverityInfo, "IST0118",
			"A Service port has neither appProtocol nor a protocol prefix in its name (http-, grpc-, tcp-, ...): it is treated as TCP (or sniffed).",
		},
		{
			CodeSelectorMatchesNothing, "NoMatchingWorkloadsFound", SeverityWarning, "IST0127",
			"A policy or Sidecar selector matches no workload in its namespace: it has no effect.",
		},
		{
			CodeUnknownDestRuleHost, "UnknownDestinationRuleHost", SeverityWarning, "IST0174",
			"A DestinationRule's host is on no Service or ServiceEntry visible from its namespace.",
		},
		{
			CodeNoServerCertificateVerification, "NoServerCertificateVerification", SeverityWarning, "IST0128, IST0129",
			"A DestinationRule originates SIMPLE or MUTUAL TLS (for the host or a port) without caCertificates: the server's certificate is checked against the system's roots only (a credentialName counts on a rule with a workload selector).",
		},
		{
			CodeServiceEntryAddressesRequired, "ServiceEntryAddressesRequired", SeverityWarning, "IST0134",
			"A ServiceEntry without addresses has a TCP (or unset) protocol port: TCP traffic is told apart by destination address, so this host's cannot be (unless addresses were allocated to it, in its status.addresses, or the mesh's proxies capture DNS and allocate addresses).",
		},
		{
			CodeMultipleTelemetriesWithoutSelector, "MultipleTelemetriesWithoutWorkloadSelectors", SeverityError, "IST0160",
			"More than one Telemetry of a namespace has neither a workload selector nor targetRefs: which one applies is undefined.",
		},
		{
			CodeConflictingMeshHosts, "ConflictingMeshGatewayVirtualServiceHosts", SeverityError, "IST0109",
			"Two VirtualServices of the mesh gateway (the sidecars) define the same host for the same namespaces: which one a sidecar uses is undefined. Merge them into one.",
		},
		{
			CodeConflictingGateways, "ConflictingGateways", SeverityError, "IST0145",
			"Two Gateways selecting the same workloads list the same host on one port (with the same bind): the gateway serves one of them.",
		},
		{
			CodeHostNotFoundInGateway, "VirtualServiceHostNotFoundInGateway", SeverityWarning, "IST0132",
			"A VirtualService is bound to a Gateway none of whose server hosts (those of its namespace, or any) matches a host of the VirtualService: that gateway does not serve it.",
		},
		{
			CodeClaimRouteWithoutAuthn, "JwtClaimBasedRoutingWithoutRequestAuthN", SeverityError, "IST0149",
			"A VirtualService routes on JWT claims (@request.auth.claims) through a Gateway whose workloads no RequestAuthentication applies to: no token is verified there, so those routes never match.",
		},
		{
			CodeConflictingSidecarSelectors, "ConflictingSidecarWorkloadSelectors", SeverityError, "IST0110",
			"Sidecars of one namespace select the same workload: which one applies to it is undefined.",
		},
		{
			CodeMultipleSidecarsWithoutSelector, "MultipleSidecarsWithoutWorkloadSelectors", SeverityError, "IST0111",
			"A namespace has more than one Sidecar without a workload selector: which one applies is undefined.",
		},
		{
			CodeConflictingTelemetrySelectors, "ConflictingTelemetryWorkloadSelectors", SeverityError, "IST0159",
			"Telemetries of one namespace select the same workload: which one applies to it is undefined.",
		},
		{
			CodeTelemetryWithoutProvider, "InvalidTelemetryProvider", SeverityWarning, "IST0157",
			"A Telemetry's access logging names no provider and the mesh has no default access logging provider: it changes only what a Telemetry above it (the root namespace's, its namespace's) names, and is ignored where none does.",
		},
		{
			CodeConflictingServiceEntryProtocol, "ConflictingServiceEntryProtocol", SeverityWarning, "IST0177",
			"ServiceEntries define one host and port with different protocols for the same namespaces: which protocol the proxies use for it is undefined.",
		},
		{
			CodeNamespaceMultipleInjectionLabels, "NamespaceMultipleInjectionLabels", SeverityWarning, "IST0123",
			"A namespace is labelled both istio-injection and istio.io/rev: istio-injection wins (the default revision, or none), and the revision label is not used.",
		},
		{
			CodeNamespaceNotInjected, "NamespaceNotInjected", SeverityInfo, "IST0102",
			"A namespace holding workloads has neither istio-injection nor istio.io/rev: its pods get no sidecar.",
		},
		{
			CodeExternalNamePortName, "ExternalNameServiceTypeInvalidPortName", SeverityWarning, "IST0150",
			"A port of an ExternalName Service is named tcp, or has neither appProtocol nor a protocol prefix: the proxies may not forward TCP traffic to it, or unmatched traffic on it, correctly.",
		},
		{
			CodeUnknownAnnotation, "UnknownAnnotation", SeverityWarning, "IST0108",
			"A Namespace, Service, Pod (or Pod template) or workload controller carries an annotation in Istio's namespace (*istio.io/) that Istio does not define: a typo, most often, and it does nothing.",
		},
		{
			CodeMisplacedAnnotation, "MisplacedAnnotation", SeverityWarning, "IST0107",
			"An Istio annotation is on a kind of object it is not read on (sidecar.istio.io/inject on a Deployment rather than its Pod template, say): it does nothing there.",
		},
		{
			CodeDeprecatedAnnotation, "DeprecatedAnnotation", SeverityInfo, "IST0135",
			"An Istio annotation Istio has deprecated: it may stop working in a later release (the sidecar.istio.io/inject annotation is not reported beside the label of that name).",
		},
		{
			CodeInvalidAnnotation, "InvalidAnnotation", SeverityWarning, "IST0125",
			"A Pod (or Pod template) carries an injection annotation whose value the injector refuses (a malformed proxyCPU, an interception mode other than REDIRECT, a port out of range): its pods are not admitted while injection applies to them.",
		},
		{
			CodeInvalidApplicationUID, "InvalidApplicationUID", SeverityWarning, "IST0144",
			"An application container (or the whole Pod) runs as user ID 1337, the sidecar proxy's: its traffic is not captured.",
		},
		{
			CodeImageAutoWithoutInjection, "ImageAutoWithoutInjectionWarning", SeverityWarning, "IST0146",
			"A workload controller's Pod template has an istio-proxy container with `image: auto` (to be filled in by injection) but no injector selects its pods in their namespace: the container does not start.",
		},
		{
			CodeImageAutoPodWithoutInjection, "ImageAutoWithoutInjectionError", SeverityError, "IST0147",
			"A Pod has an istio-proxy container with `image: auto` but no injector selects it in its namespace: the container does not start.",
		},
		{
			CodeWorkloadPortProtocols, "DeploymentAssociatedToMultipleServices", SeverityWarning, "IST0116",
			"An injected workload's pods are selected by Services that use one port number with different protocols (TCP and UDP): the sidecar cannot serve both.",
		},
		{
			CodeWorkloadConflictingPorts, "DeploymentConflictingPorts", SeverityWarning, "IST0137",
			"An injected workload's pods are selected by Services that send different ports to one targetPort: two Services selecting a workload with the same targetPort must use the same port.",
		},
		{
			CodeGatewayDuplicateCertificate, "GatewayDuplicateCertificate", SeverityWarning, "IST0138",
			"Gateways on the same workloads serve one certificate (the same credentialName, or the same certificate and key files): a client that reuses an HTTP/2 connection for the hosts of both may get 404s.",
		},
		{
			CodeIngressRouteRulesNotAffected, "IngressRouteRulesNotAffected", SeverityWarning, "IST0140",
			"A gateway's VirtualService routes to a host without a subset while another VirtualService routes that host by subset: those subset rules do not apply to the gateway's requests.",
		},
		{
			CodeGatewayNotAccepted, "GatewayAPIGatewayNotAccepted", SeverityError, "",
			"A Gateway of a class Flotilla serves, or a ListenerSet of one, is not Accepted (its status would say why: an unsupported address, invalid parameters, no valid listener, a parent whose allowedListeners refuses the set): it serves nothing.",
		},
		{
			CodeRouteNotAttached, "GatewayAPIRouteNotAttached", SeverityWarning, "",
			"A route's parentRef is not Accepted (NotAllowedByListeners, NoMatchingListenerHostname, NoMatchingParent, ...): the route serves no traffic through that parent.",
		},
		{
			CodeRefNotPermitted, "GatewayAPIRefNotPermitted", SeverityError, "",
			"A route's backendRef or a listener's certificateRef names an object of another namespace that no ReferenceGrant admits: it is not used.",
		},
		{
			CodeListenerConflict, "GatewayAPIListenerConflicted", SeverityError, "",
			"Two listeners of a Gateway, or of a Gateway and its ListenerSets, conflict (the same port with another protocol, or the same hostname): the later ones (a set's after the Gateway's, a newer set's after an older one's) are not served.",
		},
		{
			CodeGatewayAPIUnresolved, "GatewayAPIUnresolvedRef", SeverityError, "",
			"A route's backendRef names a Service that is not in the input (BackendNotFound) or a kind that cannot be a backend, or a listener's certificateRef a Secret not in the input or invalid: those requests fail (500) or the listener is not served.",
		},
		{
			CodePolicyNotAccepted, "GatewayAPIPolicyNotAccepted", SeverityError, "",
			"A BackendTLSPolicy is not Accepted for one of its targets: an older policy targets the same backend and section (Conflicted), the target is not in the input (TargetNotFound), or its CA certificate ref is of a kind other than ConfigMap or names a ConfigMap not in the input or without a ca.crt (NoValidCACertificate): TLS to that backend is not originated as the policy says, or its traffic is refused.",
		},
	}
}

// Info returns a code's description; ok is false for a code not in Codes.
func (c Code) Info() (CodeInfo, bool) {
	for _, i := range Codes() {
		if i.Code == c {
			return i, true
		}
	}
	return CodeInfo{}, false
}

// Severity is the code's severity (Error for an unknown code).
func (c Code) Severity() Severity {
	if i, ok := c.Info(); ok {
		return i.Severity
	}
	return SeverityError
}
