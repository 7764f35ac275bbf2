package kubesource

import (
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// istioInformers returns one informer per kind of istio.Kinds() (the one
// list of the kinds Flotilla serves), reading the storage version (v1);
// objects written as v1beta1 or v1alpha3 are served as v1 by the apiserver.
// A kind that istio.io/client-go has no typed informer for is an error.
func istioInformers(f istioinformers.SharedInformerFactory) ([]kindInformer, error) {
	var out []kindInformer
	for _, k := range istio.Kinds() {
		gi, err := f.ForResource(schema.GroupVersionResource{Group: k.Group, Version: k.Version(), Resource: k.Plural})
		if err != nil {
			return nil, fmt.Errorf("informer for %s: %w", k.Kind, err)
		}
		out = append(out, kindInformer{kind: k, informer: gi.Informer()})
	}
	return out, nil
}

type kindInformer struct {
	kind     istio.Kind
	informer cache.SharedIndexInformer
}

// toObject converts a typed Istio object from kind's informer: its
// metadata, and its Spec field (an istio.io/api message, the same type as
// kind.NewSpec's). The spec is cloned: informer caches are shared and must
// not be aliased downstream. Its status is read as Flotilla serves it
// (istio.Object.Status); a ServiceEntry's allocated addresses only
// withAddresses.
func toObject(kind istio.Kind, obj any, withAddresses bool) (*istio.Object, bool) {
	meta, ok := obj.(metav1.Object)
	if !ok {
		return nil, false
	}
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	field := v.Elem().FieldByName("Spec")
	if !field.IsValid() || !field.CanAddr() {
		return nil, false
	}
	spec, ok := field.Addr().Interface().(proto.Message)
	if !ok || spec.ProtoReflect().Descriptor().FullName() != kind.NewSpec().ProtoReflect().Descriptor().FullName() {
		return nil, false
	}
	o := &istio.Object{
		Kind: kind,
		Meta: istio.Meta{
			Name:            meta.GetName(),
			Namespace:       meta.GetNamespace(),
			Labels:          meta.GetLabels(),
			Annotations:     meta.GetAnnotations(),
			ResourceVersion: meta.GetResourceVersion(),
			Generation:      meta.GetGeneration(),
			CreationTime:    meta.GetCreationTimestamp().Time,
		},
		Spec: proto.Clone(spec),
	}
	o.Status = servedStatus(obj, withAddresses)
	return o, true
}

// servedStatus is the part of an object's status Flotilla serves (see
// istio.Object.Status): a ServiceEntry's allocated addresses
// (withAddresses), a WorkloadEntry's Healthy condition.
func servedStatus(obj any, withAddresses bool) proto.Message {
	switch o := obj.(type) {
	case *networkingv1.WorkloadEntry:
		for _, c := range o.Status.GetConditions() {
			if c.GetType() == istio.ConditionHealthy {
				return istio.HealthStatus(c.GetStatus())
			}
		}
	case *networkingv1.ServiceEntry:
		if !withAddresses || len(o.Status.GetAddresses()) == 0 {
			return nil
		}
		out := &networking.ServiceEntryStatus{}
		for _, a := range o.Status.GetAddresses() {
			out.Addresses = append(out.Addresses, &networking.ServiceEntryAddress{Value: a.GetValue(), Host: a.GetHost()})
		}
		return out
	}
	return nil
}
