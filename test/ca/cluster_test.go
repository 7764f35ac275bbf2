package ca_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// clusterCAs starts n ca processes in cluster mode against the real
// apiserver, in a system namespace of their own, and waits until all
// serve and their root has reached a new namespace, app, which has a
// service account cart. It returns their addresses, app and the root.
func clusterCAs(t *testing.T, n int) (addrs []string, app, roots string) {
	t.Helper()
	ctx := t.Context()
	system, err := env.CreateNamespace(ctx, "flotilla-system")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	var admins []string
	for range n {
		addr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
		proc.Start(t, "ca", filepath.Join(binDir, "flotilla-ca"), "--address", addr, "--admin-address", admin,
			"--kubeconfig", kubeconfig, "--system-namespace", system)
		addrs, admins = append(addrs, addr), append(admins, admin)
	}
	// All serve before any is asked (the first may publish the root
	// before another listens).
	for _, admin := range admins {
		proc.WaitReady(t, "http://"+admin+"/readyz")
	}
	if app, err = env.CreateNamespace(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	if err := env.CreateServiceAccount(ctx, app, "cart"); err != nil {
		t.Fatal(err)
	}
	// The root reaches the new namespace; its trust bundle is what clients
	// use to reach ca.
	xdstest.Eventually(t, "istio-ca-root-cert in the new namespace", func() bool {
		cm, err := env.Client.CoreV1().ConfigMaps(app).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return false
		}
		roots = cm.Data["root-cert.pem"]
		return roots != ""
	})
	return addrs, app, roots
}

// TestInAClusterTokensGetCertificatesAndEveryNamespaceGetsTheRoot runs two
// ca processes in cluster mode against the real apiserver.
func TestInAClusterTokensGetCertificatesAndEveryNamespaceGetsTheRoot(t *testing.T) {
	ctx := context.Background()
	addrs, app, roots := clusterCAs(t, 2)
	tok, err := env.CreateToken(ctx, app, "cart", []string{"istio-ca"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var issuers []string
	for _, addr := range addrs {
		chain, err := request(t, addr, []byte(roots), tok)
		if err != nil {
			t.Fatalf("ca %s: %v", addr, err)
		}
		if len(chain[0].URIs) != 1 || chain[0].URIs[0].String() != "spiffe://cluster.local/ns/"+app+"/sa/cart" {
			t.Fatalf("issued for %v", chain[0].URIs)
		}
		issuers = append(issuers, string(chain[len(chain)-1].Raw))
	}
	if issuers[0] != issuers[1] {
		t.Fatal("the two replicas issue under different roots")
	}
	other, err := env.CreateToken(ctx, app, "cart", []string{"kubernetes"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := request(t, addrs[0], []byte(roots), other); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a token for another audience: %v", err)
	}
	if _, err := request(t, addrs[0], []byte(roots), ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
}
