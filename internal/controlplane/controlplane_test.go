package controlplane

import (
	"slices"
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
