package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/logtest"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/ca/authority"
	"github.com/flotilla-mesh/flotilla/services/ca/server"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	klog.SetSlogLogger(slog.New(slog.DiscardHandler)) // client-go's leader election logs through klog
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func withToken(tok string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
}

// expiredToken is signed with the apiserver's own service account key, as
// a token of the service account would be, but expired an hour ago.
func expiredToken(t *testing.T, ns, sa string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.Dir(), "certs", "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key.(*ecdsa.PrivateKey)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{
		Issuer: "https://kubernetes.default.svc", Subject: "system:serviceaccount:" + ns + ":" + sa,
		Audience: jwt.Audience{"istio-ca"}, IssuedAt: jwt.NewNumericDate(past.Add(-time.Hour)), Expiry: jwt.NewNumericDate(past),
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTokenReviewAuthenticatesOnlyTheRightAudienceAndLiveAccounts(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "ca-tr")
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"app", "gone"} {
		if err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewTokenReview(env.Client, "istio-ca", noop.NewMeterProvider().Meter("t"), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	good, err := env.CreateToken(ctx, ns, "app", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, ok, err := r.Authenticate(withToken(good))
	if err != nil || !ok || id.Namespace != ns || id.ServiceAccount != "app" {
		t.Fatalf("a good token: %+v %v %v", id, ok, err)
	}
	other, err := env.CreateToken(ctx, ns, "app", []string{"kubernetes"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := env.CreateToken(ctx, ns, "gone", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"another audience":          other,
		"a deleted service account": gone,
		"an expired token":          expiredToken(t, ns, "app"),
		"garbage":                   "not-a-token",
	} {
		if _, ok, err := r.Authenticate(withToken(tok)); !ok || !errors.Is(err, server.ErrUnauthenticated) {
			t.Errorf("%s: %v, want unauthenticated", name, err)
		}
	}
	if _, ok, _ := r.Authenticate(context.Background()); ok {
		t.Error("no token was taken as a credential")
	}
}

// TestACachedReviewLastsFiveMinutesAndNeverPastItsTokensExpiry holds the
// cache to its bounds with an injected clock: a review of a token whose
// account is then deleted is used until five minutes after it was made,
// and not a moment longer (the apiserver refuses the token again); one of
// a token that expires sooner is used until that expiry only. Each bound
// is seen both ways: a cache hit just before it (the deleted account's
// token still accepted), a fresh review just after it. Without either
// bound (entries made to live for ever, or to ignore the token's expiry)
// the token stays accepted and the test fails (testdata/mutations.txt).
func TestACachedReviewLastsFiveMinutesAndNeverPastItsTokensExpiry(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "ca-cache")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	clock := time.Now()
	setClock := func(at time.Time) { mu.Lock(); clock = at; mu.Unlock() }
	r, err := NewTokenReview(env.Client, "istio-ca", noop.NewMeterProvider().Meter("t"), func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	if err != nil {
		t.Fatal(err)
	}
	// refusedOnceReviewed polls until the token is refused: the apiserver
	// keeps its own successful reviews for 10 s of real time, and a review
	// it still passes is cached anew, so each poll moves the clock past
	// the entry the previous one may have made.
	refusedOnceReviewed := func(what, tok string, advance time.Duration) {
		t.Helper()
		xdstest.EventuallyWithin(t, 60*time.Second, what, func() bool {
			_, _, err := r.Authenticate(withToken(tok))
			mu.Lock()
			clock = clock.Add(advance)
			mu.Unlock()
			return errors.Is(err, server.ErrUnauthenticated)
		})
	}

	// Five minutes, for a token that lives an hour.
	if err := env.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	long, err := env.CreateToken(ctx, ns, "app", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	setClock(start)
	if _, _, err := r.Authenticate(withToken(long)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setClock(start.Add(maxAge - time.Second))
	if id, _, err := r.Authenticate(withToken(long)); err != nil || id.ServiceAccount != "app" {
		t.Fatalf("within five minutes the cached review answers, even for a deleted account: %v", err)
	}
	setClock(start.Add(maxAge + time.Second))
	refusedOnceReviewed("the deleted account's token refused five minutes after its review", long, maxAge+time.Second)

	// The token's expiry, when it comes sooner: reviewed two minutes
	// before it (by the clock; the apiserver's is real, so it still takes
	// the token), the entry ends with the token.
	if err := env.CreateServiceAccount(ctx, ns, "short"); err != nil {
		t.Fatal(err)
	}
	short, err := env.CreateToken(ctx, ns, "short", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	exp, ok := server.TokenExpiry(short)
	if !ok {
		t.Fatal("the apiserver's token has no expiry")
	}
	setClock(exp.Add(-2 * time.Minute))
	if _, _, err := r.Authenticate(withToken(short)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "short", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setClock(exp.Add(-time.Second))
	if _, _, err := r.Authenticate(withToken(short)); err != nil {
		t.Fatalf("until the token's expiry the cached review answers: %v", err)
	}
	// Within five minutes of the review, past the token; the clock stays
	// (a review past the token's expiry is not cached).
	setClock(exp.Add(time.Second))
	refusedOnceReviewed("the deleted account's token refused once the token's expiry passed, within five minutes of its review", short, 0)
}

func TestReplicasOnAnEmptyClusterEndWithOneRootAndCacertsWins(t *testing.T) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "ca-root")
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	got := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m, err := Material(ctx, env.Client, ns, authority.ECDSAP256, "cluster.local", time.Now())
			errs[i] = err
			if err == nil {
				got[i] = m.Signer
			}
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if string(got[i]) != string(got[0]) {
			t.Fatalf("replica %d has another root", i)
		}
	}
	rootCert, rootKey, err := authority.NewRoot(authority.ECDSAP256, "corp", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PluggedSecret, Namespace: ns},
		Data:       map[string][]byte{"ca-cert.pem": rootCert, "ca-key.pem": rootKey, "root-cert.pem": rootCert, "cert-chain.pem": nil},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := Material(ctx, env.Client, ns, authority.ECDSAP256, "cluster.local", time.Now())
	if err != nil || !m.Plugged || string(m.Signer) != string(rootCert) {
		t.Fatalf("with cacerts: plugged %v, %v", m != nil && m.Plugged, err)
	}
}

func clientAs(t *testing.T, agent string) kubernetes.Interface {
	t.Helper()
	c, err := env.ClientAs(agent, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTheRootIsPublishedInEveryNamespaceByTheLeaderOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lease, err := env.CreateNamespace(ctx, "ca-lease")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	roots := []byte("-----BEGIN CERTIFICATE-----\nroot-1\n-----END CERTIFICATE-----\n")
	current := func() []byte { mu.Lock(); defer mu.Unlock(); return roots }
	log := &logtest.Buffer{}
	for _, id := range []string{"ca-a", "ca-b"} {
		p := NewRootPublisher(RootPublisherOptions{
			Client: clientAs(t, id), Log: log.Logger(), Roots: current, Resync: time.Second,
			Lease: controller.Lease{Identity: id, Namespace: lease, Name: "roots", Duration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond},
		})
		go func() { _ = p.Run(ctx) }()
	}
	ns, err := env.CreateNamespace(ctx, "ca-app")
	if err != nil {
		t.Fatal(err)
	}
	cms := env.Client.CoreV1().ConfigMaps(ns)
	get := func() *corev1.ConfigMap {
		cm, err := cms.Get(ctx, RootConfigMap, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cm
	}
	xdstest.Eventually(t, "the ConfigMap in a new namespace", func() bool { cm := get(); return cm != nil && cm.Data[RootKey] == string(roots) })

	l, err := env.Client.CoordinationV1().Leases(lease).Get(ctx, "roots", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leader := *l.Spec.HolderIdentity
	for _, mf := range get().ManagedFields {
		if mf.Manager != leader {
			t.Fatalf("written by %s, but %s leads", mf.Manager, leader)
		}
	}

	if err := cms.Delete(ctx, RootConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the ConfigMap back after deletion", func() bool { return get() != nil })

	edited := get()
	edited.Data[RootKey] = "tampered"
	if _, err := cms.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	xdstest.Eventually(t, "the edit repaired", func() bool { cm := get(); return cm != nil && cm.Data[RootKey] == string(roots) })

	// Nothing to change: three reconciles of the namespace later (the
	// resyncs'), no write.
	rv := get().ResourceVersion
	checked := func() int { return log.Count("root certificate already right", "namespace="+ns) }
	before := checked()
	xdstest.EventuallyWithin(t, 60*time.Second, "three reconciles finding the ConfigMap right", func() bool { return checked() >= before+3 })
	if got := get().ResourceVersion; got != rv {
		t.Fatalf("the ConfigMap was written with nothing to change (%s → %s)", rv, got)
	}
	// A new trust bundle reaches it.
	mu.Lock()
	roots = []byte("-----BEGIN CERTIFICATE-----\nroot-2\n-----END CERTIFICATE-----\n")
	mu.Unlock()
	xdstest.Eventually(t, "the new bundle", func() bool { cm := get(); return cm != nil && cm.Data[RootKey] == string(current()) })
}
