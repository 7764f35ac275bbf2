package proxyconfigs

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1beta1 "istio.io/api/networking/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/mcp"
)

func TestProxyConfigsFromGalleyApplyAndABadOneIsRefused(t *testing.T) {
	s := New("istio-system")
	body, err := anypb.New(&networkingv1beta1.ProxyConfig{Concurrency: wrapperspb.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	junk, _ := anypb.New(&meshv1alpha1.MeshConfig{})
	err = s.Apply(s.TypeURL(), []*mcp.Resource{
		{Name: "istio-system/mesh", Body: body, Created: time.Unix(1, 0)},
		{Name: "no-namespace", Body: body},
		{Name: "shop/wrong-type", Body: junk},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), `"no-namespace"`) || !strings.Contains(err.Error(), `"shop/wrong-type"`) {
		t.Fatalf("Apply: %v, want the two bad resources named", err)
	}
	if got := s.Current().Effective("web", nil, nil).GetConcurrency().GetValue(); got != 2 {
		t.Fatalf("concurrency %d, want the root namespace's 2", got)
	}
	if err := s.Apply(s.TypeURL(), nil, []string{"istio-system/mesh"}); err != nil {
		t.Fatal(err)
	}
	if got := s.Current().Effective("web", nil, nil); got != nil {
		t.Fatalf("after the removal: %v", got)
	}
	if err := s.Apply("registry.flotilla.io/v1/Namespace", nil, nil); err == nil {
		t.Fatal("another collection accepted")
	}
}
