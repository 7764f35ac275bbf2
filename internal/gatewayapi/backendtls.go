package gatewayapi

import (
	"cmp"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Names Istio gives what it derives from a BackendTLSPolicy
// (pilot/pkg/config/kube/gateway/backend_policies.go).
const (
	// annotationIgnorePolicy "true" on a policy makes Istio (and Flotilla)
	// leave it alone, reporting so in its status.
	annotationIgnorePolicy = "istio.io/ignore-policy-attachment"
	reasonIgnoredByIstio   = "IgnoredByIstio"
	// maxPolicyAncestors is the most ancestors a PolicyStatus holds.
	maxPolicyAncestors = 16
)

// backendTarget is a Service or ServiceEntry a policy targets.
type backendTarget struct {
	kind, namespace, name string
}

// backendPolicy is one policy's TLS for one host of one target (Istio's
// BackendPolicy).
type backendPolicy struct {
	source  Ref
	created metav1.Time
	target  backendTarget
	host    string
	// section is the port name the policy targets ("" for every port),
	// port its number (0 when the target has no such port yet).
	section string
	port    uint32
	tls     *networking.ClientTLSSettings
}

// backendTLSPolicies converts the BackendTLSPolicies into DestinationRules
// and sets their status, as Istio's BackendTLSPolicyCollection and
// DestinationRuleCollection: each policy's TLS (mode SIMPLE, its hostname
// as SNI, its subjectAltNames, its CA ConfigMap as "configmap://") goes to
// the hosts of each Service or ServiceEntry it targets, port by port for a
// sectionName; of two policies targeting the same backend and section the
// older (then the first by name) wins and the other is Conflicted. Each
// policy's ancestors are its targets (for the mesh) and the Gateways whose
// routes send to them.
func (c *converter) backendTLSPolicies() {
	usedBy := c.gatewaysByBackend()
	byTarget := map[string][]*gw.BackendTLSPolicy{}
	for _, p := range c.in.BackendTLSPolicies {
		if ignored(p) {
			continue
		}
		for _, t := range p.Spec.TargetRefs {
			k := p.Namespace + "/" + string(t.Kind) + "/" + string(t.Name)
			byTarget[k] = append(byTarget[k], p)
		}
	}
	var all []backendPolicy
	for _, p := range c.in.BackendTLSPolicies {
		all = append(all, c.backendTLSPolicy(p, usedBy, byTarget)...)
	}
	c.policyObjects = append(c.policyObjects, c.backendDestinationRules(all)...)
}

func ignored(p *gw.BackendTLSPolicy) bool {
	return strings.EqualFold(p.Annotations[annotationIgnorePolicy], "true")
}

func (c *converter) backendTLSPolicy(p *gw.BackendTLSPolicy, usedBy map[backendTarget]set, byTarget map[string][]*gw.BackendTLSPolicy) []backendPolicy {
	ref := Ref{Kind: KindBackendTLSPolicy, Namespace: p.Namespace, Name: p.Name}
	if ignored(p) {
		conds := map[string]*condition{string(gw.PolicyConditionAccepted): {
			err: errorf(reasonIgnoredByIstio, "Ignored by Istio due to annotation %s=true", annotationIgnorePolicy),
		}}
		ancestors := make([]gw.PolicyAncestorStatus, 0, len(p.Spec.TargetRefs))
		for _, t := range p.Spec.TargetRefs {
			ancestors = append(ancestors, c.ancestorStatus(p, targetAncestor(t), conds))
		}
		c.policyStatus[ref] = &gw.PolicyStatus{Ancestors: c.mergeAncestors(p.Status.Ancestors, ancestors)}
		return nil
	}
	conds := map[string]*condition{
		string(gw.PolicyConditionAccepted):               {reason: string(gw.PolicyReasonAccepted), message: "Configuration is valid"},
		string(gw.BackendTLSPolicyConditionResolvedRefs): {reason: string(gw.BackendTLSPolicyReasonResolvedRefs), message: "Configuration is valid"},
	}
	v := p.Spec.Validation
	tls := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: string(v.Hostname)}
	for _, san := range v.SubjectAltNames {
		switch san.Type {
		case gw.HostnameSubjectAltNameType:
			tls.SubjectAltNames = append(tls.SubjectAltNames, string(san.Hostname))
		case gw.URISubjectAltNameType:
			tls.SubjectAltNames = append(tls.SubjectAltNames, string(san.URI))
		}
	}
	tls.CredentialName = c.backendCACredential(v, p.Namespace, conds)

	var out []backendPolicy
	ancestors := make([]gw.PolicyAncestorStatus, 0, len(p.Spec.TargetRefs))
	gateways := set{}
	base := conds
	for _, t := range p.Spec.TargetRefs {
		// Each target's conditions start from the policy's own: in
		// Istio's loop a target's error stays on the targets after it
		// (they share the condition), which reports a valid target as
		// not found.
		conds = cloneConditions(base)
		target, hosts, port, err := c.policyTarget(t, p.Namespace)
		if err != nil {
			conds[string(gw.PolicyConditionAccepted)].err = errorf(string(gw.PolicyReasonTargetNotFound), "targetRefs invalid: %s", err)
		} else {
			if winner := conflictingPolicy(p, t, byTarget[p.Namespace+"/"+string(t.Kind)+"/"+string(t.Name)]); winner != "" {
				conds[string(gw.PolicyConditionAccepted)].err = errorf(string(gw.PolicyReasonConflicted), "Conflicts with BackendTLSPolicy %q targeting the same backend", winner)
			} else {
				for _, h := range hosts {
					out = append(out, backendPolicy{
						source: ref, created: p.CreationTimestamp, target: target, host: h,
						section: string(deref(t.SectionName)), port: port, tls: tls,
					})
				}
			}
			gateways.add(slices.Collect(maps.Keys(usedBy[target]))...)
		}
		ancestors = append(ancestors, c.ancestorStatus(p, targetAncestor(t), conds))
	}
	// Istio reports the Gateways with the conditions of the last target.
	for _, g := range gateways.sorted() {
		ns, name, _ := strings.Cut(g, "/")
		pr := gw.ParentReference{
			Group: new(gw.Group(Group)), Kind: new(gw.Kind(KindGateway)),
			Namespace: new(gw.Namespace(ns)), Name: gw.ObjectName(name),
		}
		ancestors = append(ancestors, c.ancestorStatus(p, pr, conds))
	}
	c.policyStatus[ref] = &gw.PolicyStatus{Ancestors: c.mergeAncestors(p.Status.Ancestors, ancestors)}
	return out
}

