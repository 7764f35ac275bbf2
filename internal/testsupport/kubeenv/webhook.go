package kubeenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// ServeWebhook serves h as an admission webhook the apiserver can call:
// HTTPS on 127.0.0.1 with admission.Serve (the services' own server) and a
// certificate from a CA made for it, until the test ends. It returns what
// a webhook configuration needs to reach it: the URL of path and the CA
// bundle.
func ServeWebhook(tb testing.TB, h http.Handler, path string) admregv1.WebhookClientConfig {
	tb.Helper()
	addrs, caBundle := serveWebhook(tb, h, testpki.Request{CommonName: "webhook", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, "127.0.0.1:0")
	url := "https://" + addrs[0] + path
	return admregv1.WebhookClientConfig{URL: &url, CABundle: caBundle}
}

// ServeServiceWebhook serves h as the webhook behind Service
// namespace/name, as its pods would: at each of addrs (the pods'
// IP:targetPort, local in RunInNetworkNamespace), with a certificate for
// the Service's DNS name, until the test ends. It returns the CA bundle
// for a webhook configuration that names the Service; the apiserver
// (Options.Cluster) reaches one of its endpoints.
func ServeServiceWebhook(tb testing.TB, h http.Handler, namespace, name string, addrs ...string) []byte {
	tb.Helper()
	host := name + "." + namespace + ".svc"
	_, caBundle := serveWebhook(tb, h, testpki.Request{CommonName: host, DNSNames: []string{host, host + ".cluster.local"}}, addrs...)
	return caBundle
}

// serveWebhook serves h with a certificate for req at every address and
// returns the addresses listened on and the CA bundle.
func serveWebhook(tb testing.TB, h http.Handler, req testpki.Request, addrs ...string) ([]string, []byte) {
	tb.Helper()
	ca, err := testpki.NewCA("webhook CA " + tb.Name())
	if err != nil {
		tb.Fatal(err)
	}
	leaf, err := ca.Issue(req)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	var bound []string
	for _, addr := range addrs {
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		bound = append(bound, lis.Addr().String())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- admission.Serve(ctx, slog.New(slog.DiscardHandler), lis, tlsCfg, h, 5*time.Second) }()
		tb.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Error(err)
			}
		})
	}
	return bound, ca.CertPEM
}

// Webhook is an admission webhook to register with the apiserver, the way
// Flotilla's charts do: failurePolicy Fail, no side effects, a 10 second
// timeout, admission.k8s.io/v1 reviews.
type Webhook struct {
	// Name is the webhook's name, e.g. "validation.flotilla.io".
	Name string
	// Client reaches the webhook (ServeWebhook returns it).
	Client admregv1.WebhookClientConfig
	// Rules and NamespaceSelector say what it is called for.
	Rules             []admregv1.RuleWithOperations
	NamespaceSelector *metav1.LabelSelector
}

// RegisterValidating creates a ValidatingWebhookConfiguration named name
// holding w.
func (e *Env) RegisterValidating(ctx context.Context, name string, w Webhook) error {
	fail, none, timeout := admregv1.Fail, admregv1.SideEffectClassNone, int32(10)
	_, err := e.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admregv1.ValidatingWebhook{{
			Name: w.Name, ClientConfig: w.Client, Rules: w.Rules, NamespaceSelector: w.NamespaceSelector,
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return nil
}

// RegisterMutating creates a MutatingWebhookConfiguration named name
// holding w.
func (e *Env) RegisterMutating(ctx context.Context, name string, w Webhook) error {
	fail, none, timeout := admregv1.Fail, admregv1.SideEffectClassNone, int32(10)
	_, err := e.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admregv1.MutatingWebhook{{
			Name: w.Name, ClientConfig: w.Client, Rules: w.Rules, NamespaceSelector: w.NamespaceSelector,
			FailurePolicy: &fail, SideEffects: &none, TimeoutSeconds: &timeout, AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create MutatingWebhookConfiguration %s: %w", name, err)
	}
	return nil
}
