package controlplane

import (
	"slices"
	"strings"
	"testing"
)

func TestEveryAccountButCAsOwnAuthenticatesWithAToken(t *testing.T) {
	got, want := TokenAccounts(), []string{Galley, Discovery, Injector}
	if !slices.Equal(got, want) {
		t.Fatalf("TokenAccounts() = %v, want %v", got, want)
	}
	if all := Accounts(); len(all) != 4 || !slices.Contains(all, CA) {
		t.Fatalf("Accounts() = %v: want the four services, ca's own included", all)
	}
	TokenAccounts()[0] = "changed"
	if Accounts()[0] != Galley {
		t.Fatal("a caller changed the list for everyone")
	}
}

func TestRevisionsNameDiscoveryAndTheInjectorAndNothingElse(t *testing.T) {
	for _, c := range []struct {
		service, revision, want string
	}{
		{Discovery, "", "flotilla-discovery"},
		{Discovery, DefaultRevision, "flotilla-discovery"},
		{Discovery, "canary", "flotilla-discovery-canary"},
		{Injector, "1-28", "flotilla-injector-1-28"},
		{Galley, "canary", "flotilla-galley"}, // shared by every revision
		{CA, "canary", "flotilla-ca"},
	} {
		if got := Name(c.service, c.revision); got != c.want {
			t.Errorf("Name(%s, %q) = %s, want %s", c.service, c.revision, got, c.want)
		}
	}
	for _, c := range []struct {
		name, service, revision string
		ok                      bool
	}{
		{"flotilla-discovery", Discovery, DefaultRevision, true},
		{"flotilla-discovery-canary", Discovery, "canary", true},
		{"flotilla-injector-1-28", Injector, "1-28", true},
		{"flotilla-ca", CA, DefaultRevision, true},
		// Another name for the default revision would be a second
		// identity for the same service.
		{"flotilla-discovery-default", "", "", false},
		{"flotilla-galley-canary", "", "", false},
		{"flotilla-ca-x", "", "", false},
		{"flotilla-discovery-", "", "", false},
		{"flotilla-discovery--x", "", "", false},
		{"flotilla-discovery-Canary", "", "", false},
		{"flotilla-discovery-" + strings.Repeat("a", MaxRevisionLength+1), "", "", false},
		{"default", "", "", false},
		{"flotilla-discoveryx", "", "", false},
	} {
		s, r, ok := Parse(c.name)
		if s != c.service || r != c.revision || ok != c.ok {
			t.Errorf("Parse(%q) = %q, %q, %v; want %q, %q, %v", c.name, s, r, ok, c.service, c.revision, c.ok)
		}
	}
	for rev, ok := range map[string]bool{"canary": true, "1-28-0": true, "a": true, "": false, "-a": false, "a-": false, "a.b": false, "A": false, strings.Repeat("a", MaxRevisionLength): true, strings.Repeat("a", MaxRevisionLength+1): false} {
		if err := CheckRevision(rev); (err == nil) != ok {
			t.Errorf("CheckRevision(%q) = %v", rev, err)
		}
	}
	// The longest revision still makes valid Service names.
	for _, s := range []string{Discovery, Injector} {
		if n := Name(s, strings.Repeat("a", MaxRevisionLength)); len(n) > 63 {
			t.Errorf("%s is %d characters", n, len(n))
		}
	}
}

func TestConfigurationWithoutARevisionIsEveryRevisions(t *testing.T) {
	for _, c := range []struct {
		labels   map[string]string
		revision string
		want     bool
	}{
		{nil, "canary", true},
		{map[string]string{"app": "x"}, DefaultRevision, true},
		{map[string]string{RevisionLabel: "canary"}, "canary", true},
		{map[string]string{RevisionLabel: "canary"}, DefaultRevision, false},
		{map[string]string{RevisionLabel: "default"}, "", true},
		{map[string]string{RevisionLabel: "default"}, "canary", false},
	} {
		if got := InRevision(c.labels, c.revision); got != c.want {
			t.Errorf("InRevision(%v, %q) = %v", c.labels, c.revision, got)
		}
	}
}

func TestDiscoveryIsAlsoReachedByIstiodsNameAndNoOtherServiceIs(t *testing.T) {
	for _, c := range []struct {
		account string
		want    []string
	}{
		{"flotilla-discovery", []string{"flotilla-discovery", "istiod"}},
		{"flotilla-discovery-canary", []string{"flotilla-discovery-canary", "istiod-canary"}},
		{"flotilla-ca", []string{"flotilla-ca"}},
		{"flotilla-galley", []string{"flotilla-galley"}},
		{"flotilla-injector-canary", []string{"flotilla-injector-canary"}},
	} {
		got, ok := ServiceNames(c.account)
		if !ok || !slices.Equal(got, c.want) {
			t.Errorf("ServiceNames(%s) = %v, %v; want %v", c.account, got, ok, c.want)
		}
	}
	for _, account := range []string{"istiod", "default", "flotilla-discovery-default", "greeter"} {
		if got, ok := ServiceNames(account); ok {
			t.Errorf("ServiceNames(%s) = %v: an account not the control plane's has no Service names", account, got)
		}
	}
}