func cloneConditions(conds map[string]*condition) map[string]*condition {
	out := make(map[string]*condition, len(conds))
	for k, v := range conds {
		cp := *v
		out[k] = &cp
	}
	return out
}

func targetAncestor(t gw.LocalPolicyTargetReferenceWithSectionName) gw.ParentReference {
	return gw.ParentReference{Group: new(t.Group), Kind: new(t.Kind), Name: t.Name, SectionName: t.SectionName}
}

// backendCACredential is the credentialName of a policy's CA (Istio's
// getBackendTLSCredentialName): "" for the system's roots, the first
// caCertificateRef's ConfigMap as "configmap://namespace/name", or
// registry.InvalidCredentialPrefix, with the conditions saying why, when
// it cannot be used.
func (c *converter) backendCACredential(v gw.BackendTLSPolicyValidation, ns string, conds map[string]*condition) string {
	if wk := v.WellKnownCACertificates; wk != nil {
		if *wk != gw.WellKnownCACertificatesSystem {
			conds[string(gw.PolicyConditionAccepted)].err = errorf(string(gw.PolicyReasonInvalid), "Unknown wellKnownCACertificates: %v", *wk)
		}
		return ""
	}
	if len(v.CACertificateRefs) == 0 {
		return ""
	}
	ref := v.CACertificateRefs[0]
	if len(v.CACertificateRefs) > 1 {
		conds[string(gw.PolicyConditionAccepted)].message += "; warning: only the first caCertificateRefs will be used"
	}
	resolved := conds[string(gw.BackendTLSPolicyConditionResolvedRefs)]
	var err error
	switch {
	case ref.Group == "" && ref.Kind == "ConfigMap":
		data, ok := c.in.Cluster.ConfigMap(ns, string(ref.Name))
		switch {
		case !ok:
			err = fmt.Errorf("reference %s/%s (of kind ConfigMap) not found", ns, ref.Name)
			resolved.err = errorf(string(gw.BackendTLSPolicyReasonInvalidCACertificateRef), "Certificate reference not found: %s", err)
		case data["ca.crt"] == "" && data["cacert"] == "":
			err = fmt.Errorf("found no ca.crt in ConfigMap %s/%s", ns, ref.Name)
			resolved.err = errorf(string(gw.BackendTLSPolicyReasonInvalidCACertificateRef), "Certificate invalid: %s", err)
		default:
			pem := []byte(cmp.Or(data["cacert"], data["ca.crt"]))
			if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				// Stricter than Istio, which leaves a malformed bundle
				// to the proxy to refuse: the policy's status says so.
				err = fmt.Errorf("the ca.crt of ConfigMap %s/%s holds no PEM certificate", ns, ref.Name)
				resolved.err = errorf(string(gw.BackendTLSPolicyReasonInvalidCACertificateRef), "Certificate invalid: %s", err)
				break
			}
			c.configMapCAs[ns+"/"+string(ref.Name)] = pem
			return registry.ConfigMapCredentialPrefix + ns + "/" + string(ref.Name)
		}
	case ref.Group == "" && ref.Kind == "Secret":
		// As Istio: only ConfigMaps (the spec's core support).
		err = fmt.Errorf("unsupported reference kind: %v", ref.Kind)
		resolved.err = errorf(string(gw.BackendTLSPolicyReasonInvalidKind), "Certificate reference invalid: %s", err)
	default:
		err = fmt.Errorf("unsupported kind %v", ref.Kind)
		resolved.err = errorf(string(gw.BackendTLSPolicyReasonInvalidKind), "Certificate reference not supported: %s", err)
	}
	conds[string(gw.PolicyConditionAccepted)].err = errorf(string(gw.BackendTLSPolicyReasonNoValidCACertificate), "Certificate reference invalid: %s", err)
	return registry.InvalidCredentialPrefix
}

