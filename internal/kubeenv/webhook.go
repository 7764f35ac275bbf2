package kubeenv

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	admregv1 "k8s.io/api/admissionregistration/v1"

	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/testpki"
)

// ServeWebhook serves h as an admission webhook the apiserver can call:
// HTTPS on 127.0.0.1 with admission.Serve (the services' own server) and a
// certificate from a CA made for it, until the test ends. It returns what
// a webhook configuration needs to reach it: the URL of path and the CA
// bundle.
func ServeWebhook(t testing.TB, h http.Handler, path string) admregv1.WebhookClientConfig {
	t.Helper()
	ca, err := testpki.NewCA("webhook CA " + t.Name())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "webhook", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	go func() { done <- admission.Serve(ctx, slog.New(slog.DiscardHandler), lis, tlsCfg, h, 5*time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	url := "https://" + lis.Addr().String() + path
	return admregv1.WebhookClientConfig{URL: &url, CABundle: ca.CertPEM}
}
