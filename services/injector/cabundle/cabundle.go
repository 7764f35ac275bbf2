// Package cabundle keeps the caBundle of the injector's
// MutatingWebhookConfiguration equal to the CA of its serving
// certificate: a leader-elected controller that patches only a webhook
// whose bundle differs, so replicas never fight over it.
package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
)

// Options configures a Controller.
type Options struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	// Webhook is the MutatingWebhookConfiguration's name.
	Webhook string
	// Bundle returns the PEM the webhooks' caBundle must hold.
	Bundle func() []byte
	// Lease.
	Identity, LeaseNamespace, LeaseName       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Resync re-checks this often (default 1 minute), so a changed bundle
	// is rolled out.
	Resync time.Duration
}

// Controller is the caBundle patcher.
type Controller struct{ o Options }

// New returns a controller.
func New(o Options) *Controller {
	if o.Resync == 0 {
		o.Resync = time.Minute
	}
	o.Log = o.Log.With("component", "cabundle", "identity", o.Identity)
	return &Controller{o: o}
}

// Run campaigns for the Lease and, while leading, keeps the bundle.
func (c *Controller) Run(ctx context.Context) error {
	return leader.Run(ctx, leader.Options{ //nolint:wrapcheck // says what failed
		Client: c.o.Client, Log: c.o.Log, Namespace: c.o.LeaseNamespace, Name: c.o.LeaseName, Identity: c.o.Identity,
		LeaseDuration: c.o.LeaseDuration, RenewDeadline: c.o.RenewDeadline, RetryPeriod: c.o.RetryPeriod,
	}, c.lead)
}

func (c *Controller) lead(ctx context.Context) {
	c.o.Log.Info("leading: keeping the webhook's caBundle", "webhook", c.o.Webhook)
	f := informers.NewSharedInformerFactoryWithOptions(c.o.Client, c.o.Resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.o.Webhook).String()
	}))
	inf := f.Admissionregistration().V1().MutatingWebhookConfigurations()
	kick := make(chan struct{}, 1)
	wake := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, n any) { wake(n) }})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	lister := inf.Lister()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		cfg, err := lister.Get(c.o.Webhook)
		if apierrors.IsNotFound(err) {
			continue // not installed (yet): the informer wakes us when it is
		}
		if err == nil {
			err = c.reconcile(ctx, cfg)
		}
		if err != nil && ctx.Err() == nil {
			c.o.Log.Warn("patching the caBundle failed; retrying", "error", err)
			time.AfterFunc(2*time.Second, func() { wake(nil) })
		}
	}
}

// reconcile patches the webhooks whose bundle differs, in one update.
func (c *Controller) reconcile(ctx context.Context, cfg *admregv1.MutatingWebhookConfiguration) error {
	want := c.o.Bundle()
	if len(want) == 0 {
		return nil
	}
	fixed := cfg.DeepCopy()
	changed := 0
	for i := range fixed.Webhooks {
		if !bytes.Equal(fixed.Webhooks[i].ClientConfig.CABundle, want) {
			fixed.Webhooks[i].ClientConfig.CABundle = want
			changed++
		}
	}
	if changed == 0 {
		return nil // right already: no write
	}
	if _, err := c.o.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update %s: %w", c.o.Webhook, err)
	}
	c.o.Log.Info("caBundle patched", "webhook", c.o.Webhook, "webhooks", changed)
	return nil
}
