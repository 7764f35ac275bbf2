// Package cabundle keeps the caBundle of a webhook configuration (the
// injector's MutatingWebhookConfiguration, galley's
// ValidatingWebhookConfiguration) equal to the CA of the webhook's serving
// certificate: a leader-elected controller that writes only when a bundle
// differs, so replicas never fight over it.
package cabundle

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
)

// Kind of webhook configuration.
type Kind int

// The two kinds of webhook configuration.
const (
	Mutating Kind = iota
	Validating
)

func (k Kind) String() string {
	if k == Validating {
		return "ValidatingWebhookConfiguration"
	}
	return "MutatingWebhookConfiguration"
}

// Options configures a Controller.
type Options struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	// Kind and Webhook name the webhook configuration.
	Kind    Kind
	Webhook string
	// Selector, when set, is a label selector of more configurations of
	// Kind kept the same way: a revision's tags' webhooks
	// (istio.io/tag, istio.io/rev=<revision>), as istiod's webhook
	// patcher keeps its revision's.
	Selector string
	// Bundle returns the PEM the webhooks' caBundle must hold.
	Bundle func() []byte
	// Lease elects the replica that writes.
	Lease controller.Lease
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
	o.Log = o.Log.With("component", "cabundle", "identity", o.Lease.Identity)
	return &Controller{o: o}
}

// Run campaigns for the Lease and, while leading, keeps the bundle.
func (c *Controller) Run(ctx context.Context) error {
	return controller.Run(ctx, controller.Options{
		Client: c.o.Client, Log: c.o.Log, Lease: c.o.Lease,
		Doing: "keeping the caBundle of " + c.o.Kind.String() + " " + c.o.Webhook,
		Lead:  c.lead,
	})
}

// lead watches the webhook configuration, and those Selector selects
// (resynced, so a changed bundle file is rolled out), and fixes a
// caBundle that differs.
func (c *Controller) lead(enqueue func(string)) controller.Term {
	named := informers.NewSharedInformerFactoryWithOptions(c.o.Client, c.o.Resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.o.Webhook).String()
	}))
	factories := []informers.SharedInformerFactory{named}
	if c.o.Selector != "" {
		factories = append(factories, informers.NewSharedInformerFactoryWithOptions(c.o.Client, c.o.Resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = c.o.Selector
		})))
	}
	wake := func(obj any) {
		if m, err := meta.Accessor(obj); err == nil {
			enqueue(m.GetName())
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, n any) { wake(n) }}
	var reconcile func(ctx context.Context, name string) error
	if c.o.Kind == Validating {
		var listers []func(string) (*admregv1.ValidatingWebhookConfiguration, error)
		for _, f := range factories {
			inf := f.Admissionregistration().V1().ValidatingWebhookConfigurations()
			_, _ = inf.Informer().AddEventHandler(handler)
			listers = append(listers, inf.Lister().Get)
		}
		reconcile = func(ctx context.Context, name string) error {
			cfg, err := first(listers, name)
			if err != nil {
				return err
			}
			fixed := cfg.DeepCopy()
			if c.fix(clientConfigs(fixed.Webhooks, func(w *admregv1.ValidatingWebhook) *admregv1.WebhookClientConfig { return &w.ClientConfig })) == 0 {
				return c.unchanged(name)
			}
			_, err = c.o.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, fixed, metav1.UpdateOptions{})
			return c.updated(name, err)
		}
	} else {
		var listers []func(string) (*admregv1.MutatingWebhookConfiguration, error)
		for _, f := range factories {
			inf := f.Admissionregistration().V1().MutatingWebhookConfigurations()
			_, _ = inf.Informer().AddEventHandler(handler)
			listers = append(listers, inf.Lister().Get)
		}
		reconcile = func(ctx context.Context, name string) error {
			cfg, err := first(listers, name)
			if err != nil {
				return err
			}
			fixed := cfg.DeepCopy()
			if c.fix(clientConfigs(fixed.Webhooks, func(w *admregv1.MutatingWebhook) *admregv1.WebhookClientConfig { return &w.ClientConfig })) == 0 {
				return c.unchanged(name)
			}
			_, err = c.o.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, fixed, metav1.UpdateOptions{})
			return c.updated(name, err)
		}
	}
	return controller.Term{
		Informers: factories,
		Reconcile: func(ctx context.Context, name string) error {
			if err := reconcile(ctx, name); !apierrors.IsNotFound(err) {
				return err
			}
			return nil // not installed (yet), or removed: the informer wakes us when it is
		},
	}
}

// first is the configuration of that name in the first lister holding it.
func first[T any](listers []func(string) (T, error), name string) (T, error) {
	var zero T
	err := error(apierrors.NewNotFound(admregv1.Resource("webhookconfiguration"), name))
	for _, get := range listers {
		v, gerr := get(name)
		if gerr == nil {
			return v, nil
		}
		if !apierrors.IsNotFound(gerr) {
			err = gerr
		}
	}
	return zero, err
}

func clientConfigs[W any](webhooks []W, cc func(*W) *admregv1.WebhookClientConfig) []*admregv1.WebhookClientConfig {
	out := make([]*admregv1.WebhookClientConfig, len(webhooks))
	for i := range webhooks {
		out[i] = cc(&webhooks[i])
	}
	return out
}

// fix sets every differing bundle and says how many it changed; none when
// there is no bundle to set.
func (c *Controller) fix(configs []*admregv1.WebhookClientConfig) int {
	want := c.o.Bundle()
	if len(want) == 0 {
		return 0
	}
	changed := 0
	for _, cc := range configs {
		if !bytes.Equal(cc.CABundle, want) {
			cc.CABundle = want
			changed++
		}
	}
	return changed
}

// unchanged is a reconcile that found nothing to write.
func (c *Controller) unchanged(name string) error {
	c.o.Log.Debug("caBundle already right", "kind", c.o.Kind.String(), "webhook", name)
	return nil
}

func (c *Controller) updated(name string, err error) error {
	if err != nil {
		return fmt.Errorf("update %s %s: %w", c.o.Kind, name, err)
	}
	c.o.Log.Info("caBundle patched", "kind", c.o.Kind.String(), "webhook", name)
	return nil
}
