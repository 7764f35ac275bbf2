package gatewayapi

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// converter holds one conversion's state.
type converter struct {
	in          Input
	controllers map[gw.GatewayController]bool
	// classes are the served GatewayClasses, by name.
	classes map[string]gw.GatewayController
	grants  grants
	kinds   map[string]istio.Kind

	classStatus map[string]*gw.GatewayClassStatus
	gwStatus    map[Ref]*gw.GatewayStatus
	routeStatus map[Ref]*gw.RouteStatus
	// policyStatus is the BackendTLSPolicies'.
	policyStatus map[Ref]*gw.PolicyStatus
	// setStatus is the ListenerSets'.
	setStatus map[Ref]*gw.ListenerSetStatus
	// setsByParent are the ListenerSets naming each Gateway as parent,
	// oldest first.
	setsByParent map[Ref][]*gw.ListenerSet

	gatewayObjects []*istio.Object
	// policyObjects are the policies' DestinationRules.
	policyObjects []*istio.Object
	// parents are the listeners routes can bind to, by Gateway.
	parents map[parentKey][]*parentInfo
	// attached counts the routes bound to each listener, by Gateway.
	attached map[Ref]map[gw.SectionName]int32
	// virtualServices are the routes' VirtualServices before HTTP and
	// gRPC ones sharing a key are merged.
	virtualServices []keyedVS
	// configMapCAs are the ConfigMap CA certificates listeners read
	// (Output.ConfigMapCAs).
	configMapCAs map[string][]byte
}

func newConverter(in Input) *converter {
	c := &converter{
		in:           in,
		controllers:  map[gw.GatewayController]bool{},
		classes:      map[string]gw.GatewayController{},
		grants:       newGrants(in.ReferenceGrants),
		kinds:        map[string]istio.Kind{},
		classStatus:  map[string]*gw.GatewayClassStatus{},
		gwStatus:     map[Ref]*gw.GatewayStatus{},
		routeStatus:  map[Ref]*gw.RouteStatus{},
		policyStatus: map[Ref]*gw.PolicyStatus{},
		setStatus:    map[Ref]*gw.ListenerSetStatus{},
		setsByParent: ListenerSetsByParent(in.ListenerSets),
		parents:      map[parentKey][]*parentInfo{},
		attached:     map[Ref]map[gw.SectionName]int32{},
		configMapCAs: map[string][]byte{},
	}
	for _, ctl := range in.Controllers {
		c.controllers[ctl] = true
	}
	for _, k := range istio.Kinds() {
		c.kinds[k.Kind] = k
	}
	return c
}

// classes records the served GatewayClasses and their status (Istio's
// GatewayClassesCollection and GetClassStatus): Accepted for every class
// whose controllerName is served.
func (c *converter) convertClasses() {
	for name, ctl := range c.in.DefaultClasses {
		if c.controllers[ctl] {
			c.classes[name] = ctl
		}
	}
	for _, gc := range c.in.GatewayClasses {
		delete(c.classes, gc.Name)
		if !c.controllers[gc.Spec.ControllerName] {
			continue
		}
		c.classes[gc.Name] = gc.Spec.ControllerName
		st := gc.Status.DeepCopy()
		st.Conditions = updateCondition(st.Conditions, metav1.Condition{
			Type: string(gw.GatewayClassConditionStatusAccepted), Status: metav1.ConditionTrue,
			ObservedGeneration: gc.Generation, LastTransitionTime: c.in.Now,
			Reason: string(gw.GatewayClassReasonAccepted), Message: "Handled by Flotilla controller",
		})
		c.classStatus[gc.Name] = st
	}
}

// parentKey names what a route binds to: a Gateway, or the mesh.
type parentKey struct {
	Kind, Namespace, Name string
}

// parentInfo is one listener a route can bind to (Istio's parentInfo).
type parentInfo struct {
	// InternalName is the generated Gateway's "namespace/name", or
	// "mesh".
	InternalName string
	AllowedKinds []gw.RouteGroupKind
	// Hostnames are the server's hosts, "namespace/host".
	Hostnames        []string
	OriginalHostname string
	SectionName      gw.SectionName
	Port             gw.PortNumber
	Protocol         gw.ProtocolType
	// gateway is the Gateway or ListenerSet the listener is part of.
	gateway Ref
	// controller is its class's controllerName.
	controller gw.GatewayController
}

// gateways converts every Gateway of a served class (Istio's
// GatewayCollection): one Istio Gateway per valid listener, and the
// Gateway's status.
func (c *converter) gateways() {
	gws := slices.Clone(c.in.Gateways)
	slices.SortFunc(gws, func(a, b *gw.Gateway) int { return byCreation(&a.ObjectMeta, &b.ObjectMeta) })
	for _, g := range gws {
		ctl, ok := c.classes[string(g.Spec.GatewayClassName)]
		if !ok {
			continue
		}
		c.gateway(g, ctl)
	}
}

func byCreation(a, b *metav1.ObjectMeta) int {
	if r := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); r != 0 {
		return r
	}
	if r := cmp.Compare(a.Namespace, b.Namespace); r != 0 {
		return r
	}
	return cmp.Compare(a.Name, b.Name)
}

