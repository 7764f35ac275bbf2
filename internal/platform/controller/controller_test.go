package controller

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// TestTheLeaderReconcilesEnqueuedKeysRetriesFailuresAndReleasesTheLease
// runs the shell against a real apiserver: namespaces are the keys, the
// first reconcile of one fails and is retried, and ending the context
// releases the Lease.
func TestTheLeaderReconcilesEnqueuedKeysRetriesFailuresAndReleasesTheLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaseNS, err := env.CreateNamespace(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	flaky, err := env.CreateNamespace(ctx, "flaky")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := map[string]int{}
	done := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		defer close(done)
		err := Run(runCtx, Options{
			Client: env.Client, Log: slog.New(slog.DiscardHandler), Doing: "testing",
			Lease: Lease{Identity: "a", Namespace: leaseNS, Name: "shell", Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
			Lead: func(enqueue func(string)) Term {
				f := informers.NewSharedInformerFactory(env.Client, 0)
				_, _ = f.Core().V1().Namespaces().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
					AddFunc: func(obj any) { enqueue(obj.(*corev1.Namespace).Name) },
				})
				lister := f.Core().V1().Namespaces().Lister()
				return Term{Informers: []informers.SharedInformerFactory{f}, Reconcile: func(_ context.Context, key string) error {
					if _, err := lister.Get(key); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					calls[key]++
					if key == flaky && calls[key] == 1 {
						return errors.New("first attempt fails")
					}
					return nil
				}}
			},
		})
		if err != nil {
			t.Error(err)
		}
	}()
	count := func(key string) int { mu.Lock(); defer mu.Unlock(); return calls[key] }
	xdstest.Eventually(t, "a failed reconcile retried, and every namespace reconciled", func() bool {
		return count(flaky) >= 2 && count(leaseNS) >= 1
	})
	// A namespace made after it is reconciled after it: by then a key
	// wrongly kept after its success would have been retried (its backoff
	// is milliseconds).
	later, err := env.CreateNamespace(ctx, "later")
	if err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "a later namespace reconciled", func() bool { return count(later) >= 1 })
	if n := count(flaky); n != 2 {
		t.Errorf("%s reconciled %d times: a success must forget the key, not retry it", flaky, n)
	}
	stop()
	<-done
	l, err := env.Client.CoordinationV1().Leases(leaseNS).Get(ctx, "shell", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("lease still held by %q after Run returned: want it released", *h)
	}
}
