package cabundle

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/logtest"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	klog.SetSlogLogger(slog.New(slog.DiscardHandler))
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// writes counts the webhook configuration updates the apiserver accepted,
// per client.
type writes struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *writes) count(agent string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[agent]
}

type countingTransport struct {
	next  http.RoundTripper
	agent string
	w     *writes
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && resp.StatusCode < 300 && (r.Method == http.MethodPut || r.Method == http.MethodPatch) &&
		(strings.Contains(r.URL.Path, "/mutatingwebhookconfigurations/") || strings.Contains(r.URL.Path, "/validatingwebhookconfigurations/")) {
		c.w.mu.Lock()
		c.w.n[c.agent]++
		c.w.mu.Unlock()
	}
	return resp, err // a transport passes errors on
}

func clientAs(t *testing.T, agent string, w *writes) kubernetes.Interface {
	t.Helper()
	var wrap func(http.RoundTripper) http.RoundTripper
	if w != nil {
		wrap = func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, agent: agent, w: w} }
	}
	c, err := env.ClientAs(agent, wrap)
	if err != nil {
		t.Fatal(err)
	}
	return c
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
	w := &writes{n: map[string]int{}}
	log := &logtest.Buffer{}
	for _, id := range []string{"injector-a", "injector-b"} {
		c := New(Options{
			Client: clientAs(t, id, w), Log: log.Logger(), Webhook: "flotilla-sidecar-injector", Bundle: current,
			Resync: time.Second,
			Lease:  controller.Lease{Identity: id, Namespace: lease, Name: "cabundle", Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
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
	xdstest.Eventually(t, "the bundle in both webhooks", right)
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
	// Three reconciles (the leader's resyncs) find it right meanwhile.
	reconciled := func() int { return log.Count("caBundle already right", "webhook=flotilla-sidecar-injector") }
	before := reconciled()
	xdstest.EventuallyWithin(t, 60*time.Second, "three reconciles finding it right", func() bool { return reconciled() >= before+3 })
	if got := get().ResourceVersion; got != rv {
		t.Fatalf("written with nothing to change (%s → %s): replicas fight", rv, got)
	}
	// Someone edits it: repaired. The CA changes: rolled out.
	edited := get()
	edited.Webhooks[1].ClientConfig.CABundle = []byte("edited")
	if _, err := cfgs.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the edit repaired", right)
	mu.Lock()
	bundle = []byte("-----BEGIN CERTIFICATE-----\nca-2\n-----END CERTIFICATE-----\n")
	mu.Unlock()
	xdstest.Eventually(t, "the new CA rolled out", right)
	// Three changes were needed (the stale bundle, the edit, the new CA):
	// three accepted writes in all between the two replicas.
	before = reconciled()
	xdstest.EventuallyWithin(t, 60*time.Second, "two reconciles finding it right", func() bool { return reconciled() >= before+2 })
	if a, b := w.count("injector-a"), w.count("injector-b"); a+b != 3 {
		t.Fatalf("accepted writes: injector-a %d, injector-b %d; want 3", a, b)
	}
	t.Logf("accepted caBundle writes: injector-a %d, injector-b %d", w.count("injector-a"), w.count("injector-b"))
}

// TestAValidatingWebhookConfigurationIsKeptToo: galley's validating
// webhook goes through the same controller.
func TestAValidatingWebhookConfigurationIsKeptToo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lease, err := env.CreateNamespace(ctx, "val-lease")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:1/validate"
	none := admregv1.SideEffectClassNone
	cfgs := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := cfgs.Create(ctx, &admregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-validator"},
		Webhooks: []admregv1.ValidatingWebhook{{
			Name: "validation.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{URL: &url, CABundle: []byte("stale")},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bundle := []byte("-----BEGIN CERTIFICATE-----\nvalidator\n-----END CERTIFICATE-----\n")
	w := &writes{n: map[string]int{}}
	log := &logtest.Buffer{}
	c := New(Options{
		Client: clientAs(t, "galley", w), Log: log.Logger(), Kind: Validating, Webhook: "flotilla-validator",
		Bundle: func() []byte { return bundle }, Resync: time.Second,
		Lease: controller.Lease{Identity: "galley", Namespace: lease, Name: "validator", Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
	})
	go func() { _ = c.Run(ctx) }()
	xdstest.Eventually(t, "the bundle", func() bool {
		cfg, err := cfgs.Get(ctx, "flotilla-validator", metav1.GetOptions{})
		return err == nil && bytes.Equal(cfg.Webhooks[0].ClientConfig.CABundle, bundle)
	})
	xdstest.EventuallyWithin(t, 60*time.Second, "two reconciles finding it right", func() bool {
		return log.Count("caBundle already right", "webhook=flotilla-validator") >= 2
	})
	if n := w.count("galley"); n != 1 {
		t.Fatalf("%d accepted writes, want 1", n)
	}
}

// TestTheRevisionsTagWebhooksAreKeptAndNoOtherRevisions: the injector's
// controller keeps its revision's tags' webhooks (Selector) as its own;
// a tag of another revision is that revision's to keep.
func TestTheRevisionsTagWebhooksAreKeptAndNoOtherRevisions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lease, err := env.CreateNamespace(ctx, "tag-lease")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:1/inject/tag/prod"
	none := admregv1.SideEffectClassNone
	cfgs := env.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	for name, rev := range map[string]string{"istio-revision-tag-prod": "canary", "istio-revision-tag-old": "stable"} {
		if _, err := cfgs.Create(ctx, &admregv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"istio.io/tag": strings.TrimPrefix(name, "istio-revision-tag-"), "istio.io/rev": rev}},
			Webhooks: []admregv1.MutatingWebhook{{
				Name: "rev.namespace.injection.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{URL: &url, CABundle: []byte("stale")},
				SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
			}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bundle := []byte("-----BEGIN CERTIFICATE-----\nca-1\n-----END CERTIFICATE-----\n")
	log := &logtest.Buffer{}
	c := New(Options{
		Client: env.Client, Log: log.Logger(), Webhook: "flotilla-sidecar-injector-canary", Selector: "istio.io/tag,istio.io/rev=canary",
		Bundle: func() []byte { return bundle }, Resync: time.Second,
		Lease: controller.Lease{Identity: "injector-canary", Namespace: lease, Name: "cabundle", Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
	})
	go func() { _ = c.Run(ctx) }()
	bundleOf := func(name string) string {
		cfg, err := cfgs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(cfg.Webhooks[0].ClientConfig.CABundle)
	}
	xdstest.Eventually(t, "the tag's bundle kept", func() bool { return bundleOf("istio-revision-tag-prod") == string(bundle) })
	// Two reconciles of its own tag later (resyncs), the other revision's
	// is untouched.
	xdstest.EventuallyWithin(t, 60*time.Second, "two reconciles of its tag finding it right", func() bool {
		return log.Count("caBundle already right", "webhook=istio-revision-tag-prod") >= 2
	})
	if got := bundleOf("istio-revision-tag-old"); got != "stale" {
		t.Fatalf("another revision's tag was written: %q", got)
	}
}
