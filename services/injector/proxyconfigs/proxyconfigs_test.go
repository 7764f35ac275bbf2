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
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func TestProxyConfigsFromGalleyApplyAndABadOneIsRefused(t *testing.T) {
	s := New("istio-system")
	body, err := anypb.New(&networkingv1beta1.ProxyConfig{Concurrency: wrapperspb.Int32(2)})
	if err != nil {
		t.Fatal(err)
	}
	junk, _ := anypb.New(&meshv1alpha1.MeshConfig{})
	err = s.Apply(s.TypeURLs()[0], []*mcp.Resource{
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
	if err := s.Apply(s.TypeURLs()[0], nil, []string{"istio-system/mesh"}); err != nil {
		t.Fatal(err)
	}
	if got := s.Current().Effective("web", nil, nil); got != nil {
		t.Fatalf("after the removal: %v", got)
	}
	if err := s.Apply("registry.flotilla.io/v1/Namespace", nil, nil); err == nil {
		t.Fatal("another collection accepted")
	}
}

func TestTheMeshsDefaultConfigIsUnderEveryProxyConfigButNotItsDiscoveryAddress(t *testing.T) {
	s := New("istio-system")
	mesh, _ := anypb.New(&meshv1alpha1.MeshConfig{RootNamespace: "mesh-root", DefaultConfig: &meshv1alpha1.ProxyConfig{
		DiscoveryAddress: "discovery.istio-system.svc:15012", Concurrency: wrapperspb.Int32(2),
		ProxyMetadata: map[string]string{"ISTIO_META_DNS_CAPTURE": "true"},
	}})
	if err := s.Apply(registry.MeshConfigTypeURL, []*mcp.Resource{{Name: registry.MeshConfigName, Body: mesh}}, nil); err != nil {
		t.Fatal(err)
	}
	ns, _ := anypb.New(&networkingv1beta1.ProxyConfig{Concurrency: wrapperspb.Int32(4)})
	if err := s.Apply(s.TypeURLs()[0], []*mcp.Resource{{Name: "mesh-root/all", Body: ns}}, nil); err != nil {
		t.Fatal(err)
	}
	pc := s.Current().Effective("web", nil, nil)
	if pc.GetConcurrency().GetValue() != 4 || pc.GetProxyMetadata()["ISTIO_META_DNS_CAPTURE"] != "true" || pc.GetDiscoveryAddress() != "" {
		t.Fatalf("effective %v: want the root namespace's (the mesh's rootNamespace) concurrency over the mesh's metadata, and no discovery address", pc)
	}
	bad, _ := anypb.New(&networkingv1beta1.ProxyConfig{})
	if err := s.Apply(registry.MeshConfigTypeURL, []*mcp.Resource{{Name: registry.MeshConfigName, Body: bad}}, nil); err == nil {
		t.Fatal("a mesh configuration of another type accepted")
	}
	if err := s.Apply(registry.MeshConfigTypeURL, nil, []string{registry.MeshConfigName}); err != nil {
		t.Fatal(err)
	}
	if got := s.Current().Effective("web", nil, nil); got != nil {
		t.Fatalf("without the mesh configuration (mesh-root no longer the root): %v", got)
	}
}
