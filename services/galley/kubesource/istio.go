package kubesource

import (
	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// istioInformers returns one informer per served Istio kind, reading the
// storage version (v1); objects written as v1beta1 or v1alpha3 are served
// as v1 by the apiserver.
func istioInformers(f istioinformers.SharedInformerFactory) map[string]cache.SharedIndexInformer {
	net := f.Networking().V1()
	sec := f.Security().V1()
	return map[string]cache.SharedIndexInformer{
		"DestinationRule":       net.DestinationRules().Informer(),
		"Gateway":               net.Gateways().Informer(),
		"ServiceEntry":          net.ServiceEntries().Informer(),
		"Sidecar":               net.Sidecars().Informer(),
		"VirtualService":        net.VirtualServices().Informer(),
		"WorkloadEntry":         net.WorkloadEntries().Informer(),
		"AuthorizationPolicy":   sec.AuthorizationPolicies().Informer(),
		"PeerAuthentication":    sec.PeerAuthentications().Informer(),
		"RequestAuthentication": sec.RequestAuthentications().Informer(),
	}
}

// toObject converts a typed Istio object from an informer. The spec is
// cloned: informer caches are shared and must not be aliased downstream.
func toObject(obj any) (*istio.Object, bool) {
	var kindName string
	var meta *metav1.ObjectMeta
	var spec proto.Message
	switch o := obj.(type) {
	case *networkingv1.DestinationRule:
		kindName, meta, spec = "DestinationRule", &o.ObjectMeta, &o.Spec
	case *networkingv1.Gateway:
		kindName, meta, spec = "Gateway", &o.ObjectMeta, &o.Spec
	case *networkingv1.ServiceEntry:
		kindName, meta, spec = "ServiceEntry", &o.ObjectMeta, &o.Spec
	case *networkingv1.Sidecar:
		kindName, meta, spec = "Sidecar", &o.ObjectMeta, &o.Spec
	case *networkingv1.VirtualService:
		kindName, meta, spec = "VirtualService", &o.ObjectMeta, &o.Spec
	case *networkingv1.WorkloadEntry:
		kindName, meta, spec = "WorkloadEntry", &o.ObjectMeta, &o.Spec
	case *securityv1.AuthorizationPolicy:
		kindName, meta, spec = "AuthorizationPolicy", &o.ObjectMeta, &o.Spec
	case *securityv1.PeerAuthentication:
		kindName, meta, spec = "PeerAuthentication", &o.ObjectMeta, &o.Spec
	case *securityv1.RequestAuthentication:
		kindName, meta, spec = "RequestAuthentication", &o.ObjectMeta, &o.Spec
	default:
		return nil, false
	}
	for _, k := range istio.Kinds() {
		if k.Kind == kindName {
			return &istio.Object{
				Kind: k,
				Meta: istio.Meta{
					Name:            meta.Name,
					Namespace:       meta.Namespace,
					Labels:          meta.Labels,
					Annotations:     meta.Annotations,
					ResourceVersion: meta.ResourceVersion,
					Generation:      meta.Generation,
				},
				Spec: proto.Clone(spec),
			}, true
		}
	}
	return nil, false
}
