package kubesource

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestAnUpdateOfTheSameVersionIsUnchanged(t *testing.T) {
	pod := func(rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: rv}}
	}
	for _, c := range []struct {
		name     string
		old, obj any
		want     bool
	}{
		{"a relist or resync: the same version", pod("41"), pod("41"), true},
		{"a real update", pod("41"), pod("42"), false},
		{"no version to compare", pod(""), pod(""), false},
		{"not an object", cache.DeletedFinalStateUnknown{Key: "p"}, pod("41"), false},
	} {
		if got := unchanged(c.old, c.obj); got != c.want {
			t.Errorf("%s: unchanged = %v, want %v", c.name, got, c.want)
		}
	}
}
