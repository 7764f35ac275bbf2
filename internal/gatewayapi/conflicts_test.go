package gatewayapi

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
)

// listenersDistinct is Istio's (gatewaycommon's listenersDistinct): the
// definition listenerConflicts indexes.
func listenersDistinct(a, b gw.Listener) bool {
	switch {
	case a.Port != b.Port:
		return true
	case isTCPUDP(a.Protocol) && isHTTPLike(b.Protocol), isHTTPLike(a.Protocol) && isTCPUDP(b.Protocol):
		return false
	case isTCPUDP(a.Protocol) && isTCPUDP(b.Protocol):
		return false
	case isHTTPLike(a.Protocol) && isHTTPLike(b.Protocol):
		return listenerHost(a) != listenerHost(b)
	}
	return a.Protocol != b.Protocol
}

// naiveConflicts is Istio's ComputeGatewayListenerConflicts as written:
// each listener against every accepted one before it.
func naiveConflicts(all []Ref, ls []gw.Listener) map[Ref]map[gw.SectionName]gw.ListenerConditionReason {
	out := map[Ref]map[gw.SectionName]gw.ListenerConditionReason{}
	var accepted []gw.Listener
	for n, l := range ls {
		i := slices.IndexFunc(accepted, func(p gw.Listener) bool { return !listenersDistinct(l, p) })
		if i < 0 {
			accepted = append(accepted, l)
			continue
		}
		p := accepted[i]
		reason := gw.ListenerReasonHostnameConflict
		if l.Protocol != p.Protocol || (isTCPUDP(l.Protocol) && isTCPUDP(p.Protocol)) {
			reason = gw.ListenerReasonProtocolConflict
		}
		if out[all[n]] == nil {
			out[all[n]] = map[gw.SectionName]gw.ListenerConditionReason{}
		}
		out[all[n]][l.Name] = reason
	}
	return out
}

// The conflicts between a Gateway's and its ListenerSets' listeners,
// found by port and hostname, are those Istio's listener-by-listener
// comparison finds, reason included, on random listeners crowded on few
// ports, protocols and hostnames.
func TestListenerConflictsAreIstiosComparisonIndexed(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	protocols := []gw.ProtocolType{gw.HTTPProtocolType, gw.HTTPSProtocolType, gw.TLSProtocolType, gw.TCPProtocolType, gw.UDPProtocolType, "HBONE", "example.com/custom"}
	hosts := []string{"", "a.example.com", "*.example.com", "b.example.com"}
	listener := func(name string) gw.Listener {
		l := gw.Listener{Name: gw.SectionName(name), Port: gw.PortNumber(80 + r.IntN(3)), Protocol: protocols[r.IntN(len(protocols))]}
		if h := hosts[r.IntN(len(hosts))]; h != "" {
			l.Hostname = new(gw.Hostname(h))
		}
		return l
	}
	for round := range 500 {
		g := &gw.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "g", Namespace: "ns"}}
		var owners []Ref
		var flat []gw.Listener
		for i := range r.IntN(6) {
			l := listener(fmt.Sprintf("g%d", i))
			g.Spec.Listeners = append(g.Spec.Listeners, l)
			owners, flat = append(owners, Ref{Kind: KindGateway, Namespace: "ns", Name: "g"}), append(flat, l)
		}
		var sets []*gw.ListenerSet
		for s := range r.IntN(4) {
			ls := &gw.ListenerSet{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", s), Namespace: "ns"}}
			for i := range r.IntN(5) {
				l := listener(fmt.Sprintf("l%d", i))
				ls.Spec.Listeners = append(ls.Spec.Listeners, gw.ListenerEntry(l))
				owners, flat = append(owners, Ref{Kind: KindListenerSet, Namespace: "ns", Name: ls.Name}), append(flat, l)
			}
			sets = append(sets, ls)
		}
		got, want := listenerConflicts(g, sets), naiveConflicts(owners, flat)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: listeners %v: got %v, want %v", round, flat, got, want)
		}
	}
}
