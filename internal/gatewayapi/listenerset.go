package gatewayapi

import (
	"fmt"
	"slices"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gw "sigs.k8s.io/gateway-api/apis/v1"
)

// ListenerSets, as Istio 1.32 converts them (gateway_collection.go's
// ListenerSetCollection and gatewaycommon): a ListenerSet adds listeners
// to its parent Gateway when the Gateway's spec.allowedListeners admits
// the set's namespace. Each listener becomes an Istio Gateway in the
// set's namespace, on the parent's Services (AnnotationParentNamespace
// says where they are), and routes bind to it by a parentRef of kind
// ListenerSet; a route naming the Gateway binds only to the Gateway's own
// listeners.

// ListenerSetsByParent indexes ListenerSets by the Gateway their
// parentRef names, oldest first (Istio's merge order,
// orderedMergedListeners). A parentRef of another kind is no Gateway's.
func ListenerSetsByParent(sets []*gw.ListenerSet) map[Ref][]*gw.ListenerSet {
	out := map[Ref][]*gw.ListenerSet{}
	for _, ls := range sets {
		p := ls.Spec.ParentRef
		if g, k := normalize(p.Group, p.Kind, Group, KindGateway); g != Group || k != KindGateway {
			continue
		}
		parent := Ref{Kind: KindGateway, Namespace: string(derefOr(p.Namespace, gw.Namespace(ls.Namespace))), Name: string(p.Name)}
		out[parent] = append(out[parent], ls)
	}
	for _, sets := range out {
		slices.SortFunc(sets, func(a, b *gw.ListenerSet) int { return byCreation(&a.ObjectMeta, &b.ObjectMeta) })
	}
	return out
}

// AllowedListenerSets splits the ListenerSets naming g as parent (of
// byParent, ListenerSetsByParent's index) into those g's
// spec.allowedListeners admits and those it refuses (Istio's
// NamespaceAcceptedByAllowListeners: none unless allowedListeners says
// otherwise), each oldest first. namespaceLabels returns a namespace's
// labels, false when it does not exist. The deployment controller uses it
// too: an admitted set's ports are the Gateway Service's.
func AllowedListenerSets(g *gw.Gateway, byParent map[Ref][]*gw.ListenerSet, namespaceLabels func(string) (map[string]string, bool)) (allowed, refused []*gw.ListenerSet) {
	for _, ls := range byParent[Ref{Kind: KindGateway, Namespace: g.Namespace, Name: g.Name}] {
		if namespaceAllowsListeners(ls.Namespace, g, namespaceLabels) {
			allowed = append(allowed, ls)
		} else {
			refused = append(refused, ls)
		}
	}
	return allowed, refused
}

func namespaceAllowsListeners(ns string, g *gw.Gateway, namespaceLabels func(string) (map[string]string, bool)) bool {
	al := g.Spec.AllowedListeners
	if al == nil || al.Namespaces == nil {
		return false
	}
	switch derefOr(al.Namespaces.From, gw.NamespacesFromSelector) {
	case gw.NamespacesFromAll:
		return true
	case gw.NamespacesFromSame:
		return ns == g.Namespace
	case gw.NamespacesFromSelector:
	default:
		return false
	}
	if al.Namespaces.Selector == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(al.Namespaces.Selector)
	if err != nil {
		return false
	}
	nsLabels, ok := namespaceLabels(ns)
	if !ok {
		return false
	}
	set := labels.Set{}
	for k, v := range nsLabels {
		set[k] = v
	}
	set[corev1.LabelMetadataName] = ns
	return sel.Matches(set)
}

// allowedSets is AllowedListenerSets over the conversion's input.
func (c *converter) allowedSets(g *gw.Gateway) (allowed, refused []*gw.ListenerSet) {
	namespaces := c.in.Cluster.Namespaces()
	return AllowedListenerSets(g, c.setsByParent, func(ns string) (map[string]string, bool) {
		l, ok := namespaces[ns]
		return l, ok
	})
}

// listenerEntryPort is a ListenerSet listener's port (Istio's
// ListenerEntryPortNumber): HTTP's and HTTPS's default when unset.
func listenerEntryPort(l gw.ListenerEntry) (gw.PortNumber, error) {
	if l.Port != 0 {
		return l.Port, nil
	}
	switch l.Protocol {
	case gw.HTTPProtocolType:
		return 80, nil
	case gw.HTTPSProtocolType:
		return 443, nil
	}
	return 0, fmt.Errorf("protocol %v requires a port to be set", l.Protocol)
}

// listenerSetStatus starts a ListenerSet's status from its current one.
func (c *converter) listenerSetStatus(ls *gw.ListenerSet) *gw.ListenerSetStatus {
	st := ls.Status.DeepCopy()
	c.setStatus[Ref{Kind: KindListenerSet, Namespace: ls.Namespace, Name: ls.Name}] = st
	return st
}

