package cabundle

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

func clientAs(t *testing.T, agent string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = agent
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 300 {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestTheLeaderKeepsTheBundleAndNobodyWritesWhenItIsRight(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lease, err := env.CreateNamespace(ctx, "inj-lease")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:1/inject"
	none := admregv1.SideEffectClassNone
	hook := func(name string) admregv1.MutatingWebhook {
		return admregv1.MutatingWebhook{
			Name: name, ClientConfig: admregv1.WebhookClientConfig{URL: &url, CABundle: []byte("stale")},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			// Matches nothing: the test only looks at the configuration.
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}
	}
	cfgs := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := cfgs.Create(ctx, &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-sidecar-injector"},
		Webhooks:   []admregv1.MutatingWebhook{hook("a.injection.flotilla.io"), hook("b.injection.flotilla.io")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	bundle := []byte("-----BEGIN CERTIFICATE-----\nca-1\n-----END CERTIFICATE-----\n")
	current := func() []byte { mu.Lock(); defer mu.Unlock(); return bundle }
	for _, id := range []string{"injector-a", "injector-b"} {
		c := New(Options{
			Client: clientAs(t, id), Log: slog.New(slog.DiscardHandler), Webhook: "flotilla-sidecar-injector", Bundle: current,
			Identity: id, LeaseNamespace: lease, LeaseName: "cabundle",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Resync: time.Second,
		})
		go func() { _ = c.Run(ctx) }()
	}
	get := func() *admregv1.MutatingWebhookConfiguration {
		cfg, err := cfgs.Get(ctx, "flotilla-sidecar-injector", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	right := func() bool {
		for _, w := range get().Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, current()) {
				return false
			}
		}
		return true
	}
	eventually(t, "the bundle in both webhooks", right)
	l, err := env.Client.CoordinationV1().Leases(lease).Get(ctx, "cabundle", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	follower := "injector-a"
	if *l.Spec.HolderIdentity == follower {
		follower = "injector-b"
	}
	for _, mf := range get().ManagedFields {
		if mf.Manager == follower {
			t.Fatalf("the follower %s wrote it; %s leads", follower, *l.Spec.HolderIdentity)
		}
	}
	rv := get().ResourceVersion
	time.Sleep(3 * time.Second) // several resyncs by both replicas
	if got := get().ResourceVersion; got != rv {
		t.Fatalf("written with nothing to change (%s → %s): replicas fight", rv, got)
	}
	// Someone edits it: repaired. The CA changes: rolled out.
	edited := get()
	edited.Webhooks[1].ClientConfig.CABundle = []byte("edited")
	if _, err := cfgs.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the edit repaired", right)
	mu.Lock()
	bundle = []byte("-----BEGIN CERTIFICATE-----\nca-2\n-----END CERTIFICATE-----\n")
	mu.Unlock()
	eventually(t, "the new CA rolled out", right)
}
