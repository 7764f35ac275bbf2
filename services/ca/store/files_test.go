package store

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestReplicasStartingTogetherConvergeOnOneRoot(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	got := make([]*Material, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = Dir(dir, authority.ECDSAP256, "cluster.local", now) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if string(got[i].Signer) != string(got[0].Signer) || string(got[i].Key) != string(got[0].Key) {
			t.Fatalf("replica %d has another root", i)
		}
	}
	if _, err := authority.New(got[0].Signer, got[0].Key, got[0].Chain, got[0].Roots, authority.Options{}, now); err != nil {
		t.Fatalf("the stored root does not make an authority: %v", err)
	}
	// A restart loads the same root.
	again, err := Dir(dir, authority.ECDSAP256, "cluster.local", now)
	if err != nil || string(again.Signer) != string(got[0].Signer) {
		t.Fatalf("after a restart: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, SelfSigned)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("root file mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
}

func TestAPluggedInCAWinsAndExtraRootsAreTrusted(t *testing.T) {
	dir := t.TempDir()
	rootCert, rootKey, err := authority.NewRoot(authority.ECDSAP256, "plugged", now)
	if err != nil {
		t.Fatal(err)
	}
	oldRoot, _, err := authority.NewRoot(authority.ECDSAP256, "old", now)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{PluggedCert: rootCert, PluggedKey: rootKey, PluggedChain: nil, PluggedRoot: rootCert, ExtraRoots: oldRoot} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := Dir(dir, authority.ECDSAP256, "cluster.local", now)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Plugged || string(m.Signer) != string(rootCert) {
		t.Fatal("the plugged-in CA was not used")
	}
	a, err := authority.New(m.Signer, m.Key, m.Chain, m.Roots, authority.Options{}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(a.RootsPEM()); got != string(rootCert)+string(oldRoot) {
		t.Fatal("the trust bundle lacks the extra root")
	}
	if _, err := os.Stat(filepath.Join(dir, SelfSigned)); err == nil {
		t.Fatal("a self-signed root was created beside the plugged-in CA")
	}
	if err := os.Remove(filepath.Join(dir, PluggedKey)); err != nil {
		t.Fatal(err)
	}
	if _, err := Dir(dir, authority.ECDSAP256, "cluster.local", now); err == nil {
		t.Fatal("a plugged-in CA without its key was accepted")
	}
}