func (c *converter) gateway(g *gw.Gateway, ctl gw.GatewayController) {
	ref := Ref{Kind: KindGateway, Namespace: g.Namespace, Name: g.Name}
	st := g.Status.DeepCopy()
	c.gwStatus[ref] = st
	sets, refused := c.allowedSets(g)
	for _, ls := range refused {
		c.refuseListenerSet(ls)
	}
	services, err := c.gatewayServices(g)
	if len(services) == 0 && err != nil {
		c.reportGateway(g, st, services, nil, err, 0, 0)
		for _, ls := range sets {
			c.reportListenerSet(g, ls, c.listenerSetStatus(ls), services, nil, err, true)
		}
		return
	}
	if err == nil {
		err = c.parametersRef(g)
	}
	serviceAccount := ""
	if managed(&g.Spec) {
		serviceAccount = g.Annotations[annotationServiceAccount]
		if serviceAccount == "" {
			serviceAccount = DefaultName(g)
		}
	}
	gen := &generated{services: services, serviceAccount: serviceAccount, controller: ctl}
	conflicts := listenerConflicts(g, sets)
	var servers []*networking.Server
	valid := 0
	owner := listenerOwner{ref: ref, meta: &g.ObjectMeta, parent: g}
	for i, l := range g.Spec.Listeners {
		if reason, ok := conflicts[ref][l.Name]; ok {
			st.Listeners = reportListenerConflict(i, l, g.Generation, st.Listeners, reason, c.in.Now)
			continue
		}
		server, ls, programmed := c.listener(owner, st.Listeners, l, i, nil)
		st.Listeners = ls
		if programmed {
			valid++
		}
		if server == nil {
			continue
		}
		servers = append(servers, server)
		c.addListener(owner, l, server, programmed, gen)
	}
	attachedSets := 0
	for _, ls := range sets {
		setServers := c.listenerSet(g, ls, conflicts, gen, err)
		if len(setServers) > 0 {
			attachedSets++
			servers = append(servers, setServers...)
		}
	}
	c.reportGateway(g, st, services, servers, err, valid, attachedSets)
}

// listenerOwner is what a listener is part of: a Gateway, or a
// ListenerSet whose listeners run on its parent Gateway's deployment and
// take the parent's spec.tls.
type listenerOwner struct {
	ref    Ref
	meta   *metav1.ObjectMeta
	parent *gw.Gateway
}

// generated is what every Gateway generated for one Gateway's
// deployment carries.
type generated struct {
	services       []string
	serviceAccount string
	controller     gw.GatewayController
}

// addListener records a converted listener as a parent routes can bind
// to and, when programmed, generates its Istio Gateway
// "<owner>~istio-autogenerated-k8s-gateway~<listener>" in the owner's
// namespace: one server, so that routes bind to one listener.
func (c *converter) addListener(o listenerOwner, l gw.Listener, server *networking.Server, programmed bool, gen *generated) {
	name := o.ref.Name + "~" + GeneratedName + "~" + string(l.Name)
	allowed, _ := supportedKinds(l)
	pi := &parentInfo{
		InternalName: o.ref.Namespace + "/" + name, AllowedKinds: allowed, Hostnames: server.GetHosts(),
		OriginalHostname: string(deref(l.Hostname)), SectionName: l.Name, Port: l.Port, Protocol: l.Protocol,
		gateway: o.ref, controller: gen.controller,
	}
	key := parentKey(o.ref)
	c.parents[key] = append(c.parents[key], pi)
	if !programmed {
		return
	}
	annotations := map[string]string{
		AnnotationParents:              o.ref.Kind + "/" + o.ref.Name + "/" + string(l.Name) + "." + o.ref.Namespace,
		AnnotationGatewaySemantics:     model.RouteSemanticsGateway,
		model.AnnotationGatewayService: strings.Join(gen.services, ","),
		AnnotationServiceAccount:       gen.serviceAccount,
	}
	if o.parent.Namespace != o.ref.Namespace {
		annotations[AnnotationParentNamespace] = o.parent.Namespace
	}
	if granted := grantedCredentials(server.GetTls(), o.ref.Namespace); len(granted) > 0 {
		annotations[model.AnnotationGrantedCredentials] = strings.Join(granted, ",")
	}
	c.gatewayObjects = append(c.gatewayObjects, &istio.Object{
		Kind: c.kinds[istio.Gateway],
		Meta: istio.Meta{
			Name: name, Namespace: o.ref.Namespace, CreationTime: o.meta.CreationTimestamp.Time,
			Annotations: annotations,
		},
		Spec: &networking.Gateway{Servers: []*networking.Server{server}},
	})
}

// grantedCredentials are a server's certificates (and client CA Secret)
// of other namespaces than the Gateway's: the listener is converted with
// them only when a ReferenceGrant admits them, so they are what
// discovery may serve the gateway (model.AnnotationGrantedCredentials).
// A ConfigMap's CA is not among them: discovery serves it to anyone.
func grantedCredentials(t *networking.ServerTLSSettings, ns string) []string {
	var out []string
	for _, n := range append(append([]string{t.GetCredentialName()}, t.GetCredentialNames()...), t.GetCaCertCredentialName()) {
		rest, ok := strings.CutPrefix(n, registry.GatewayCredentialPrefix)
		if sns, _, _ := strings.Cut(rest, "/"); ok && sns != ns {
			out = append(out, n)
		}
	}
	return out
}

// DefaultName is the name of a managed Gateway's Deployment, Service and
// ServiceAccount: "<name>-<class>" (Istio's GetDefaultName), unless
// gateway.istio.io/name-override says otherwise.
func DefaultName(g *gw.Gateway) string {
	if n := g.Annotations[annotationNameOverride]; n != "" {
		return n
	}
	return g.Name + "-" + string(g.Spec.GatewayClassName)
}

// managed reports whether Flotilla deploys the Gateway (Istio's
// IsManaged): no address, or a single IP address; a Gateway naming a
// hostname (a Service) or several addresses is deployed by its user.
func managed(spec *gw.GatewaySpec) bool {
	switch len(spec.Addresses) {
	case 0:
		return true
	case 1:
		t := spec.Addresses[0].Type
		return t == nil || *t == gw.IPAddressType
	}
	return false
}

