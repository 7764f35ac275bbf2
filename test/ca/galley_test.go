package ca_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	admregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestGalleyServesItsWebhookWithACertificateFromCAAndKeepsItsCABundle:
// galley watching the apiserver gets its validating webhook's certificate
// from ca (its Service names, its SPIFFE identity), and its leader puts
// ca's roots into the ValidatingWebhookConfiguration's caBundle. (That the
// apiserver then calls it needs the Service's DNS name, which loopback
// tests do not have; galley's webhook tests cover the call with a
// certificate for 127.0.0.1.)
func TestGalleyServesItsWebhookWithACertificateFromCAAndKeepsItsCABundle(t *testing.T) {
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	system, err := env.CreateNamespace(ctx, "galley-ca")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://127.0.0.1:1/validate"
	none := admregv1.SideEffectClassNone
	if _, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-validator-" + system},
		Webhooks: []admregv1.ValidatingWebhook{{
			Name: "validation.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{URL: &url},
			SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"never": "matches"}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	s := proc.NewSigner(t)
	state := t.TempDir()
	c := startCA(t, state, s, "--system-namespace", system)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(s.Token(t, system, "flotilla-galley")), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	rootsFile := filepath.Join(state, "roots.pem")
	hook, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--kubeconfig", kubeconfig, "--system-namespace", system,
		"--mcp-address", proc.FreeAddr(t), "--admin-address", admin, "--webhook-address", hook,
		"--ca-address", c.addr, "--ca-roots-file", rootsFile, "--token-file", tokenFile, "--webhook-config", "flotilla-validator-"+system)
	proc.WaitReady(t, "http://"+admin+"/readyz")

	pemRoots, err := os.ReadFile(rootsFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	var served *x509.Certificate
	xdstest.Eventually(t, "the webhook's certificate from ca", func() bool {
		conn, err := tls.Dial("tcp", hook, &tls.Config{RootCAs: roots, ServerName: "flotilla-galley." + system + ".svc", MinVersion: tls.VersionTLS12})
		if err != nil {
			return false
		}
		defer conn.Close()
		served = conn.ConnectionState().PeerCertificates[0]
		return true
	})
	if len(served.URIs) != 1 || served.URIs[0].String() != "spiffe://cluster.local/ns/"+system+"/sa/flotilla-galley" {
		t.Fatalf("served %v", served.URIs)
	}
	xdstest.Eventually(t, "ca's roots in the caBundle", func() bool {
		cfg, err := env.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "flotilla-validator-"+system, metav1.GetOptions{})
		return err == nil && bytes.Equal(cfg.Webhooks[0].ClientConfig.CABundle, pemRoots)
	})
}
