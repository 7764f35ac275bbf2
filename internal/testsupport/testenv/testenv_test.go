package testenv

import (
	"path/filepath"
	"testing"
)

func TestAReservedPortIsNotHandedOutAgainUntilItsHolderLetsGo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "24001")
	first, ok := reservePort(path)
	if !ok {
		t.Fatal("a fresh port was not reserved")
	}
	if f, ok := reservePort(path); ok {
		f.Close()
		t.Fatal("a reserved port was reserved again")
	}
	first.Close()
	again, ok := reservePort(path)
	if !ok {
		t.Fatal("a released port was not reserved again")
	}
	again.Close()
}

func TestFreeAddrNeverGivesOneTestTheSamePortTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
}
