package analyze

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// gatewayFiles are the Gateway API objects of the files and what of the
// cluster around them the files hold.
type gatewayFiles struct {
	in      gatewayapi.Input
	cluster *gatewayapi.StaticCluster
	// secrets is whether the files hold a Secret: without one, a
	// certificateRef cannot be resolved here, and is not reported;
	// configMaps so for a BackendTLSPolicy's CA ConfigMap.
	secrets, configMaps bool
}

func newGatewayFiles(domainSuffix string) *gatewayFiles {
	c := gatewayapi.NewStaticCluster(domainSuffix)
	return &gatewayFiles{cluster: c, in: gatewayapi.Input{
		Controllers:    []gw.GatewayController{gatewayapi.DefaultController, gatewayapi.IstioController},
		DefaultClasses: map[string]gw.GatewayController{gatewayapi.DefaultClass: gatewayapi.DefaultController, gatewayapi.IstioClass: gatewayapi.IstioController},
		DomainSuffix:   domainSuffix, Cluster: c,
	}}
}

// addObject reads a Gateway API document (its namespace defaulted).
func (g *gatewayFiles) addObject(doc []byte, ns string) error {
	var obj map[string]any
	if err := json.Unmarshal(doc, &obj); err != nil {
		return err
	}
	if m, ok := obj["metadata"].(map[string]any); ok {
		if n, _ := m["namespace"].(string); n == "" {
			m["namespace"] = ns
		}
	}
	doc, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	_, err = g.in.AddYAML(doc)
	return err
}

