package kubesource

import (
	"context"
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// The objects of Istio's kinds Flotilla does not serve (istio.NotServed):
// galley watches their metadata, where the cluster has their API (a
// cluster Istio ran in), so that the status writer marks each and
// NotServed lists them: none is ignored without a word.

// notServedInformers adds a metadata informer to f for every kind of
// istio.NotServed whose API the cluster serves; what it watches, for the
// log.
func (s *Source) notServedInformers(ctx context.Context, f metadatainformer.SharedInformerFactory) (watched []string, syncs []cache.InformerSynced, err error) {
	for _, k := range istio.NotServed() {
		gvr, ok := s.served(ctx, k)
		if !ok {
			continue
		}
		inf := f.ForResource(gvr).Informer()
		if _, err := inf.AddEventHandler(s.notServedHandler(k)); err != nil {
			return nil, nil, err
		}
		watched = append(watched, k.Kind)
		syncs = append(syncs, inf.HasSynced)
	}
	return watched, syncs, nil
}

// served finds a version of k the apiserver serves, preferring k's own
// order.
func (s *Source) served(ctx context.Context, k istio.Kind) (schema.GroupVersionResource, bool) {
	if ctx.Err() != nil {
		return schema.GroupVersionResource{}, false
	}
	for _, v := range k.Versions {
		list, err := s.o.Kube.Discovery().ServerResourcesForGroupVersion(k.Group + "/" + v)
		if err != nil {
			continue // not served (or discovery failed: nothing to mark then)
		}
		if slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == k.Plural }) {
			return schema.GroupVersionResource{Group: k.Group, Version: v, Resource: k.Plural}, true
		}
	}
	return schema.GroupVersionResource{}, false
}

func (s *Source) notServedHandler(k istio.Kind) cache.ResourceEventHandler {
	id := func(m *metav1.PartialObjectMetadata) istio.ID {
		return istio.ID{Kind: k.Kind, Name: m.Namespace + "/" + m.Name}
	}
	reason := (&istio.NotServedError{Kind: k}).Error()
	return handler(func(m *metav1.PartialObjectMetadata) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.notServed[id(m)]; !ok {
			s.o.Log.Warn("ignoring an object of an Istio kind Flotilla does not serve", "kind", k.Kind, "object", m.Namespace+"/"+m.Name)
		}
		s.notServed[id(m)] = reason
	}, func(m *metav1.PartialObjectMetadata) {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.notServed, id(m))
	})
}

// NotServed lists the objects in the cluster of Istio kinds Flotilla
// does not serve, with what galley says of them, for the status writer.
func (s *Source) NotServed() map[istio.ID]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.notServed)
}
