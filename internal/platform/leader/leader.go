// Package leader runs work on one replica at a time: client-go leader
// election with a Lease, campaigning again whenever leadership is lost,
// and releasing the Lease on shutdown so another replica takes over at
// once. Only components that write cluster state use it.
package leader

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Options configures an election.
type Options struct {
	Client                    kubernetes.Interface
	Log                       *slog.Logger
	Namespace, Name, Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod default to 15s, 10s, 2s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Run campaigns until ctx ends; lead runs while this replica leads, with
// a context that ends when leadership does.
func Run(ctx context.Context, o Options, lead func(ctx context.Context)) error {
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
			Client:     o.Client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
		},
		LeaseDuration: o.LeaseDuration, RenewDeadline: o.RenewDeadline, RetryPeriod: o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            o.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: lead,
			OnStoppedLeading: func() { o.Log.Info("stopped leading", "lease", o.Namespace+"/"+o.Name) },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election %s/%s: %w", o.Namespace, o.Name, err)
	}
	for ctx.Err() == nil {
		le.Run(ctx) // returns when leadership is lost or ctx ends; campaign again
	}
	return nil
}
