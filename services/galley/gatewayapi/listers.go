package gatewayapi

import (
	"cmp"
	"context"
	"slices"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	gwv1client "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/typed/apis/v1"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
)

// listers read the Gateway API kinds the apiserver serves; a kind it
// does not serve has no lister and lists nothing.
type listers struct {
	informers  []cache.SharedIndexInformer
	classes    gwlisters.GatewayClassLister
	gateways   gwlisters.GatewayLister
	http       gwlisters.HTTPRouteLister
	grpc       gwlisters.GRPCRouteLister
	tcp        gwlisters.TCPRouteLister
	tls        gwlisters.TLSRouteLister
	grants     gwlisters.ReferenceGrantLister
	backendTLS gwlisters.BackendTLSPolicyLister
	sets       gwlisters.ListenerSetLister
}

func newListers(f gwinformers.SharedInformerFactory, served []string) *listers {
	v1 := f.Gateway().V1()
	l := &listers{}
	for _, k := range served {
		var inf cache.SharedIndexInformer
		switch k {
		case gatewayapi.KindGatewayClass:
			inf, l.classes = v1.GatewayClasses().Informer(), v1.GatewayClasses().Lister()
		case gatewayapi.KindGateway:
			inf, l.gateways = v1.Gateways().Informer(), v1.Gateways().Lister()
		case gatewayapi.KindHTTPRoute:
			inf, l.http = v1.HTTPRoutes().Informer(), v1.HTTPRoutes().Lister()
		case gatewayapi.KindGRPCRoute:
			inf, l.grpc = v1.GRPCRoutes().Informer(), v1.GRPCRoutes().Lister()
		case gatewayapi.KindTCPRoute:
			inf, l.tcp = v1.TCPRoutes().Informer(), v1.TCPRoutes().Lister()
		case gatewayapi.KindTLSRoute:
			inf, l.tls = v1.TLSRoutes().Informer(), v1.TLSRoutes().Lister()
		case gatewayapi.KindReferenceGrant:
			inf, l.grants = v1.ReferenceGrants().Informer(), v1.ReferenceGrants().Lister()
		case gatewayapi.KindBackendTLSPolicy:
			inf, l.backendTLS = v1.BackendTLSPolicies().Informer(), v1.BackendTLSPolicies().Lister()
		case gatewayapi.KindListenerSet:
			inf, l.sets = v1.ListenerSets().Informer(), v1.ListenerSets().Lister()
		}
		if inf != nil {
			l.informers = append(l.informers, inf)
		}
	}
	return l
}

// fill lists every kind into in, each sorted by namespace and name so
// that the conversion sees the same input in the same order.
func (l *listers) fill(in *gatewayapi.Input) {
	all := labels.Everything()
	if l.classes != nil {
		in.GatewayClasses, _ = l.classes.List(all)
	}
	if l.gateways != nil {
		in.Gateways, _ = l.gateways.List(all)
	}
	if l.http != nil {
		in.HTTPRoutes, _ = l.http.List(all)
	}
	if l.grpc != nil {
		in.GRPCRoutes, _ = l.grpc.List(all)
	}
	if l.tcp != nil {
		in.TCPRoutes, _ = l.tcp.List(all)
	}
	if l.tls != nil {
		in.TLSRoutes, _ = l.tls.List(all)
	}
	if l.grants != nil {
		in.ReferenceGrants, _ = l.grants.List(all)
	}
	if l.backendTLS != nil {
		in.BackendTLSPolicies, _ = l.backendTLS.List(all)
	}
	if l.sets != nil {
		in.ListenerSets, _ = l.sets.List(all)
	}
	sortByKey(in.GatewayClasses)
	sortByKey(in.Gateways)
	sortByKey(in.HTTPRoutes)
	sortByKey(in.GRPCRoutes)
	sortByKey(in.TCPRoutes)
	sortByKey(in.TLSRoutes)
	sortByKey(in.ReferenceGrants)
	sortByKey(in.BackendTLSPolicies)
	sortByKey(in.ListenerSets)
}