// gatewayServices returns the hostnames of the Services the Gateway runs
// behind (Istio's extractGatewayServices): the managed Service, or the
// Hostname addresses (a short name is a Service of the Gateway's
// namespace).
func (c *converter) gatewayServices(g *gw.Gateway) ([]string, *configError) {
	if managed(&g.Spec) {
		return []string{DefaultName(g) + "." + g.Namespace + ".svc." + c.in.DomainSuffix}, nil
	}
	var services, skipped []string
	for _, a := range g.Spec.Addresses {
		if a.Type != nil && *a.Type != gw.HostnameAddressType {
			skipped = append(skipped, a.Value)
			continue
		}
		fqdn := a.Value
		if !strings.Contains(fqdn, ".") {
			fqdn = fqdn + "." + g.Namespace + ".svc." + c.in.DomainSuffix
		}
		services = append(services, fqdn)
	}
	if len(skipped) > 0 {
		return services, errorf(string(gw.GatewayReasonUnsupportedAddress), "only Hostname is supported, ignoring %v", skipped)
	}
	if _, ok := g.Annotations["networking.istio.io/service-type"]; ok {
		return services, errorf(reasonDeprecatedField, "annotation networking.istio.io/service-type is deprecated, use Spec.Infrastructure.Routeability")
	}
	return services, nil
}

// parametersRef checks infrastructure.parametersRef (Istio's
// validateParametersRef): a ConfigMap of the Gateway's namespace.
func (c *converter) parametersRef(g *gw.Gateway) *configError {
	if g.Spec.Infrastructure == nil || g.Spec.Infrastructure.ParametersRef == nil {
		return nil
	}
	p := g.Spec.Infrastructure.ParametersRef
	if p.Kind != "ConfigMap" || p.Group != "" {
		return errorf(string(gw.GatewayReasonInvalidParameters), "Unsupported parametersRef group/kind %s/%s, only ConfigMap is supported", p.Group, p.Kind)
	}
	if _, ok := c.in.Cluster.ConfigMap(g.Namespace, p.Name); !ok {
		return errorf(string(gw.GatewayReasonInvalidParameters), "parametersRef ConfigMap %s/%s does not exist", g.Namespace, p.Name)
	}
	return nil
}

// listener converts one listener of o to a server and sets its status at
// index in statuses (Istio's buildListener). programmed is whether the
// listener is valid; a Gateway's listener can be valid and have no
// server (HTTPS or TLS without tls: a placeholder for ListenerSets),
// a ListenerSet's cannot. portErr is a ListenerSet listener's missing
// port.
func (c *converter) listener(o listenerOwner, statuses []gw.ListenerStatus, l gw.Listener, index int, portErr error) (*networking.Server, []gw.ListenerStatus, bool) {
	conds := map[string]*condition{
		string(gw.ListenerConditionAccepted):     {reason: string(gw.ListenerReasonAccepted), message: "No errors found"},
		string(gw.ListenerConditionProgrammed):   {reason: string(gw.ListenerReasonProgrammed), message: "No errors found"},
		string(gw.ListenerConditionConflicted):   {reason: string(gw.ListenerReasonNoConflicts), message: "No errors found", status: metav1.ConditionFalse},
		string(gw.ListenerConditionResolvedRefs): {reason: string(gw.ListenerReasonResolvedRefs), message: "No errors found"},
	}
	ok := true
	serverTLS, err := c.listenerTLS(o, frontendTLS(l.Port, o.parent.Spec.TLS), l.TLS, autoPassthrough(o.meta.Labels, l))
	if err != nil {
		conds[string(gw.ListenerConditionResolvedRefs)].err = err
		conds[string(gw.ListenerConditionProgrammed)].err = &configError{reason: string(gw.ListenerReasonInvalid), message: "Bad TLS configuration"}
		switch err.reason {
		case string(gw.ListenerReasonInvalidCACertificateRef), string(gw.ListenerReasonInvalidCACertificateKind), string(gw.ListenerReasonRefNotPermitted):
			conds[string(gw.ListenerConditionAccepted)].err = &configError{reason: string(gw.ListenerReasonNoValidCACertificate), message: err.message}
		}
		ok = false
	}
	hosts := c.hostnameMatch(o.ref.Namespace, l)
	if portErr != nil {
		conds[string(gw.ListenerConditionAccepted)].err = &configError{reason: string(gw.ListenerReasonUnsupportedProtocol), message: portErr.Error()}
		ok = false
	}
	protocol, perr := listenerProtocol(l.Protocol)
	if perr != nil {
		conds[string(gw.ListenerConditionAccepted)].err = &configError{reason: string(gw.ListenerReasonUnsupportedProtocol), message: perr.Error()}
		ok = false
	}
	server := &networking.Server{
		Port:  &networking.Port{Name: "default", Number: uint32(l.Port), Protocol: protocol}, //nolint:gosec // the CRD bounds a port to 1-65535
		Hosts: hosts,
		Tls:   serverTLS,
	}
	if serverTLS == nil && (l.Protocol == gw.HTTPSProtocolType || l.Protocol == gw.TLSProtocolType) {
		server = nil
		if o.ref.Kind == KindListenerSet {
			ok = false
			conds[string(gw.ListenerConditionAccepted)].err = &configError{
				reason: string(gw.ListenerReasonUnsupportedProtocol), message: fmt.Sprintf("protocol is %s but no TLS section is defined", l.Protocol),
			}
			conds[string(gw.ListenerConditionProgrammed)].err = &configError{reason: string(gw.ListenerReasonInvalid), message: "Bad TLS configuration"}
		}
	}
	return server, reportListener(index, l, o.meta.Generation, statuses, conds, c.in.Now), ok
}