// addSecret, addConfigMap and addNamespace record what the conversion reads of the
// cluster besides its Services.
func (g *gatewayFiles) addSecret(sec *corev1.Secret) {
	data := maps.Clone(sec.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	for k, v := range sec.StringData {
		data[k] = []byte(v)
	}
	g.cluster.Secrets[sec.Namespace+"/"+sec.Name] = data
	g.secrets = true
}

func (g *gatewayFiles) addConfigMap(cm *corev1.ConfigMap) {
	g.cluster.ConfigMaps[cm.Namespace+"/"+cm.Name] = maps.Clone(cm.Data)
	g.configMaps = true
}

func (g *gatewayFiles) addNamespace(ns *corev1.Namespace) {
	labels := maps.Clone(ns.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["kubernetes.io/metadata.name"] = ns.Name
	g.cluster.NamespaceSet[ns.Name] = labels
}

func (g *gatewayFiles) empty() bool {
	in := g.in
	return len(in.Gateways)+len(in.HTTPRoutes)+len(in.GRPCRoutes)+len(in.TCPRoutes)+len(in.TLSRoutes)+len(in.BackendTLSPolicies)+len(in.ListenerSets) == 0
}

// messages converts the files' Gateway API objects as galley converts
// them and reports what the status galley would write says is wrong:
// Gateways not accepted, listeners in conflict or with refs not
// resolved, routes not attached to a parent or with backends not
// permitted or not found. What depends on the running cluster (whether
// a gateway's pods are ready: Programmed) is not reported; a backend
// not found only when the input holds Services, a certificate only
// when it holds Secrets.
func (g *gatewayFiles) messages(in validation.Input) []validation.Message {
	if g == nil || g.empty() {
		return nil
	}
	for _, o := range in.Objects {
		if o.Kind.Kind == "ServiceEntry" {
			if se, ok := o.Spec.(*networking.ServiceEntry); ok {
				key := o.Meta.Namespace + "/" + o.Meta.Name
				g.cluster.Entries[key] = se.GetHosts()
				g.cluster.EntryPorts[key] = map[string]uint32{}
				for _, p := range se.GetPorts() {
					g.cluster.EntryPorts[key][p.GetName()] = p.GetNumber()
				}
			}
		}
	}
	for _, svc := range in.Services {
		if svc.GetSourceKind() != registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE {
			continue
		}
		s := &gatewayapi.Service{Labels: svc.GetLabels(), ClusterIPs: svc.GetAddresses(), ReadyPorts: map[int32]bool{}, PortNames: map[string]int32{}}
		for _, p := range svc.GetPorts() {
			s.Ports = append(s.Ports, int32(p.GetNumber())) //nolint:gosec // a port number
			s.PortNames[p.GetName()] = int32(p.GetNumber()) //nolint:gosec // a port number
		}
		g.cluster.Services[svc.GetNamespace()+"/"+svc.GetName()] = s
	}
	haveServices := in.HaveServices
	out := gatewayapi.Convert(g.in)
	var msgs []validation.Message
	for _, ref := range slices.SortedFunc(maps.Keys(out.Gateways), compareRefs) {
		st := out.Gateways[ref]
		obj := validation.Ref{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
		if c := apimeta.FindStatusCondition(st.Conditions, string(gw.GatewayConditionAccepted)); c != nil && c.Status == metav1.ConditionFalse {
			msgs = append(msgs, validation.Message{Code: validation.CodeGatewayNotAccepted, Object: obj, Text: c.Reason + ": " + c.Message})
		}
		var names []gw.SectionName
		if spec := g.gateway(ref); spec != nil {
			for _, l := range spec.Spec.Listeners {
				names = append(names, l.Name)
			}
		}
		msgs = append(msgs, g.listenerMessages(obj, st.Listeners, names)...)
	}
	msgs = append(msgs, g.listenerSetMessages(out)...)
	for _, ref := range slices.SortedFunc(maps.Keys(out.Routes), compareRefs) {
		obj := validation.Ref{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
		for _, p := range out.Routes[ref].Parents {
			parent := string(p.ParentRef.Name)
			if p.ParentRef.SectionName != nil {
				parent += "/" + string(*p.ParentRef.SectionName)
			}
			if c := apimeta.FindStatusCondition(p.Conditions, string(gw.RouteConditionAccepted)); c != nil && c.Status == metav1.ConditionFalse {
				msgs = append(msgs, validation.Message{Code: validation.CodeRouteNotAttached, Object: obj, Text: fmt.Sprintf("parent %s: %s: %s", parent, c.Reason, c.Message)})
			}
			c := apimeta.FindStatusCondition(p.Conditions, string(gw.RouteConditionResolvedRefs))
			if c == nil || c.Status != metav1.ConditionFalse {
				continue
			}
			switch gw.RouteConditionReason(c.Reason) {
			case gw.RouteReasonRefNotPermitted:
				msgs = append(msgs, validation.Message{Code: validation.CodeRefNotPermitted, Object: obj, Text: c.Message})
			case gw.RouteReasonBackendNotFound:
				if haveServices {
					msgs = append(msgs, validation.Message{Code: validation.CodeGatewayAPIUnresolved, Object: obj, Text: c.Reason + ": " + c.Message})
				}
			default:
				msgs = append(msgs, validation.Message{Code: validation.CodeGatewayAPIUnresolved, Object: obj, Text: c.Reason + ": " + c.Message})
			}
		}
	}
	return append(msgs, g.policyMessages(out, haveServices)...)
}

// listenerMessages reports a Gateway's or ListenerSet's listeners in
// conflict or with refs not resolved; names are the listeners of its
// spec, in order.
func (g *gatewayFiles) listenerMessages(obj validation.Ref, listeners []gw.ListenerStatus, names []gw.SectionName) []validation.Message {
	var msgs []validation.Message
	for _, ls := range listeners {
		path := ""
		if i := slices.Index(names, ls.Name); i >= 0 {
			path = fmt.Sprintf("spec.listeners[%d]", i)
		}
		if c := apimeta.FindStatusCondition(ls.Conditions, string(gw.ListenerConditionConflicted)); c != nil && c.Status == metav1.ConditionTrue {
			msgs = append(msgs, validation.Message{Code: validation.CodeListenerConflict, Object: obj, Path: path, Text: c.Reason + ": " + c.Message})
		}
		if c := apimeta.FindStatusCondition(ls.Conditions, string(gw.ListenerConditionResolvedRefs)); c != nil && c.Status == metav1.ConditionFalse {
			switch gw.ListenerConditionReason(c.Reason) {
			case gw.ListenerReasonRefNotPermitted:
				msgs = append(msgs, validation.Message{Code: validation.CodeRefNotPermitted, Object: obj, Path: path, Text: c.Message})
			case gw.ListenerReasonInvalidCertificateRef, gw.ListenerReasonInvalidCACertificateRef:
				if g.secrets {
					msgs = append(msgs, validation.Message{Code: validation.CodeGatewayAPIUnresolved, Object: obj, Path: path, Text: c.Reason + ": " + c.Message})
				}
			default:
				msgs = append(msgs, validation.Message{Code: validation.CodeGatewayAPIUnresolved, Object: obj, Path: path, Text: c.Reason + ": " + c.Message})
			}
		}
	}
	return msgs
}

// listenerSetMessages reports the ListenerSets not Accepted and their
// listeners as listenerMessages does, but a set refused by a parent that
// admits namespaces by label when the files do not hold the set's
// Namespace: its labels are not known here.
func (g *gatewayFiles) listenerSetMessages(out *gatewayapi.Output) []validation.Message {
	var msgs []validation.Message
	for _, ref := range slices.SortedFunc(maps.Keys(out.ListenerSets), compareRefs) {
		st := out.ListenerSets[ref]
		obj := validation.Ref{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
		spec := g.listenerSet(ref)
		if c := apimeta.FindStatusCondition(st.Conditions, string(gw.ListenerSetConditionAccepted)); c != nil && c.Status == metav1.ConditionFalse &&
			(c.Reason != string(gw.ListenerSetReasonNotAllowed) || g.namespaceKnownTo(spec)) {
			msgs = append(msgs, validation.Message{Code: validation.CodeGatewayNotAccepted, Object: obj, Text: c.Reason + ": " + c.Message})
		}
		var names []gw.SectionName
		if spec != nil {
			for _, l := range spec.Spec.Listeners {
				names = append(names, l.Name)
			}
		}
		listeners := make([]gw.ListenerStatus, len(st.Listeners))
		for i, l := range st.Listeners {
			listeners[i] = gw.ListenerStatus(l)
		}
		msgs = append(msgs, g.listenerMessages(obj, listeners, names)...)
	}
	return msgs
}

// namespaceKnownTo reports whether a ListenerSet's parent decides on
// what the files hold: it admits namespaces other than by label, or the
// files hold the set's Namespace.
func (g *gatewayFiles) namespaceKnownTo(ls *gw.ListenerSet) bool {
	if ls == nil {
		return false
	}
	if _, ok := g.cluster.NamespaceSet[ls.Namespace]; ok {
		return true
	}
	p := ls.Spec.ParentRef
	parent := g.gateway(gatewayapi.Ref{Kind: gatewayapi.KindGateway, Namespace: string(ptrOr(p.Namespace, gw.Namespace(ls.Namespace))), Name: string(p.Name)})
	if parent == nil || parent.Spec.AllowedListeners == nil || parent.Spec.AllowedListeners.Namespaces == nil {
		return true
	}
	ns := parent.Spec.AllowedListeners.Namespaces
	bySelector := (ns.From == nil || *ns.From == gw.NamespacesFromSelector) && ns.Selector != nil
	return !bySelector
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func (g *gatewayFiles) listenerSet(ref gatewayapi.Ref) *gw.ListenerSet {
	for _, o := range g.in.ListenerSets {
		if o.Namespace == ref.Namespace && o.Name == ref.Name {
			return o
		}
	}
	return nil
}

// policyMessages reports the targets a BackendTLSPolicy is not Accepted
// for (its ancestors other than Gateways, which repeat them), but what
// depends on objects the input does not hold: a target when it holds no
// Service, a CA ConfigMap when it holds no ConfigMap.
func (g *gatewayFiles) policyMessages(out *gatewayapi.Output, haveServices bool) []validation.Message {
	var msgs []validation.Message
	for _, ref := range slices.SortedFunc(maps.Keys(out.Policies), compareRefs) {
		obj := validation.Ref{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
		for _, a := range out.Policies[ref].Ancestors {
			if a.AncestorRef.Kind != nil && *a.AncestorRef.Kind == gatewayapi.KindGateway {
				continue
			}
			c := apimeta.FindStatusCondition(a.Conditions, string(gw.PolicyConditionAccepted))
			if c == nil || c.Status != metav1.ConditionFalse {
				continue
			}
			resolved := apimeta.FindStatusCondition(a.Conditions, string(gw.BackendTLSPolicyConditionResolvedRefs))
			switch {
			case c.Reason == string(gw.PolicyReasonTargetNotFound) && !haveServices:
				continue
			case c.Reason == string(gw.BackendTLSPolicyReasonNoValidCACertificate) && !g.configMaps &&
				(resolved == nil || resolved.Reason != string(gw.BackendTLSPolicyReasonInvalidKind)):
				continue
			}
			target := string(a.AncestorRef.Name)
			if a.AncestorRef.SectionName != nil {
				target += "/" + string(*a.AncestorRef.SectionName)
			}
			msgs = append(msgs, validation.Message{Code: validation.CodePolicyNotAccepted, Object: obj, Text: fmt.Sprintf("target %s: %s: %s", target, c.Reason, c.Message)})
		}
	}
	return msgs
}

func (g *gatewayFiles) gateway(ref gatewayapi.Ref) *gw.Gateway {
	for _, o := range g.in.Gateways {
		if o.Namespace == ref.Namespace && o.Name == ref.Name {
			return o
		}
	}
	return nil
}

func compareRefs(a, b gatewayapi.Ref) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