// refuseListenerSet reports a set its parent does not allow (Istio's
// ReportNotAllowedListenerSet, its message included).
func (c *converter) refuseListenerSet(ls *gw.ListenerSet) {
	st := c.listenerSetStatus(ls)
	err := &configError{
		reason:  string(gw.ListenerSetReasonNotAllowed),
		message: "The parent Gateway does not allow this reference; check the 'spec.allowedRoutes'",
	}
	st.Listeners = nil
	st.Conditions = setConditions(ls.Generation, st.Conditions, map[string]*condition{
		string(gw.ListenerSetConditionAccepted):   {reason: string(gw.ListenerSetReasonAccepted), err: err},
		string(gw.ListenerSetConditionProgrammed): {reason: string(gw.ListenerSetReasonProgrammed), err: err},
	}, c.in.Now)
}

// listenerSet converts an allowed ListenerSet of g (Istio's
// ListenerSetCollection): its listeners as g's are converted, with the
// set's namespace, labels and ReferenceGrants and g's spec.tls, those
// conflicting with g's or an older set's left out. It returns the servers
// of its programmed listeners, which g's status counts.
func (c *converter) listenerSet(g *gw.Gateway, ls *gw.ListenerSet, conflicts map[Ref]map[gw.SectionName]gw.ListenerConditionReason, gen *generated, gwErr *configError) []*networking.Server {
	st := c.listenerSetStatus(ls)
	ref := Ref{Kind: KindListenerSet, Namespace: ls.Namespace, Name: ls.Name}
	owner := listenerOwner{ref: ref, meta: &ls.ObjectMeta, parent: g}
	statuses := make([]gw.ListenerStatus, len(st.Listeners))
	for i, e := range st.Listeners {
		statuses[i] = gw.ListenerStatus(e)
	}
	var servers, programmedServers []*networking.Server
	valid := 0
	for i, e := range ls.Spec.Listeners {
		port, portErr := listenerEntryPort(e)
		e.Port = port
		l := gw.Listener(e)
		if reason, ok := conflicts[ref][l.Name]; ok {
			statuses = reportListenerConflict(i, l, ls.Generation, statuses, reason, c.in.Now)
			continue
		}
		server, next, programmed := c.listener(owner, statuses, l, i, portErr)
		statuses = next
		if server == nil || portErr != nil {
			// Istio keeps a server on port 0 here, which only makes the
			// set's Programmed condition name port 0.
			continue
		}
		servers = append(servers, server)
		if programmed {
			valid++
			programmedServers = append(programmedServers, server)
			c.addListener(owner, l, server, programmed, gen)
		}
	}
	st.Listeners = make([]gw.ListenerEntryStatus, len(statuses))
	for i, s := range statuses {
		st.Listeners[i] = gw.ListenerEntryStatus(s)
	}
	c.reportListenerSet(g, ls, st, gen.services, servers, gwErr, valid > 0)
	return programmedServers
}

// reportListenerSet sets a ListenerSet's Accepted and Programmed
// conditions and drops the status of listeners no longer in its spec
// (Istio's ReportListenerSetStatus): Accepted only when one of its
// listeners is valid and its parent has no error, Programmed as the
// parent's Services on the set's ports.
func (c *converter) reportListenerSet(g *gw.Gateway, ls *gw.ListenerSet, st *gw.ListenerSetStatus, services []string, servers []*networking.Server, gwErr *configError, listenersValid bool) {
	inst := c.resolveInstances(g.Namespace, services, servers)
	conds := map[string]*condition{
		string(gw.ListenerSetConditionAccepted):   {reason: string(gw.ListenerSetReasonAccepted), message: "Resource accepted"},
		string(gw.ListenerSetConditionProgrammed): {reason: string(gw.ListenerSetReasonProgrammed), message: "Resource programmed"},
	}
	var listenersErr *configError
	if !listenersValid {
		listenersErr = &configError{reason: string(gw.ListenerSetReasonListenersNotValid), message: "None of the ListenerSet's listeners are valid"}
	}
	switch {
	case gwErr != nil:
		conds[string(gw.ListenerSetConditionAccepted)].err = &configError{reason: gwErr.reason, message: "Parent not accepted: " + gwErr.message}
	case listenersErr != nil:
		conds[string(gw.ListenerSetConditionAccepted)].err = listenersErr
	}
	programmedCondition(conds, inst, services)
	if listenersErr != nil {
		conds[string(gw.ListenerSetConditionProgrammed)].err = listenersErr
	}
	st.Listeners = pruneListeners(st.Listeners, ls.Spec.Listeners,
		func(l gw.ListenerEntryStatus) gw.SectionName { return l.Name }, func(l gw.ListenerEntry) gw.SectionName { return l.Name })
	st.Conditions = setConditions(ls.Generation, st.Conditions, conds, c.in.Now)
}
