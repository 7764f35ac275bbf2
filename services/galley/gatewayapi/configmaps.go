package gatewayapi

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
)

// configMaps are the cluster's ConfigMaps as the Gateway API reads them:
// a Gateway's parametersRef, a listener's CA certificate refs, and the
// class defaults of the system namespace (Istio watches every ConfigMap
// for the same). Only their data is kept: the informer drops the rest of
// each object (managed fields, binary data) before it is stored.
type configMaps struct {
	store cache.Store

	mu sync.Mutex
	// referenced are the "namespace/name"s the last conversion and the
	// last deployment round read, by reader: a change of another
	// ConfigMap starts nothing again.
	referenced map[string]map[string]bool
}

func watchConfigMaps(ctx context.Context, kube kubernetes.Interface, changed func()) (*configMaps, error) {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(func(obj any) (any, error) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			return &corev1.ConfigMap{ObjectMeta: trimMeta(cm), Data: cm.Data}, nil
		}
		return obj, nil
	}))
	inf := f.Core().V1().ConfigMaps().Informer()
	c := &configMaps{store: inf.GetStore(), referenced: map[string]map[string]bool{}}
	kick := func(obj any) {
		if m, err := meta(obj); err == nil && c.matters(m.GetNamespace(), m.GetName(), m.GetLabels()) {
			changed()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kick, DeleteFunc: kick, UpdateFunc: func(_, cur any) { kick(cur) },
	}); err != nil {
		return nil, fmt.Errorf("watch ConfigMaps: %w", err)
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, ctx.Err()
	}
	return c, nil
}

func trimMeta(cm *corev1.ConfigMap) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: cm.Name, Namespace: cm.Namespace, Labels: cm.Labels, ResourceVersion: cm.ResourceVersion,
		CreationTimestamp: cm.CreationTimestamp,
	}
}

// matters reports whether a ConfigMap is one the Gateways read.
func (c *configMaps) matters(ns, name string, labels map[string]string) bool {
	if _, ok := labels[gatewayapi.LabelClassDefaults]; ok {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, read := range c.referenced {
		if read[ns+"/"+name] {
			return true
		}
	}
	return false
}

// reading returns a view of the ConfigMaps that records what is read,
// and done, which makes what was read the ConfigMaps that matter: a
// conversion and a deployment round read every one they depend on.
func (c *configMaps) reading(reader string) (get func(ns, name string) (map[string]string, bool), done func()) {
	read := map[string]bool{}
	get = func(ns, name string) (map[string]string, bool) {
		read[ns+"/"+name] = true
		return c.get(ns, name)
	}
	return get, func() {
		c.mu.Lock()
		c.referenced[reader] = read
		c.mu.Unlock()
	}
}

// get returns a ConfigMap's data.
func (c *configMaps) get(ns, name string) (map[string]string, bool) {
	obj, ok, _ := c.store.GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	return obj.(*corev1.ConfigMap).Data, true
}

// classDefaults returns the data of the oldest of the system namespace's
// ConfigMaps labelled as the class's defaults (Istio's render takes the
// oldest).
func (c *configMaps) classDefaults(systemNamespace, class string) map[string]string {
	var found []*corev1.ConfigMap
	for _, obj := range c.store.List() {
		cm := obj.(*corev1.ConfigMap)
		if cm.Namespace == systemNamespace && cm.Labels[gatewayapi.LabelClassDefaults] == class {
			found = append(found, cm)
		}
	}
	if len(found) == 0 {
		return nil
	}
	slices.SortFunc(found, func(a, b *corev1.ConfigMap) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), strings.Compare(a.Name, b.Name))
	})
	return found[0].Data
}