// listenerProtocol maps a listener's protocol to the server's (Istio's
// listenerProtocolToIstio); HBONE is only for waypoints, which Flotilla
// does not run.
func listenerProtocol(p gw.ProtocolType) (string, error) {
	switch p {
	case gw.HTTPProtocolType, gw.HTTPSProtocolType, gw.TLSProtocolType, gw.TCPProtocolType:
		return string(p), nil
	case "HBONE":
		return "", fmt.Errorf("protocol %q is only supported for waypoint proxies", p)
	}
	up := gw.ProtocolType(strings.ToUpper(string(p)))
	switch up {
	case gw.HTTPProtocolType, gw.HTTPSProtocolType, gw.TLSProtocolType, gw.TCPProtocolType, "HBONE":
		return "", fmt.Errorf("protocol %q is unsupported. hint: %q (uppercase) may be supported", p, up)
	}
	return "", fmt.Errorf("protocol %q is unsupported", p)
}

// autoPassthrough is Istio's IsAutoPassthrough: a TLS listener marked
// auto-passthrough, or on the network gateway port of a Gateway with a
// network.
func autoPassthrough(gwLabels map[string]string, l gw.Listener) bool {
	if l.TLS == nil {
		return false
	}
	if string(l.TLS.Options[tlsOptionListenerMode]) == listenerModeAutoPassthru {
		return true
	}
	if _, ok := gwLabels[labelTopologyNetwork]; !ok {
		return false
	}
	want := "15443"
	if p, ok := gwLabels[labelGatewayPort]; ok {
		want = p
	}
	return strconv.Itoa(int(l.Port)) == want
}

// frontendTLS is the Gateway's client certificate validation for a port
// (Istio's resolveGatewayTLS).
func frontendTLS(port gw.PortNumber, t *gw.GatewayTLSConfig) *gw.TLSConfig {
	if t == nil || t.Frontend == nil {
		return nil
	}
	for i := range t.Frontend.PerPort {
		if t.Frontend.PerPort[i].Port == port {
			return &t.Frontend.PerPort[i].TLS
		}
	}
	return &t.Frontend.Default
}

// listenerTLS converts a listener's tls (Istio's buildTLS): Terminate is
// SIMPLE (MUTUAL with a frontend CA) with the certificates as
// kubernetes-gateway:// credentials, a Secret of another namespace only
// with a ReferenceGrant; Passthrough is PASSTHROUGH.
func (c *converter) listenerTLS(o listenerOwner, front *gw.TLSConfig, t *gw.ListenerTLSConfig, autoPass bool) (*networking.ServerTLSSettings, *configError) {
	kind, namespace := o.ref.Kind, o.ref.Namespace
	if t == nil {
		return nil, nil
	}
	out := &networking.ServerTLSSettings{}
	mode := gw.TLSModeTerminate
	if t.Mode != nil {
		mode = *t.Mode
	}
	switch mode {
	case gw.TLSModeTerminate:
		out.Mode = networking.ServerTLSSettings_SIMPLE
		switch t.Options[tlsOptionTerminateMode] {
		case "MUTUAL":
			out.Mode = networking.ServerTLSSettings_MUTUAL
		case "OPTIONAL_MUTUAL":
			out.Mode = networking.ServerTLSSettings_OPTIONAL_MUTUAL
		case "ISTIO_SIMPLE":
			out.CredentialName = "builtin://"
			return out, nil
		case "ISTIO_MUTUAL":
			out.Mode = networking.ServerTLSSettings_ISTIO_MUTUAL
			return out, nil
		}
		if len(t.CertificateRefs) > 2 {
			return out, errorf(string(gw.ListenerReasonInvalidCertificateRef), "TLS mode can only support up to 2 server certificates")
		}
		var names []string
		var errs *configError
		for _, ref := range t.CertificateRefs {
			ns := string(derefOr(ref.Namespace, gw.Namespace(namespace)))
			if ns != namespace && !c.grants.allowed(kind, namespace, "Secret", ns, string(ref.Name)) {
				errs = joinErrors(errs, errorf(string(gw.ListenerReasonRefNotPermitted),
					"certificateRef %v/%v not accessible to a Gateway in namespace %q (missing a ReferenceGrant?)", ref.Name, ns, namespace))
				continue
			}
			name, err := c.secretRef(ref, namespace)
			if err != nil {
				errs = joinErrors(errs, err)
				continue
			}
			names = append(names, name)
		}
		switch len(names) {
		case 0:
			return out, errs
		case 1:
			out.CredentialName = names[0]
		default:
			out.CredentialNames = names
		}
		if front != nil && front.Validation != nil && len(front.Validation.CACertificateRefs) > 0 {
			if len(front.Validation.CACertificateRefs) > 1 {
				return out, errorf(string(gw.ListenerReasonInvalidCACertificateRef), "only one caCertificateRef is supported")
			}
			ca := front.Validation.CACertificateRefs[0]
			caNS := string(derefOr(ca.Namespace, gw.Namespace(namespace)))
			if caNS != namespace && !c.grants.allowed(kind, namespace, string(ca.Kind), caNS, string(ca.Name)) {
				return out, errorf(string(gw.ListenerReasonRefNotPermitted),
					"caCertificateRef %v/%v not accessible to a Gateway in namespace %q (missing a ReferenceGrant?)", caNS, ca.Name, namespace)
			}
			name, err := c.caRef(ca, caNS)
			if err != nil {
				return out, err
			}
			out.Mode = networking.ServerTLSSettings_MUTUAL
			out.InsecureSkipVerify = wrapperspb.Bool(false)
			if front.Validation.Mode == gw.AllowInsecureFallback {
				out.Mode = networking.ServerTLSSettings_OPTIONAL_MUTUAL
				out.InsecureSkipVerify = wrapperspb.Bool(true)
			}
			out.CaCertCredentialName = name
			switch t.Options[tlsOptionTerminateMode] {
			case "MUTUAL":
				out.Mode = networking.ServerTLSSettings_MUTUAL
				out.InsecureSkipVerify = wrapperspb.Bool(false)
			case "OPTIONAL_MUTUAL":
				out.Mode = networking.ServerTLSSettings_OPTIONAL_MUTUAL
				out.InsecureSkipVerify = wrapperspb.Bool(false)
			}
		}
	case gw.TLSModePassthrough:
		out.Mode = networking.ServerTLSSettings_PASSTHROUGH
		if autoPass {
			out.Mode = networking.ServerTLSSettings_AUTO_PASSTHROUGH
		}
	}
	if v := t.Options[tlsOptionCipherSuites]; v != "" {
		for _, s := range strings.Split(string(v), ",") {
			if s = strings.TrimSpace(s); s != "" {
				out.CipherSuites = append(out.CipherSuites, s)
			}
		}
	}
	return out, nil
}

