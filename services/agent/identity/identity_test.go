package identity

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/logtest"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

func issue(t *testing.T, ca *testpki.CA, uri string) *testpki.Leaf {
	t.Helper()
	u, _ := url.Parse(uri)
	l, err := ca.Issue(testpki.Request{CommonName: "w", URIs: []string{u.String()}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTheStateVersionsEveryChangeAndWakesItsReaders(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	if s.Snapshot().Ready() || s.Snapshot().Version != 0 {
		t.Fatal("a new state is not empty")
	}
	changed := s.Changed()
	s.SetRoots(ca.CertPEM)
	select {
	case <-changed:
	default:
		t.Fatal("setting the roots did not wake a reader")
	}
	same := s.Changed()
	s.SetRoots(ca.CertPEM)
	select {
	case <-same:
		t.Fatal("the same roots again counted as a change")
	default:
	}
	leaf := issue(t, ca, "spiffe://cluster.local/ns/shop/sa/cart")
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetCertificate(&cert); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	if !snap.Ready() || snap.Version != 2 || snap.Leaf.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("snapshot after roots and a certificate: version %d, ready %v", snap.Version, snap.Ready())
	}
	if _, err := tls.X509KeyPair(snap.ChainPEM, snap.KeyPEM); err != nil {
		t.Fatalf("the chain and key do not make a pair: %v", err)
	}
	if err := s.SetCertificate(&tls.Certificate{}); err == nil {
		t.Fatal("an empty certificate was held")
	}
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWatchRootsFollowsTheFileAndKeepsTheLastGoodBundle(t *testing.T) {
	first, _ := testpki.NewCA("first")
	second, _ := testpki.NewCA("second")
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	write(t, path, first.CertPEM)
	s := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &logtest.Buffer{}
	go func() { _ = WatchRoots(ctx, s, path, 20*time.Millisecond, log.Logger()) }()
	xdstest.Eventually(t, "the first bundle", func() bool { return string(s.Snapshot().RootsPEM) == string(first.CertPEM) })
	write(t, path, []byte("not a certificate"))
	// The watcher has read the bad file once it says it refused it.
	xdstest.Eventually(t, "the bad bundle refused", func() bool { return log.Has("the trust bundle cannot be read") })
	if string(s.Snapshot().RootsPEM) != string(first.CertPEM) {
		t.Fatal("a bundle without certificates replaced the good one")
	}
	write(t, path, append(append([]byte{}, first.CertPEM...), second.CertPEM...))
	xdstest.Eventually(t, "the rotated bundle with both roots", func() bool { return len(s.Snapshot().RootsPEM) == len(first.CertPEM)+len(second.CertPEM) })
}

func TestMountedCertificatesAreServedAndReloaded(t *testing.T) {
	ca, _ := testpki.NewCA("mesh")
	dir := t.TempDir()
	if Mounted(dir) {
		t.Fatal("an empty directory counts as mounted certificates")
	}
	put := func(l *testpki.Leaf) {
		write(t, filepath.Join(dir, ChainFile), l.CertPEM)
		write(t, filepath.Join(dir, KeyFile), l.KeyPEM)
		write(t, filepath.Join(dir, RootsFile), ca.CertPEM)
	}
	one := issue(t, ca, "spiffe://cluster.local/ns/a/sa/one")
	put(one)
	if !Mounted(dir) {
		t.Fatal("the three files are not seen")
	}
	s := New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &logtest.Buffer{}
	go func() { _ = WatchMounted(ctx, s, dir, 20*time.Millisecond, log.Logger()) }()
	uri := func() string {
		if l := s.Snapshot().Leaf; l != nil {
			return l.URIs[0].String()
		}
		return ""
	}
	xdstest.Eventually(t, "the mounted certificate", func() bool { return uri() == "spiffe://cluster.local/ns/a/sa/one" && s.Snapshot().Ready() })
	// A key that does not match the chain (half of a rotation) is not
	// taken.
	two := issue(t, ca, "spiffe://cluster.local/ns/a/sa/two")
	write(t, filepath.Join(dir, ChainFile), two.CertPEM)
	xdstest.Eventually(t, "the half-rotated files refused", func() bool { return log.Has("the mounted certificates cannot be used") })
	if uri() != "spiffe://cluster.local/ns/a/sa/one" {
		t.Fatal("a chain without its key replaced the certificate")
	}
	put(two)
	xdstest.Eventually(t, "the reloaded certificate", func() bool { return uri() == "spiffe://cluster.local/ns/a/sa/two" })
}
