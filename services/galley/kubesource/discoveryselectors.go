package kubesource

import (
	"maps"
	"slices"
	"sync"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// The mesh's discoverySelectors, as Istio's discoveryNamespacesFilter:
// when the mesh configuration has any, galley reads the namespaced objects
// (Istio's, Services, EndpointSlices, Pods) of the namespaces whose labels
// one of them matches, and no others; without any, every namespace.
// Kubernetes cannot watch a label-selected set of namespaces, so galley
// watches every namespace and drops what is outside: an object of a
// namespace that stops being selected (its labels, or the selectors,
// changed) is withdrawn, one of a namespace that starts being selected is
// published.

// gate decides which namespaces are discovered, and re-delivers a
// namespace's objects when that changes.
type gate struct {
	mu        sync.Mutex
	selectors []labels.Selector // nil: every namespace
	nsLabels  map[string]map[string]string
	selected  map[string]bool // the namespaces known and selected
	// resyncs re-deliver one namespace's objects to each gated handler.
	resyncs []func(namespace string)
}

func newGate() *gate {
	return &gate{nsLabels: map[string]map[string]string{}, selected: map[string]bool{}}
}

// admits reports whether objects of namespace are read.
func (g *gate) admits(namespace string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.selectors == nil || g.selected[namespace]
}

// matchesLocked reports whether labels are selected by the selectors.
func (g *gate) matchesLocked(l map[string]string) bool {
	return g.selectors == nil || slices.ContainsFunc(g.selectors, func(s labels.Selector) bool { return s.Matches(labels.Set(l)) })
}

// recompute re-decides every known namespace; the ones that changed.
func (g *gate) recomputeLocked() []string {
	var changed []string
	for ns, l := range g.nsLabels {
		now := g.matchesLocked(l)
		if now != g.selected[ns] {
			changed = append(changed, ns)
		}
		if now {
			g.selected[ns] = true
		} else {
			delete(g.selected, ns)
		}
	}
	slices.Sort(changed)
	return changed
}

// setSelectors takes the mesh's discoverySelectors; the namespaces whose
// selection changed. A selector that does not convert selects nothing
// (the mesh configuration was validated: it cannot happen).
func (g *gate) setSelectors(in []*meshv1alpha1.LabelSelector) []string {
	var sels []labels.Selector
	for _, ls := range in {
		k := &metav1.LabelSelector{MatchLabels: ls.GetMatchLabels()}
		for _, e := range ls.GetMatchExpressions() {
			k.MatchExpressions = append(k.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: e.GetKey(), Operator: metav1.LabelSelectorOperator(e.GetOperator()), Values: e.GetValues(),
			})
		}
		s, err := metav1.LabelSelectorAsSelector(k)
		if err != nil {
			s = labels.Nothing()
		}
		sels = append(sels, s)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.selectors = sels
	if len(in) == 0 {
		g.selectors = nil
	}
	return g.recomputeLocked()
}

// namespace records a namespace's labels (nil: deleted); whether its
// selection changed.
func (g *gate) namespace(name string, l map[string]string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	was := g.selectors == nil || g.selected[name]
	if l == nil {
		delete(g.nsLabels, name)
		delete(g.selected, name)
		return false // its objects go with it
	}
	g.nsLabels[name] = maps.Clone(l)
	now := g.matchesLocked(l)
	if now {
		g.selected[name] = true
	} else {
		delete(g.selected, name)
	}
	return was != now
}

// resync re-delivers the objects of the namespaces to every gated
// handler. Call without s.mu.
func (g *gate) resync(namespaces []string) {
	g.mu.Lock()
	fs := slices.Clone(g.resyncs)
	g.mu.Unlock()
	for _, ns := range namespaces {
		for _, f := range fs {
			f(ns)
		}
	}
}

// gated wraps h, an informer's handler: objects of namespaces the gate
// does not admit are not delivered, and one delivered before its
// namespace stopped being admitted is delivered as deleted. inf's objects
// of a namespace are re-delivered when the gate's decision for it
// changes.
func (g *gate) gated(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) cache.ResourceEventHandler {
	var mu sync.Mutex
	passed := map[string]bool{} // namespace/name delivered and not deleted
	key := func(obj any) (string, string, bool) {
		m, ok := unwrap(obj).(metav1.Object)
		if !ok {
			return "", "", false
		}
		return m.GetNamespace() + "/" + m.GetName(), m.GetNamespace(), true
	}
	deliver := func(obj any, update func()) {
		k, ns, ok := key(obj)
		if !ok {
			return
		}
		admitted := g.admits(ns)
		mu.Lock()
		was := passed[k]
		if admitted {
			passed[k] = true
		} else {
			delete(passed, k)
		}
		mu.Unlock()
		switch {
		case admitted:
			update()
		case was:
			h.OnDelete(obj)
		}
	}
	g.mu.Lock()
	g.resyncs = append(g.resyncs, func(ns string) {
		objs, err := inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		if err != nil {
			return
		}
		for _, obj := range objs {
			deliver(obj, func() { h.OnAdd(obj, false) })
		}
	})
	g.mu.Unlock()
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { deliver(obj, func() { h.OnAdd(obj, false) }) },
		UpdateFunc: func(old, obj any) {
			k, _, ok := key(obj)
			mu.Lock()
			was := ok && passed[k]
			mu.Unlock()
			if was {
				deliver(obj, func() { h.OnUpdate(old, obj) })
			} else {
				deliver(obj, func() { h.OnAdd(obj, false) }) // newly admitted: all of it
			}
		},
		DeleteFunc: func(obj any) {
			k, _, ok := key(obj)
			if !ok {
				return
			}
			mu.Lock()
			was := passed[k]
			delete(passed, k)
			mu.Unlock()
			if was {
				h.OnDelete(obj)
			}
		},
	}
}

// namespaceHandler keeps the gate's namespaces current, and
// re-delivers a namespace's objects when its selection changes.
func (g *gate) namespaceHandler() cache.ResourceEventHandler {
	return handler(func(m *metav1.PartialObjectMetadata) {
		if g.namespace(m.Name, nonNil(m.Labels)) {
			g.resync([]string{m.Name})
		}
	}, func(m *metav1.PartialObjectMetadata) {
		g.namespace(m.Name, nil)
	})
}

// meshHandler takes the discoverySelectors of the mesh ConfigMap (an
// invalid one keeps the last valid selectors, as galley keeps the last
// valid mesh configuration).
func (g *gate) meshHandler() cache.ResourceEventHandler {
	return handler(func(cm *corev1.ConfigMap) {
		if cm.Name != MeshConfigMap {
			return
		}
		mesh, err := istio.ParseMeshConfig([]byte(cm.Data["mesh"]))
		if err != nil {
			return
		}
		g.resync(g.setSelectors(mesh.GetDiscoverySelectors()))
	}, func(cm *corev1.ConfigMap) {
		if cm.Name == MeshConfigMap {
			g.resync(g.setSelectors(nil))
		}
	})
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