// secretRef checks a certificateRef (Istio's buildSecretReference): a
// Secret that exists and holds a certificate and key that make a pair.
func (c *converter) secretRef(ref gw.SecretObjectReference, gwNamespace string) (string, *configError) {
	group, kind := string(deref(ref.Group)), string(derefOr(ref.Kind, "Secret"))
	ns := string(derefOr(ref.Namespace, gw.Namespace(gwNamespace)))
	what := fmt.Sprintf("%s/%s/%s.%s", deref(ref.Group), deref(ref.Kind), ref.Name, deref(ref.Namespace))
	if group != "" || kind != "Secret" {
		return "", errorf(string(gw.ListenerReasonInvalidCertificateRef), "invalid certificate reference %v, only secret is allowed", what)
	}
	data, ok := c.in.Cluster.Secret(ns, string(ref.Name))
	if !ok {
		return "", errorf(string(gw.ListenerReasonInvalidCertificateRef), "invalid certificate reference %v, secret %v not found", what, ns+"/"+string(ref.Name))
	}
	cert, key, err := certAndKey(data)
	if err != nil {
		return "", errorf(string(gw.ListenerReasonInvalidCertificateRef), "invalid certificate reference %v, %v", what, err)
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return "", errorf(string(gw.ListenerReasonInvalidCertificateRef), "invalid certificate reference %v, the certificate is malformed: %v", what, err)
	}
	return registry.GatewayCredentialPrefix + ns + "/" + string(ref.Name), nil
}

// certAndKey finds a Secret's certificate and key under the keys Istio
// reads (kubecreds.ExtractCertInfo): tls.crt/tls.key, or cert/key.
func certAndKey(data map[string][]byte) (cert, key []byte, err error) {
	switch {
	case len(data["tls.crt"]) > 0 && len(data["tls.key"]) > 0:
		return data["tls.crt"], data["tls.key"], nil
	case len(data["cert"]) > 0 && len(data["key"]) > 0:
		return data["cert"], data["key"], nil
	}
	return nil, nil, fmt.Errorf("found secret, but didn't have expected keys (cert and key) or (tls.crt and tls.key)")
}

// caRef checks a frontend caCertificateRef (Istio's
// buildCaCertificateReference): a ConfigMap's ca.crt or a Secret's
// ca.crt holding PEM certificates.
func (c *converter) caRef(ref gw.ObjectReference, ns string) (string, *configError) {
	what := fmt.Sprintf("%s/%s/%s.%s", ref.Group, ref.Kind, ref.Name, deref(ref.Namespace))
	var pem []byte
	var prefix string
	switch {
	case ref.Group == "" && ref.Kind == "ConfigMap":
		prefix = registry.ConfigMapCredentialPrefix
		data, ok := c.in.Cluster.ConfigMap(ns, string(ref.Name))
		if !ok {
			return "", errorf(string(gw.ListenerReasonInvalidCACertificateRef), "invalid CA certificate reference %v, configmap %v not found", what, ns+"/"+string(ref.Name))
		}
		pem = []byte(data["ca.crt"])
	case ref.Group == "" && ref.Kind == "Secret":
		prefix = registry.GatewayCredentialPrefix
		data, ok := c.in.Cluster.Secret(ns, string(ref.Name))
		if !ok {
			return "", errorf(string(gw.ListenerReasonInvalidCACertificateRef), "invalid CA certificate reference %v, secret %v not found", what, ns+"/"+string(ref.Name))
		}
		pem = data["ca.crt"]
	default:
		return "", errorf(string(gw.ListenerReasonInvalidCACertificateKind), "invalid CA certificate reference %v, only secret and configmap are allowed", what)
	}
	if len(pem) == 0 {
		return "", errorf(string(gw.ListenerReasonInvalidCACertificateRef), "invalid CA certificate reference %v, found no ca.crt", what)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return "", errorf(string(gw.ListenerReasonInvalidCACertificateRef), "invalid CA certificate reference %v, the bundle is malformed", what)
	}
	if prefix == registry.ConfigMapCredentialPrefix {
		c.configMapCAs[ns+"/"+string(ref.Name)] = pem
	}
	return prefix + ns + "/" + string(ref.Name) + caSuffix, nil
}

// hostnameMatch is the server's hosts (Istio's buildHostnameMatch):
// "namespace/hostname" for every namespace whose routes the listener
// allows, "~/hostname" when it allows none.
func (c *converter) hostnameMatch(local string, l gw.Listener) []string {
	host := "*"
	if l.Hostname != nil {
		host = string(*l.Hostname)
	}
	var out []string
	for _, ns := range c.allowedNamespaces(local, l.AllowedRoutes) {
		out = append(out, ns+"/"+host)
	}
	if len(out) == 0 {
		return []string{"~/" + host}
	}
	return out
}