func sortByKey[T metav1.Object](objs []T) {
	slices.SortFunc(objs, func(a, b T) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
}

// writeRoute writes a route's status when it differs from the object's.
func (l *listers) writeRoute(ctx context.Context, api gwv1client.GatewayV1Interface, ref gatewayapi.Ref, st *gw.RouteStatus) error {
	opts := metav1.UpdateOptions{}
	switch ref.Kind {
	case gatewayapi.KindHTTPRoute:
		return writeStatus(st, func() (*gw.HTTPRoute, error) { return l.http.HTTPRoutes(ref.Namespace).Get(ref.Name) },
			func(o *gw.HTTPRoute) *gw.RouteStatus { return &o.Status.RouteStatus },
			func(o *gw.HTTPRoute) error {
				_, err := api.HTTPRoutes(ref.Namespace).UpdateStatus(ctx, o, opts)
				return err
			})
	case gatewayapi.KindGRPCRoute:
		return writeStatus(st, func() (*gw.GRPCRoute, error) { return l.grpc.GRPCRoutes(ref.Namespace).Get(ref.Name) },
			func(o *gw.GRPCRoute) *gw.RouteStatus { return &o.Status.RouteStatus },
			func(o *gw.GRPCRoute) error {
				_, err := api.GRPCRoutes(ref.Namespace).UpdateStatus(ctx, o, opts)
				return err
			})
	case gatewayapi.KindTCPRoute:
		return writeStatus(st, func() (*gw.TCPRoute, error) { return l.tcp.TCPRoutes(ref.Namespace).Get(ref.Name) },
			func(o *gw.TCPRoute) *gw.RouteStatus { return &o.Status.RouteStatus },
			func(o *gw.TCPRoute) error {
				_, err := api.TCPRoutes(ref.Namespace).UpdateStatus(ctx, o, opts)
				return err
			})
	case gatewayapi.KindTLSRoute:
		return writeStatus(st, func() (*gw.TLSRoute, error) { return l.tls.TLSRoutes(ref.Namespace).Get(ref.Name) },
			func(o *gw.TLSRoute) *gw.RouteStatus { return &o.Status.RouteStatus },
			func(o *gw.TLSRoute) error {
				_, err := api.TLSRoutes(ref.Namespace).UpdateStatus(ctx, o, opts)
				return err
			})
	}
	return nil
}

// writePolicy writes a policy's status when it differs from the
// object's.
func (l *listers) writePolicy(ctx context.Context, api gwv1client.GatewayV1Interface, ref gatewayapi.Ref, st *gw.PolicyStatus) error {
	if ref.Kind != gatewayapi.KindBackendTLSPolicy || l.backendTLS == nil {
		return nil
	}
	return writeStatus(st, func() (*gw.BackendTLSPolicy, error) {
		return l.backendTLS.BackendTLSPolicies(ref.Namespace).Get(ref.Name)
	},
		func(o *gw.BackendTLSPolicy) *gw.PolicyStatus { return &o.Status },
		func(o *gw.BackendTLSPolicy) error {
			_, err := api.BackendTLSPolicies(ref.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{})
			return err
		})
}

// writeListenerSet writes a ListenerSet's status when it differs from the
// object's.
func (l *listers) writeListenerSet(ctx context.Context, api gwv1client.GatewayV1Interface, ref gatewayapi.Ref, st *gw.ListenerSetStatus) error {
	if l.sets == nil {
		return nil
	}
	return writeStatus(st, func() (*gw.ListenerSet, error) { return l.sets.ListenerSets(ref.Namespace).Get(ref.Name) },
		func(o *gw.ListenerSet) *gw.ListenerSetStatus { return &o.Status },
		func(o *gw.ListenerSet) error {
			_, err := api.ListenerSets(ref.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{})
			return err
		})
}

// writeStatus writes st into a copy of the object get returns, when its
// status differs; an object gone since the conversion is left.
func writeStatus[T interface{ DeepCopy() T }, S any](st *S, get func() (T, error), status func(T) *S, update func(T) error) error {
	obj, err := get()
	if err != nil || apiequality.Semantic.DeepEqual(*status(obj), *st) {
		return nil //nolint:nilerr // gone since the conversion: nothing to write
	}
	obj = obj.DeepCopy()
	*status(obj) = *st
	return update(obj)
}
