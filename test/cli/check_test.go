package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestCheckPassesAHealthyControlPlaneAndNamesWhatBreaks runs flotilla
// check against galley and two discovery replicas as processes: healthy,
// it passes (warning that no injector is subscribed); with an expired
// root in the mesh's trust bundle, and then with galley down, it fails,
// naming what is wrong and how to mend it.
func TestCheckPassesAHealthyControlPlaneAndNamesWhatBreaks(t *testing.T) {
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(90, 10))
	mcp, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	galley := proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcp, "--admin-address", galleyAdmin)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	var xds []string
	for _, name := range []string{"r1", "r2"} {
		addr, admin := proc.FreeAddr(t), proc.FreeAddr(t)
		proc.Start(t, name, filepath.Join(binDir, "flotilla-discovery"), "--galley-address", mcp,
			"--xds-address", addr, "--admin-address", admin, "--replica-name", name)
		proc.WaitReady(t, "http://"+admin+"/readyz")
		xds = append(xds, addr)
	}
	context := func(rootsFile string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "context.yaml")
		if err := debugapi.WriteContext(path, debugapi.Context{DiscoveryAddresses: xds, GalleyAddress: mcp, Plaintext: true, CAFile: rootsFile}); err != nil {
			t.Fatal(err)
		}
		return path
	}
	check := func(ctx string) (int, string) {
		t.Helper()
		code, out, errOut := flotilla(t, ctx, "check", "--timeout", "10s")
		return code, out + errOut
	}

	code, out := check(context(""))
	for _, want := range []string{
		"√ galley ", "answers, 2 subscribers",
		"‼ no injector is subscribed to galley\n    fix: start the injector",
		"√ discovery r1 " + build.Version + " answers at " + xds[0] + ", 0 proxies",
		"√ discovery r1 " + build.Version + " is subscribed to galley and current",
		"√ discovery r2 " + build.Version + " is subscribed to galley and current",
		"- the mesh's roots are not given",
		"- no cluster",
		"√ the control plane runs one version",
		"√ galley serves all the configuration it reads",
		"0 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("a healthy control plane: lacks %q:\n%s", want, out)
		}
	}
	if code != 0 {
		t.Fatalf("a healthy control plane: exit %d\n%s", code, out)
	}

	// A file galley refuses: check fails, naming it and why, until it is
	// mended.
	xdstest.WriteFile(t, dir, "broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}, weight: -5}]}]}\n")
	var refused string
	for range 50 {
		if code, out := check(context("")); code == 1 && strings.Contains(out, "× galley refuses ") {
			refused = out
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(refused, "broken.yaml:") || !strings.Contains(refused, "VirtualService default/broken") || !strings.Contains(refused, "fix: mend it") {
		t.Errorf("a refused file: %s", refused)
	}
	if err := os.Remove(filepath.Join(dir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		code, out := check(context(""))
		if code == 0 {
			break
		}
		if i == 50 {
			t.Fatalf("the refusal outlived the file:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, expiredRoot(t), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = check(context(roots))
	if code != 1 || !strings.Contains(out, `× root "CN=expired root" expired on `) || !strings.Contains(out, "fix: rotate the root") || !strings.Contains(out, "1 checks failed") {
		t.Errorf("an expired root: exit %d\n%s", code, out)
	}

	galley.Kill(t)
	code, out = check(context(""))
	if code != 1 || !strings.Contains(out, "× galley does not answer") || !strings.Contains(out, "fix: is galley running and reachable?") {
		t.Errorf("galley down: exit %d\n%s", code, out)
	}
	// The replicas still answer, serving what galley gave them.
	if !strings.Contains(out, "√ discovery r1 ") || !strings.Contains(out, "√ discovery r2 ") {
		t.Errorf("galley down: the replicas not reported answering:\n%s", out)
	}
}

// expiredRoot is a self-signed root whose validity ended yesterday, as PEM.
func expiredRoot(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "expired root"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