// policyTarget resolves a targetRef to a Service or ServiceEntry of ns:
// its hosts, and the number of the port its sectionName names.
func (c *converter) policyTarget(t gw.LocalPolicyTargetReferenceWithSectionName, ns string) (backendTarget, []string, uint32, error) {
	section := string(deref(t.SectionName))
	name := string(t.Name)
	switch {
	case t.Group == "" && t.Kind == "Service":
		svc, ok := c.in.Cluster.Service(ns, name)
		if !ok {
			return backendTarget{}, nil, 0, fmt.Errorf("reference %s/%s (of kind Service) not found", ns, name)
		}
		var port uint32
		if section != "" {
			n, ok := svc.PortNames[section]
			if !ok {
				return backendTarget{}, nil, 0, fmt.Errorf("sectionName %q does not exist in Service %s/%s", section, ns, name)
			}
			port = uint32(n) //nolint:gosec // a Service port is 1–65535
		}
		return backendTarget{kind: "Service", namespace: ns, name: name}, []string{name + "." + ns + ".svc." + c.in.DomainSuffix}, port, nil
	case t.Group == "networking.istio.io" && t.Kind == "ServiceEntry":
		hosts, ok := c.in.Cluster.ServiceEntryHosts(ns, name)
		if !ok {
			return backendTarget{}, nil, 0, fmt.Errorf("reference %s/%s (of kind ServiceEntry) not found", ns, name)
		}
		var port uint32
		if section != "" {
			n, ok := c.in.Cluster.ServiceEntryPorts(ns, name)[section]
			if !ok {
				return backendTarget{}, nil, 0, fmt.Errorf("sectionName %q does not exist in ServiceEntry %s/%s", section, ns, name)
			}
			port = n
		}
		return backendTarget{kind: "ServiceEntry", namespace: ns, name: name}, hosts, port, nil
	}
	return backendTarget{}, nil, 0, fmt.Errorf("unsupported reference kind: %v", t.Kind)
}

