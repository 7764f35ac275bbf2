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
	"k8s.io/client-go/util/workqueue"

	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
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
	// Identity, LeaseNamespace and LeaseName elect the one replica that
	// writes.
	Identity, LeaseNamespace, LeaseName string
	// LeaseDuration, RenewDeadline, RetryPeriod default to 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
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
	o.Log = o.Log.With("component", "root-publisher", "identity", o.Identity)
	return &RootPublisher{o: o}
}

// Run campaigns for the Lease and publishes while leading, until ctx ends.
func (p *RootPublisher) Run(ctx context.Context) error {
	return leader.Run(ctx, leader.Options{ //nolint:wrapcheck // says what failed
		Client: p.o.Client, Log: p.o.Log, Namespace: p.o.LeaseNamespace, Name: p.o.LeaseName, Identity: p.o.Identity,
		LeaseDuration: p.o.LeaseDuration, RenewDeadline: p.o.RenewDeadline, RetryPeriod: p.o.RetryPeriod,
	}, p.lead)
}

// lead watches namespaces and the root ConfigMaps, reconciling each
// namespace that changes, until leadership ends.
func (p *RootPublisher) lead(ctx context.Context) {
	p.o.Log.Info("leading: publishing the root certificate")
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	nsInf := informers.NewSharedInformerFactory(p.o.Client, p.o.Resync)
	cmInf := informers.NewSharedInformerFactoryWithOptions(p.o.Client, p.o.Resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", RootConfigMap).String()
		}))
	enqueueNS := func(obj any) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			q.Add(ns.Name)
		}
	}
	enqueueCM := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			q.Add(cm.Namespace)
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
	nsInf.Start(ctx.Done())
	cmInf.Start(ctx.Done())
	nsInf.WaitForCacheSync(ctx.Done())
	cmInf.WaitForCacheSync(ctx.Done())
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	for {
		ns, shutdown := q.Get()
		if shutdown {
			return
		}
		err := p.reconcile(ctx, ns, nsLister.Get, func(ns string) (*corev1.ConfigMap, error) {
			return cmLister.ConfigMaps(ns).Get(RootConfigMap)
		})
		if err != nil && ctx.Err() == nil {
			p.o.Log.Warn("publishing the root certificate failed; retrying", "namespace", ns, "error", err)
			q.AddRateLimited(ns)
		} else {
			q.Forget(ns)
		}
		q.Done(ns)
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
		return nil // already right: no write
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
