package xds

import (
	"runtime"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

func pushContext(version uint64) *model.PushContext {
	pc, _ := model.NewStore().Build(model.BuildOptions{}, nil, version)
	return pc
}

func TestAResourceAPushContextSharesIsEncodedOnceForIt(t *testing.T) {
	var e encodings
	pc, other := pushContext(1), pushContext(2)
	shared, own := &clusterv3.Cluster{Name: "shared"}, &clusterv3.Cluster{Name: "own"}
	pc.Share(shared)
	other.Share(shared)
	encoded := func(pc *model.PushContext, m *clusterv3.Cluster) *named {
		t.Helper()
		r, err := e.of(pc).encoded(pc, resourcev3.ClusterType, m)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := encoded(pc, shared)
	if again := encoded(pc, shared); again != first {
		t.Error("a shared resource was encoded again for the same push context")
	}
	if encoded(other, shared) == first {
		t.Error("another push context found the first one's encoding")
	}
	if once := encoded(pc, own); encoded(pc, own) == once {
		t.Error("a resource the push context does not share was kept")
	}
	if first.name != "shared" || first.version == "" {
		t.Errorf("encoded as %q at %q", first.name, first.version)
	}
}

func TestAPushContextsEncodingsGoWithIt(t *testing.T) {
	var e encodings
	func() {
		pc := pushContext(1)
		m := &clusterv3.Cluster{Name: "shared"}
		pc.Share(m)
		if _, err := e.of(pc).encoded(pc, resourcev3.ClusterType, m); err != nil {
			t.Fatal(err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		n := 0
		e.byPC.Range(func(any, any) bool { n++; return true })
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d push contexts' encodings kept after the push context was collected", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
