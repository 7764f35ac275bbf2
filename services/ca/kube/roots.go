package kube

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
)

// Root ConfigMap, as Istio's agents read it.
const (
	RootConfigMap = "istio-ca-root-cert"
	RootKey       = "root-cert.pem"
)

// RootPublisherOptions configures a RootPublisher.
type RootPublisherOptions struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	// Roots returns the current trust bundle (PEM).
	Roots func() []byte
	// Lease elects the one replica that writes.
	Lease controller.Lease
	// Resync re-checks every namespace this often (default 1 minute), so a
	// changed trust bundle reaches them.
	Resync time.Duration
}

// RootPublisher keeps istio-ca-root-cert with the trust bundle in every
// namespace while it leads: it creates the ConfigMap in new namespaces,
// recreates it when deleted, repairs it when edited, and writes nothing
// when it is already right.
type RootPublisher struct {
	o RootPublisherOptions
}

// NewRootPublisher returns a publisher.
func NewRootPublisher(o RootPublisherOptions) *RootPublisher {
	if o.Resync == 0 {
		o.Resync = time.Minute
	}
	o.Log = o.Log.With("component", "root-publisher", "identity", o.Lease.Identity)
	return &RootPublisher{o: o}
}

// Run campaigns for the Lease and publishes while leading, until ctx ends.
func (p *RootPublisher) Run(ctx context.Context) error {
	return controller.Run(ctx, controller.Options{
		Client: p.o.Client, Log: p.o.Log, Lease: p.o.Lease,
		Doing: "publishing the root certificate",
		Lead:  p.lead,
	})
}

// lead watches namespaces and the root ConfigMaps; a key is a namespace
// whose ConfigMap to reconcile.
func (p *RootPublisher) lead(enqueue func(string)) controller.Term {
	nsInf := informers.NewSharedInformerFactory(p.o.Client, p.o.Resync)
	cmInf := informers.NewSharedInformerFactoryWithOptions(p.o.Client, p.o.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", RootConfigMap).String()
		}))
	enqueueNS := func(obj any) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			enqueue(ns.Name)
		}
	}
	enqueueCM := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			enqueue(cm.Namespace)
		}
	}
	nsLister := nsInf.Core().V1().Namespaces().Lister()
	cmLister := cmInf.Core().V1().ConfigMaps().Lister()
	_, _ = nsInf.Core().V1().Namespaces().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueNS, UpdateFunc: func(_, n any) { enqueueNS(n) },
	})
	_, _ = cmInf.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueCM, UpdateFunc: func(_, n any) { enqueueCM(n) }, DeleteFunc: enqueueCM,
	})
	return controller.Term{
		Informers: []informers.SharedInformerFactory{nsInf, cmInf},
		Reconcile: func(ctx context.Context, ns string) error {
			return p.reconcile(ctx, ns, nsLister.Get, func(ns string) (*corev1.ConfigMap, error) {
				return cmLister.ConfigMaps(ns).Get(RootConfigMap)
			})
		},
	}
}

func (p *RootPublisher) reconcile(ctx context.Context, ns string, getNS func(string) (*corev1.Namespace, error), getCM func(string) (*corev1.ConfigMap, error)) error {
	n, err := getNS(ns)
	if apierrors.IsNotFound(err) || (err == nil && n.DeletionTimestamp != nil) {
		return nil // gone or going
	}
	if err != nil {
		return err
	}
	roots := string(p.o.Roots())
	cms := p.o.Client.CoreV1().ConfigMaps(ns)
	cm, err := getCM(ns)
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootConfigMap, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "flotilla-ca"}},
			Data:       map[string]string{RootKey: roots},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // the informer will show it, and the update path repair it if needed
		}
		if err == nil {
			p.o.Log.Info("root certificate published", "namespace", ns)
		}
		return err
	case err != nil:
		return err
	case cm.Data[RootKey] == roots && len(cm.Data) == 1:
		p.o.Log.Debug("root certificate already right", "namespace", ns)
		return nil // no write
	}
	fixed := cm.DeepCopy()
	fixed.Data = map[string]string{RootKey: roots}
	fixed.BinaryData = nil
	_, err = cms.Update(ctx, fixed, metav1.UpdateOptions{})
	if err == nil {
		p.o.Log.Info("root certificate repaired", "namespace", ns)
	}
	return err
}
