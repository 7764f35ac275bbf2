package injectconfig

import (
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func resource(t *testing.T, name, template, values string) *mcp.Resource {
	t.Helper()
	r, err := mcp.NewResource(name, &registryv1.InjectionConfig{Revision: name, Template: template, Values: values}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestGalleysConfigurationReplacesTheLocalOneAndABadOneIsRefused(t *testing.T) {
	local, err := inject.ParseConfig("canary", "", "proxyImage: local:1\n")
	if err != nil {
		t.Fatal(err)
	}
	s := New("canary", local, slog.New(slog.DiscardHandler))
	image := func() string { return s.Current().Values.ProxyImage }
	if image() != "local:1" {
		t.Fatalf("before galley: %s", image())
	}
	select {
	case <-s.Synced():
		t.Fatal("synced before galley sent anything")
	default:
	}

	// An empty first response (galley has no ConfigMap) syncs.
	if err := s.Apply(registry.InjectionConfigTypeURL, nil, nil); err != nil {
		t.Fatal(err)
	}
	<-s.Synced()

	// Another revision's configuration is not ours.
	if err := s.Apply(registry.InjectionConfigTypeURL, []*mcp.Resource{resource(t, "default", "", "proxyImage: other:1\n")}, nil); err != nil {
		t.Fatal(err)
	}
	if image() != "local:1" {
		t.Fatalf("took another revision's configuration: %s", image())
	}
	if err := s.Apply(registry.InjectionConfigTypeURL, []*mcp.Resource{resource(t, "canary", "", "proxyImage: galley:2\n")}, nil); err != nil {
		t.Fatal(err)
	}
	if image() != "galley:2" {
		t.Fatalf("galley's configuration not in force: %s", image())
	}

	// Refused with the reason, the one in force stays: values that do not
	// parse, a template that does not, a body of another type, no body.
	notConfig, err := anypb.New(wrapperspb.String("x"))
	if err != nil {
		t.Fatal(err)
	}
	for want, r := range map[string]*mcp.Resource{
		"unknown field":       resource(t, "canary", "", "proxyImg: x\n"),
		"sidecar template":    resource(t, "canary", "{{ .Values", ""),
		"does not decode":     {Name: "canary", Body: notConfig},
		"does not decode too": {Name: "canary"},
	} {
		err := s.Apply(registry.InjectionConfigTypeURL, []*mcp.Resource{r}, nil)
		if err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(want, " too")) {
			t.Errorf("%s: %v", want, err)
		}
		if image() != "galley:2" {
			t.Fatalf("%s: the configuration in force changed to %s", want, image())
		}
	}
	if err := s.Apply(registry.NamespaceTypeURL, nil, nil); err == nil {
		t.Error("another collection was accepted")
	}

	// Withdrawn: back to the local configuration.
	if err := s.Apply(registry.InjectionConfigTypeURL, nil, []string{"default", "canary"}); err != nil {
		t.Fatal(err)
	}
	if image() != "local:1" {
		t.Fatalf("after galley withdrew it: %s", image())
	}
}