// conflictingPolicy is the policy that wins over p for target t, or ""
// (Istio's btlsIsConflicted): another policy naming the same target and
// section that is older, or as old and first by name.
func conflictingPolicy(p *gw.BackendTLSPolicy, t gw.LocalPolicyTargetReferenceWithSectionName, same []*gw.BackendTLSPolicy) string {
	for _, o := range same {
		if o == p || (o.UID != "" && o.UID == p.UID) {
			continue
		}
		if !slices.ContainsFunc(o.Spec.TargetRefs, func(ot gw.LocalPolicyTargetReferenceWithSectionName) bool {
			return ot.Group == t.Group && ot.Kind == t.Kind && ot.Name == t.Name && deref(ot.SectionName) == deref(t.SectionName)
		}) {
			continue
		}
		if byCreation(&o.ObjectMeta, &p.ObjectMeta) < 0 {
			return o.Name
		}
	}
	return ""
}

// gatewaysByBackend is, for every Service and ServiceEntry a route sends
// to, the Gateways ("namespace/name") that route names as parents, served
// or not (Istio's extractAncestorBackends).
func (c *converter) gatewaysByBackend() map[backendTarget]set {
	out := map[backendTarget]set{}
	add := func(meta metav1.ObjectMeta, parents []gw.ParentReference, backends []gw.BackendObjectReference) {
		var gws []string
		for _, p := range parents {
			if parentKind(p) == KindGateway {
				gws = append(gws, string(derefOr(p.Namespace, gw.Namespace(meta.Namespace)))+"/"+string(p.Name))
			}
		}
		if len(gws) == 0 {
			return
		}
		for _, b := range backends {
			g, k := normalize(b.Group, b.Kind, "", "Service")
			if (g != "" || k != "Service") && (g != "networking.istio.io" || k != "ServiceEntry") {
				continue
			}
			t := backendTarget{kind: k, namespace: string(derefOr(b.Namespace, gw.Namespace(meta.Namespace))), name: string(b.Name)}
			if out[t] == nil {
				out[t] = set{}
			}
			out[t].add(gws...)
		}
	}
	for _, r := range c.in.HTTPRoutes {
		add(r.ObjectMeta, r.Spec.ParentRefs, ruleBackends(r.Spec.Rules, func(rule gw.HTTPRouteRule) []gw.HTTPBackendRef { return rule.BackendRefs },
			func(b gw.HTTPBackendRef) gw.BackendObjectReference { return b.BackendObjectReference }))
	}
	for _, r := range c.in.GRPCRoutes {
		add(r.ObjectMeta, r.Spec.ParentRefs, ruleBackends(r.Spec.Rules, func(rule gw.GRPCRouteRule) []gw.GRPCBackendRef { return rule.BackendRefs },
			func(b gw.GRPCBackendRef) gw.BackendObjectReference { return b.BackendObjectReference }))
	}
	plain := func(b gw.BackendRef) gw.BackendObjectReference { return b.BackendObjectReference }
	for _, r := range c.in.TCPRoutes {
		add(r.ObjectMeta, r.Spec.ParentRefs, ruleBackends(r.Spec.Rules, func(rule gw.TCPRouteRule) []gw.BackendRef { return rule.BackendRefs }, plain))
	}
	for _, r := range c.in.TLSRoutes {
		add(r.ObjectMeta, r.Spec.ParentRefs, ruleBackends(r.Spec.Rules, func(rule gw.TLSRouteRule) []gw.BackendRef { return rule.BackendRefs }, plain))
	}
	return out
}

// ruleBackends is every backendRef of a route's rules.
func ruleBackends[R, B any](rules []R, refs func(R) []B, ref func(B) gw.BackendObjectReference) []gw.BackendObjectReference {
	var out []gw.BackendObjectReference
	for _, rule := range rules {
		for _, b := range refs(rule) {
			out = append(out, ref(b))
		}
	}
	return out
}

// ancestorStatus is one ancestor's entry (Istio's setAncestorStatus),
// keeping the transition times of the conditions it had; the mesh's
// and the Gateways' ancestors both name this control plane (Istio names
// its mesh and gateway controllers apart).
func (c *converter) ancestorStatus(p *gw.BackendTLSPolicy, pr gw.ParentReference, conds map[string]*condition) gw.PolicyAncestorStatus {
	var existing []metav1.Condition
	if i := slices.IndexFunc(p.Status.Ancestors, func(a gw.PolicyAncestorStatus) bool { return sameParentRef(a.AncestorRef, pr) }); i >= 0 {
		existing = p.Status.Ancestors[i].Conditions
	}
	return gw.PolicyAncestorStatus{AncestorRef: pr, ControllerName: c.in.Controllers[0], Conditions: setConditions(p.Generation, existing, conds, c.in.Now)}
}

