package namespaces

import (
	"context"
	"testing"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func TestLabelsFollowTheCollection(t *testing.T) {
	l := New()
	if _, err := l.Get(context.Background(), "shop"); err == nil {
		t.Fatal("answered before galley sent anything")
	}
	r, err := mcp.NewResource("shop", &registryv1.Namespace{Name: "shop", Labels: map[string]string{"istio-injection": "enabled"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(registry.NamespaceTypeURL, []*mcp.Resource{r, {Name: "bad"}}, nil); err == nil {
		t.Fatal("an undecodable namespace was not reported")
	}
	got, err := l.Get(context.Background(), "shop")
	if err != nil || got["istio-injection"] != "enabled" {
		t.Fatalf("%v %v", got, err)
	}
	if err := l.Apply(registry.NamespaceTypeURL, nil, []string{"shop"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(context.Background(), "shop"); err == nil {
		t.Fatal("a removed namespace is still known")
	}
}