// allowedNamespaces is Istio's namespacesFromSelector: the listener's own
// namespace by default, "*" for All, or the namespaces a selector
// matches (every namespace carries its kubernetes.io/metadata.name).
func (c *converter) allowedNamespaces(local string, ar *gw.AllowedRoutes) []string {
	if ar == nil || ar.Namespaces == nil || ar.Namespaces.From == nil || *ar.Namespaces.From == gw.NamespacesFromSame {
		return []string{local}
	}
	switch *ar.Namespaces.From {
	case gw.NamespacesFromAll:
		return []string{"*"}
	case gw.NamespacesFromNone:
		return nil
	}
	if ar.Namespaces.Selector == nil {
		return []string{"*"}
	}
	sel, err := metav1.LabelSelectorAsSelector(ar.Namespaces.Selector)
	if err != nil {
		return nil
	}
	var out []string
	for name, ls := range c.in.Cluster.Namespaces() {
		set := labels.Set{}
		for k, v := range ls {
			set[k] = v
		}
		set[corev1.LabelMetadataName] = name
		if sel.Matches(set) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// supportedKinds are the route kinds a listener accepts (Istio's
// GenerateGatewaySupportedKinds), and whether every kind it names is
// supported.
func supportedKinds(l gw.Listener) ([]gw.RouteGroupKind, bool) {
	var supported []gw.RouteGroupKind
	switch l.Protocol {
	case gw.HTTPProtocolType, gw.HTTPSProtocolType:
		supported = []gw.RouteGroupKind{routeKind(KindHTTPRoute), routeKind(KindGRPCRoute)}
	case gw.TCPProtocolType:
		supported = []gw.RouteGroupKind{routeKind(KindTCPRoute)}
	case gw.TLSProtocolType:
		supported = []gw.RouteGroupKind{routeKind(KindTLSRoute)}
		if l.TLS != nil && deref(l.TLS.Mode) == gw.TLSModeTerminate {
			supported = append(supported, routeKind(KindTCPRoute))
		}
	}
	if l.AllowedRoutes == nil || len(l.AllowedRoutes.Kinds) == 0 {
		return supported, true
	}
	var both []gw.RouteGroupKind
	for _, s := range supported {
		for _, k := range l.AllowedRoutes.Kinds {
			if s.Kind == k.Kind && derefOr(s.Group, Group) == derefOr(k.Group, Group) {
				both = append(both, s)
				break
			}
		}
	}
	return both, len(both) == len(l.AllowedRoutes.Kinds)
}

func routeKind(kind string) gw.RouteGroupKind {
	g := gw.Group(Group)
	return gw.RouteGroupKind{Group: &g, Kind: gw.Kind(kind)}
}

// reportListener sets a listener's status at index (Istio's
// ReportListenerCondition).
func reportListener(index int, l gw.Listener, generation int64, ls []gw.ListenerStatus, conds map[string]*condition, now metav1.Time) []gw.ListenerStatus {
	for index >= len(ls) {
		ls = append(ls, gw.ListenerStatus{})
	}
	kinds, valid := supportedKinds(l)
	if !valid {
		conds[string(gw.ListenerConditionResolvedRefs)] = &condition{
			reason: string(gw.ListenerReasonInvalidRouteKinds), status: metav1.ConditionFalse, message: "Invalid route kinds",
		}
	}
	if kinds == nil {
		kinds = []gw.RouteGroupKind{}
	}
	ls[index] = gw.ListenerStatus{
		Name: l.Name, SupportedKinds: kinds,
		Conditions: setConditions(generation, ls[index].Conditions, conds, now),
	}
	return ls
}

// reportListenerConflict sets a conflicting listener's status (Istio's
// ReportListenerConflict).
func reportListenerConflict(index int, l gw.Listener, generation int64, ls []gw.ListenerStatus, reason gw.ListenerConditionReason, now metav1.Time) []gw.ListenerStatus {
	const msg = "Listener has a conflict with another listener attached to the same Gateway"
	return reportListener(index, l, generation, ls, map[string]*condition{
		string(gw.ListenerConditionAccepted):   {err: &configError{reason: string(reason), message: msg}},
		string(gw.ListenerConditionProgrammed): {err: &configError{reason: string(reason), message: msg}},
		string(gw.ListenerConditionConflicted): {reason: string(reason), message: msg, status: metav1.ConditionTrue},
	}, now)
}

// listenerConflicts finds the listeners of a Gateway and of the
// ListenerSets it allows (oldest first) that conflict with an earlier one
// that does not (Istio's ComputeGatewayListenerConflicts): the same port
// with protocols that cannot share it, or the same hostname. The
// Gateway's own listeners come first, so a set's never takes their place.
func listenerConflicts(g *gw.Gateway, sets []*gw.ListenerSet) map[Ref]map[gw.SectionName]gw.ListenerConditionReason {
	type owned struct {
		owner Ref
		l     gw.Listener
	}
	var all []owned
	for _, l := range g.Spec.Listeners {
		all = append(all, owned{Ref{Kind: KindGateway, Namespace: g.Namespace, Name: g.Name}, l})
	}
	for _, ls := range sets {
		for _, e := range ls.Spec.Listeners {
			l := gw.Listener(e)
			if port, err := listenerEntryPort(e); err == nil {
				l.Port = port
			}
			all = append(all, owned{Ref{Kind: KindListenerSet, Namespace: ls.Namespace, Name: ls.Name}, l})
		}
	}
	// The accepted listeners by port, so that a Gateway allowing many
	// sets costs each listener a few lookups rather than a comparison
	// with every listener before it: on one port, the first of each
	// class that listenersDistinct tells apart.
	type portState struct {
		first  map[string]int // "l4", "http" (HTTP, HTTPS, TLS), "proto/<p>" for others
		byHost map[string]int // HTTP-like, by hostname
	}
	ports := map[gw.PortNumber]*portState{}
	var accepted []gw.Listener
	out := map[Ref]map[gw.SectionName]gw.ListenerConditionReason{}
	for _, o := range all {
		l := o.l
		ps := ports[l.Port]
		if ps == nil {
			ps = &portState{first: map[string]int{}, byHost: map[string]int{}}
			ports[l.Port] = ps
		}
		// The earliest accepted listener l is not distinct from.
		prior := -1
		consider := func(i int, ok bool) {
			if ok && (prior < 0 || i < prior) {
				prior = i
			}
		}
		switch {
		case isTCPUDP(l.Protocol):
			consider(lookup(ps.first, "l4"))
			consider(lookup(ps.first, "http"))
		case isHTTPLike(l.Protocol):
			consider(lookup(ps.first, "l4"))
			consider(lookup(ps.byHost, listenerHost(l)))
		default:
			consider(lookup(ps.first, "proto/"+string(l.Protocol)))
		}
		if prior < 0 {
			i := len(accepted)
			accepted = append(accepted, l)
			setFirst := func(m map[string]int, k string) {
				if _, ok := m[k]; !ok {
					m[k] = i
				}
			}
			switch {
			case isTCPUDP(l.Protocol):
				setFirst(ps.first, "l4")
			case isHTTPLike(l.Protocol):
				setFirst(ps.first, "http")
				setFirst(ps.byHost, listenerHost(l))
			default:
				setFirst(ps.first, "proto/"+string(l.Protocol))
			}
			continue
		}
		p := accepted[prior]
		reason := gw.ListenerReasonHostnameConflict
		if l.Protocol != p.Protocol || (isTCPUDP(l.Protocol) && isTCPUDP(p.Protocol)) {
			reason = gw.ListenerReasonProtocolConflict
		}
		if out[o.owner] == nil {
			out[o.owner] = map[gw.SectionName]gw.ListenerConditionReason{}
		}
		out[o.owner][l.Name] = reason
	}
	return out
}

func lookup(m map[string]int, k string) (int, bool) {
	i, ok := m[k]
	return i, ok
}

func isTCPUDP(p gw.ProtocolType) bool { return p == gw.TCPProtocolType || p == gw.UDPProtocolType }

func isHTTPLike(p gw.ProtocolType) bool {
	return p == gw.HTTPProtocolType || p == gw.HTTPSProtocolType || p == gw.TLSProtocolType
}

func listenerHost(l gw.Listener) string {
	if l.Hostname == nil || *l.Hostname == "" {
		return "*"
	}
	return string(*l.Hostname)
}

// reportGateway sets the Gateway's conditions and addresses (Istio's
// reportGatewayStatus).
func (c *converter) reportGateway(g *gw.Gateway, st *gw.GatewayStatus, services []string, servers []*networking.Server, gwErr *configError, valid, attachedSets int) {
	inst := c.resolveInstances(g.Namespace, services, servers)
	conds := map[string]*condition{
		string(gw.GatewayConditionAccepted):     {reason: string(gw.GatewayReasonAccepted), message: "Resource accepted"},
		string(gw.GatewayConditionProgrammed):   {reason: string(gw.GatewayReasonProgrammed), message: "Resource programmed"},
		string(gw.GatewayConditionResolvedRefs): {reason: string(gw.GatewayReasonResolvedRefs), message: "All references resolved"},
	}
	if gwErr != nil {
		conds[string(gw.GatewayConditionAccepted)].err = gwErr
	} else if total := len(g.Spec.Listeners); total > 0 && valid < total {
		acc := conds[string(gw.GatewayConditionAccepted)]
		if valid == 0 {
			acc.err = &configError{reason: string(gw.GatewayReasonListenersNotValid), message: "None of the Gateway's listeners are valid"}
		} else {
			acc.reason, acc.message = string(gw.GatewayReasonListenersNotValid), "One or more of the Gateway's listeners are invalid"
		}
	}
	if f := g.Spec.TLS; f != nil && f.Frontend != nil {
		insecure := f.Frontend.Default.Validation != nil && f.Frontend.Default.Validation.Mode == gw.AllowInsecureFallback
		for _, pp := range f.Frontend.PerPort {
			insecure = insecure || (pp.TLS.Validation != nil && pp.TLS.Validation.Mode == gw.AllowInsecureFallback)
		}
		if insecure {
			conds[string(gw.GatewayConditionInsecureFrontendValidationMode)] = &condition{
				status: metav1.ConditionTrue, reason: string(gw.GatewayReasonConfigurationChanged),
				message: "Gateway is operating in AllowInsecureFallback mode for frontend validation",
			}
		} else {
			st.Conditions = removeCondition(st.Conditions, string(gw.GatewayConditionInsecureFrontendValidationMode))
		}
	}
	programmedCondition(conds, inst, services)
	// Istio sets it only when not 0, keeping a stale count when the last
	// set goes; 0 is absent here.
	st.AttachedListenerSets = nil
	if attachedSets > 0 {
		st.AttachedListenerSets = new(int32(attachedSets)) //nolint:gosec // at most the ListenerSets in the input
	}
	addrs := inst.external
	if len(addrs) == 0 {
		want := gw.HostnameAddressType
		if o, ok := g.Annotations[annotationAddressType]; ok {
			want = gw.AddressType(o)
		}
		if want != gw.HostnameAddressType {
			addrs = inst.internalIP
		}
		if want != gw.IPAddressType {
			for _, hp := range inst.internal {
				h, _, _ := net.SplitHostPort(hp)
				if !slices.Contains(inst.pending, h) && !slices.Contains(addrs, h) {
					addrs = append(addrs, h)
				}
			}
		}
	}
	if len(addrs) > 0 {
		st.Addresses = make([]gw.GatewayStatusAddress, 0, len(addrs))
		for _, a := range addrs {
			t := gw.HostnameAddressType
			if _, err := netip.ParseAddr(a); err == nil {
				t = gw.IPAddressType
			}
			st.Addresses = append(st.Addresses, gw.GatewayStatusAddress{Value: a, Type: &t})
		}
	}
	st.Listeners = pruneListeners(st.Listeners, g.Spec.Listeners,
		func(l gw.ListenerStatus) gw.SectionName { return l.Name }, func(l gw.Listener) gw.SectionName { return l.Name })
	st.Conditions = setConditions(g.Generation, st.Conditions, conds, c.in.Now)
}

// pruneListeners keeps the status of the listeners still in the spec,
// the first entry of each (Istio's reportGatewayStatus and
// PruneListenerSetStatusListeners).
func pruneListeners[S, L any](statuses []S, spec []L, statusName func(S) gw.SectionName, specName func(L) gw.SectionName) []S {
	names := map[gw.SectionName]bool{}
	for _, l := range spec {
		names[specName(l)] = true
	}
	kept := make([]S, 0, len(statuses))
	for _, s := range statuses {
		if names[statusName(s)] {
			delete(names, statusName(s))
			kept = append(kept, s)
		}
	}
	return kept
}

// programmedCondition sets the Programmed condition from where the
// Gateway's services run (Istio's SetProgrammedCondition).
func programmedCondition(conds map[string]*condition, inst instances, services []string) {
	programmed := conds[string(gw.GatewayConditionProgrammed)]
	if len(inst.internal) > 0 {
		programmed.message = "Resource programmed, assigned to service(s) " + humanJoin(inst.internal)
	}
	switch {
	case len(services) == 0:
		programmed.err = &configError{reason: string(gw.GatewayReasonUnsupportedAddress), message: "Failed to assign to any requested addresses"}
	case len(inst.warnings) > 0:
		msg := "Failed to assign to any requested addresses: " + strings.Join(inst.warnings, "; ")
		if len(inst.internal) > 0 {
			msg = fmt.Sprintf("Assigned to service(s) %s, but failed to assign to all requested addresses: %s", humanJoin(inst.internal), strings.Join(inst.warnings, "; "))
		}
		reason := gw.GatewayReasonAddressNotUsable
		if inst.allUsable {
			reason = gw.GatewayReasonAddressNotAssigned
		}
		programmed.err = &configError{reason: string(reason), message: msg}
	}
}

func humanJoin(ss []string) string {
	switch len(ss) {
	case 0:
		return ""
	case 1:
		return ss[0]
	case 2:
		return ss[0] + " and " + ss[1]
	}
	return strings.Join(ss[:len(ss)-1], ", ") + ", and " + ss[len(ss)-1]
}

// instances is where a Gateway's services run (Istio's
// ResolveGatewayInstances).
type instances struct {
	internal, internalIP, external, pending, warnings []string
	allUsable                                         bool
}

func (c *converter) resolveInstances(namespace string, services []string, servers []*networking.Server) instances {
	ports := map[int32]bool{}
	for _, s := range servers {
		ports[int32(s.GetPort().GetNumber())] = true //nolint:gosec // a listener port, at most 65535
	}
	sortedPorts := make([]int32, 0, len(ports))
	for p := range ports {
		sortedPorts = append(sortedPorts, p)
	}
	slices.Sort(sortedPorts)
	internal, internalIP, external, pending := set{}, set{}, set{}, set{}
	var warnings []string
	unusable := false
	suffix := "." + namespace + ".svc." + c.in.DomainSuffix
	for _, host := range services {
		var svc *Service
		if name, ok := strings.CutSuffix(host, suffix); ok && !strings.Contains(name, ".") {
			svc, _ = c.in.Cluster.Service(namespace, name)
		}
		if svc == nil {
			warnings = append(warnings, fmt.Sprintf("hostname %q not found", host))
			unusable = true
			continue
		}
		for _, port := range sortedPorts {
			if svc.ReadyPorts[port] {
				internal.add(host + ":" + strconv.Itoa(int(port)))
				internalIP.add(svc.ClusterIPs...)
				switch {
				case len(svc.External) > 0:
					external.add(svc.External...)
				case svc.LoadBalancer && !pending[host]:
					warnings = append(warnings, fmt.Sprintf("address pending for hostname %q", host))
					pending.add(host)
				}
				continue
			}
			if len(svc.ReadyPorts) == 0 {
				warnings = append(warnings, fmt.Sprintf("no instances found for hostname %q", host))
				continue
			}
			hint := set{}
			for sp, tps := range svc.TargetPorts {
				if svc.ReadyPorts[sp] && slices.Contains(tps, port) {
					hint.add(strconv.Itoa(int(sp)))
				}
			}
			if len(hint) > 0 {
				warnings = append(warnings, fmt.Sprintf("port %d not found for hostname %q (hint: the service port should be specified, not the workload port. Did you mean one of these ports: %v?)",
					port, host, hint.sorted()))
				unusable = true
				continue
			}
			_, isManaged := svc.Labels["gateway.istio.io/managed"]
			if !isManaged || !slices.Contains(svc.Ports, port) {
				warnings = append(warnings, fmt.Sprintf("port %d not found for hostname %q", port, host))
				unusable = true
			}
		}
	}
	slices.Sort(warnings)
	return instances{
		internal: internal.sorted(), internalIP: internalIP.sorted(), external: external.sorted(), pending: pending.sorted(),
		warnings: warnings, allUsable: !unusable,
	}
}

type set map[string]bool

func (s set) add(vs ...string) {
	for _, v := range vs {
		s[v] = true
	}
}

func (s set) sorted() []string {
	out := make([]string, 0, len(s))
	for v := range s {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func derefOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
