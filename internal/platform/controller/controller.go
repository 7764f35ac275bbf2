// Package controller is the shell of Flotilla's controllers that write
// cluster state (the caBundle of webhook configurations, ca's root
// ConfigMap in every namespace): one replica leads (package leader); for
// each term of leadership it builds fresh informers, waits for their
// caches, and reconciles the keys they enqueue one at a time from a
// rate-limited work queue, retrying a failed key with backoff. When
// leadership ends, the informers stop and the queue is dropped: the next
// leader, here or elsewhere, starts from what the apiserver says.
package controller

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"

	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
)

// Term is what one term of leadership runs.
type Term struct {
	// Informers are started and synced before the first reconcile.
	Informers []informers.SharedInformerFactory
	// Reconcile brings one key to its wanted state, reading from the
	// informers' listers. An error is logged and the key retried with
	// backoff; nil forgets the key's failures.
	Reconcile func(ctx context.Context, key string) error
}

// Lease elects the replica that writes.
type Lease struct {
	// Identity names this replica (the pod's name); Namespace and Name
	// locate the Lease.
	Identity, Namespace, Name string
	// Duration, RenewDeadline and RetryPeriod default to 15s, 10s, 2s.
	Duration, RenewDeadline, RetryPeriod time.Duration
}

// Options configures a controller.
type Options struct {
	Client kubernetes.Interface
	Log    *slog.Logger
	Lease  Lease
	// Doing says what the leader does, for the log ("keeping the webhook's
	// caBundle").
	Doing string
	// Lead builds a term: informers whose event handlers call enqueue with
	// the keys to reconcile, and the reconcile function.
	Lead func(enqueue func(key string)) Term
}

// Run campaigns until ctx ends and reconciles while leading.
func Run(ctx context.Context, o Options) error {
	election := leader.Options{
		Client: o.Client, Log: o.Log, Namespace: o.Lease.Namespace, Name: o.Lease.Name, Identity: o.Lease.Identity,
		LeaseDuration: o.Lease.Duration, RenewDeadline: o.Lease.RenewDeadline, RetryPeriod: o.Lease.RetryPeriod,
	}
	return leader.Run(ctx, election, func(ctx context.Context) {
		lead(ctx, o)
	})
}

func lead(ctx context.Context, o Options) {
	log := o.Log
	log.Info("leading", "doing", o.Doing)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	term := o.Lead(q.Add)
	for _, f := range term.Informers {
		f.Start(ctx.Done())
	}
	for _, f := range term.Informers {
		f.WaitForCacheSync(ctx.Done())
	}
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	for {
		key, shutdown := q.Get()
		if shutdown {
			break
		}
		if err := term.Reconcile(ctx, key); err != nil && ctx.Err() == nil {
			log.Warn("reconcile failed; retrying", "doing", o.Doing, "key", key, "error", err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
	for _, f := range term.Informers {
		f.Shutdown()
	}
}