// mergeAncestors replaces the entries of served controllers with
// incoming, keeping the order and the entries of other controllers, at
// most 16 (Istio's mergeAncestors).
func (c *converter) mergeAncestors(existing, incoming []gw.PolicyAncestorStatus) []gw.PolicyAncestorStatus {
	out := make([]gw.PolicyAncestorStatus, 0, len(existing)+len(incoming))
	incoming = slices.Clone(incoming)
	for _, x := range existing {
		if !c.controllers[x.ControllerName] {
			out = append(out, x)
			continue
		}
		if i := slices.IndexFunc(incoming, func(s gw.PolicyAncestorStatus) bool { return sameParentRef(s.AncestorRef, x.AncestorRef) }); i >= 0 {
			out = append(out, incoming[i])
			incoming = slices.Delete(incoming, i, i+1)
		}
	}
	out = append(out, incoming...)
	return out[:min(len(out), maxPolicyAncestors)]
}

func sameParentRef(a, b gw.ParentReference) bool {
	return deref(a.Group) == deref(b.Group) && deref(a.Kind) == deref(b.Kind) && a.Name == b.Name &&
		deref(a.Namespace) == deref(b.Namespace) && deref(a.SectionName) == deref(b.SectionName) && deref(a.Port) == deref(b.Port)
}

// backendDestinationRules merges the policies by target and host into one
// DestinationRule each (Istio's DestinationRuleCollection): the oldest
// policy's TLS for the whole target, and one port-level TLS per port a
// policy names by its sectionName.
func (c *converter) backendDestinationRules(all []backendPolicy) []*istio.Object {
	type key struct {
		target backendTarget
		host   string
	}
	groups := map[key][]backendPolicy{}
	for _, p := range all {
		k := key{p.target, p.host}
		groups[k] = append(groups[k], p)
	}
	keys := slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return cmp.Or(strings.Compare(a.target.namespace, b.target.namespace), strings.Compare(a.target.name, b.target.name),
			strings.Compare(a.target.kind, b.target.kind), strings.Compare(a.host, b.host))
	})
	out := make([]*istio.Object, 0, len(keys))
	for _, k := range keys {
		pols := groups[k]
		slices.SortStableFunc(pols, func(a, b backendPolicy) int {
			return cmp.Or(a.created.Compare(b.created.Time), strings.Compare(a.source.Namespace, b.source.Namespace), strings.Compare(a.source.Name, b.source.Name))
		})
		spec := &networking.DestinationRule{Host: k.host, TrafficPolicy: &networking.TrafficPolicy{}}
		ports := map[uint32]bool{}
		var parents []string
		for _, p := range pols {
			switch {
			case p.section != "":
				if !ports[p.port] {
					ports[p.port] = true
					spec.TrafficPolicy.PortLevelSettings = append(spec.TrafficPolicy.PortLevelSettings,
						&networking.TrafficPolicy_PortTrafficPolicy{Port: &networking.PortSelector{Number: p.port}, Tls: p.tls})
				}
			case spec.TrafficPolicy.Tls == nil:
				spec.TrafficPolicy.Tls = p.tls
			}
			if name := p.source.Kind + "/" + p.source.Namespace + "." + p.source.Name; !slices.Contains(parents, name) {
				parents = append(parents, name)
			}
		}
		slices.SortStableFunc(spec.TrafficPolicy.PortLevelSettings, func(a, b *networking.TrafficPolicy_PortTrafficPolicy) int {
			return cmp.Compare(a.GetPort().GetNumber(), b.GetPort().GetNumber())
		})
		name := k.target.name + "~" + GeneratedName
		if k.target.kind == "ServiceEntry" {
			name = k.target.name + "~" + strings.ReplaceAll(k.host, ".", "-") + "~" + GeneratedName
		}
		out = append(out, &istio.Object{
			Kind: c.kinds[istio.DestinationRule],
			Meta: istio.Meta{Name: name, Namespace: k.target.namespace, Annotations: map[string]string{AnnotationParents: strings.Join(parents, ",")}},
			Spec: spec,
		})
	}
	return out
}
