package mcp

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

type recorded struct{ got []string }

func (r *recorded) Apply(typeURL string, updated []*Resource, removed []string) error {
	for _, u := range updated {
		r.got = append(r.got, fmt.Sprintf("%s +%s@%s", typeURL, u.Name, u.Version))
	}
	for _, n := range removed {
		r.got = append(r.got, typeURL+" -"+n)
	}
	if len(updated) == 0 && len(removed) == 0 {
		r.got = append(r.got, typeURL+" (empty)")
	}
	return nil
}

func res(t *testing.T, name, value string) *Resource {
	t.Helper()
	r, err := NewResource(name, wrapperspb.String(value), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLocalHandsOnOnlyWhatChangedWithContentVersions(t *testing.T) {
	h := &recorded{}
	l := NewLocal(h, []string{"a", "b"})
	if n, err := l.Update("a", []*Resource{res(t, "x", "1")}, []string{"never-seen"}); err != nil || n != 1 {
		t.Fatalf("first update: %d, %v", n, err)
	}
	if n, err := l.Update("a", []*Resource{res(t, "x", "1")}, nil); err != nil || n != 0 {
		t.Fatalf("same content again: %d, %v", n, err)
	}
	if _, err := l.Update("a", []*Resource{res(t, "x", "2")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Update("a", nil, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if len(h.got) != 3 || h.got[2] != "a -x" || h.got[0] == h.got[1] {
		t.Fatalf("handed on %v; want x once per content, then its removal", h.got)
	}
	// Equal content gets an equal version in another Local, as in another
	// galley replica.
	srv := &recorded{}
	l2 := NewLocal(srv, []string{"a"})
	if _, err := l2.Update("a", []*Resource{res(t, "x", "1")}, nil); err != nil {
		t.Fatal(err)
	}
	if srv.got[0] != h.got[0] {
		t.Fatalf("equal content got versions %q and %q", srv.got[0], h.got[0])
	}
}

func TestLocalCompleteHandsOnEveryUntouchedCollectionEmptyOnce(t *testing.T) {
	h := &recorded{}
	l := NewLocal(h, []string{"a", "b", "c"})
	if _, err := l.Update("b", []*Resource{res(t, "x", "1")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(); err != nil {
		t.Fatal(err)
	}
	want := []string{"a (empty)", "c (empty)"}
	if got := slices.DeleteFunc(slices.Clone(h.got), func(s string) bool { return s[0] == 'b' }); !slices.Equal(got, want) {
		t.Fatalf("handed on %v, want %v", got, want)
	}
}

func TestLocalRefusesAnUnknownCollectionAndReturnsTheHandlersError(t *testing.T) {
	l := NewLocal(HandlerFunc(func(string, []*Resource, []string) error { return errors.New("nack") }), []string{"a"})
	if _, err := l.Update("z", nil, nil); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("unknown collection: %v", err)
	}
	if _, err := l.Update("a", []*Resource{res(t, "x", "1")}, nil); err == nil || err.Error() != "apply a: nack" {
		t.Fatalf("handler error: %v", err)
	}
}
