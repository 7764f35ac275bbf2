package xdstype_test

import (
	"slices"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

func TestTheTypesAreNamedAsIstioctlAndEnvoyNameThem(t *testing.T) {
	var shorts, sections []string
	for _, ty := range xdstype.InStatusOrder() {
		shorts = append(shorts, ty.Short)
		sections = append(sections, ty.Section)
	}
	if want := []string{"CDS", "LDS", "EDS", "RDS", "ECDS", "SDS"}; !slices.Equal(shorts, want) {
		t.Errorf("proxy-status columns %v, want istioctl's %v", shorts, want)
	}
	if want := []string{"Clusters", "Listeners", "Endpoints", "Routes", "ExtensionConfigs", "Secrets"}; !slices.Equal(sections, want) {
		t.Errorf("config dump sections %v, want %v", sections, want)
	}
	if got := xdstype.Short(resourcev3.RouteType); got != "RDS" {
		t.Errorf("Short(RouteType) = %q", got)
	}
	const other = "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration"
	if xdstype.Short(other) != other || xdstype.Section(other) != other {
		t.Error("a type not served is not named by its URL")
	}
	if _, ok := xdstype.Of(other); ok {
		t.Error("a type not served is in the table")
	}
}
