package gatewayapi_test

import (
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi/gatewayapitest"
)

// BenchmarkConvert1000HTTPRoutesOn10Gateways is one conversion of the
// whole Gateway API of a cluster with 1,000 HTTPRoutes on 10 Gateways:
// what galley does after each change of any of them (debounced).
func BenchmarkConvert1000HTTPRoutesOn10Gateways(b *testing.B) {
	in := gatewayapitest.Routes(1000, 10)
	in.Now = now
	b.ReportAllocs()
	var objects int
	for b.Loop() {
		objects = len(gatewayapi.Convert(in).Objects)
	}
	b.ReportMetric(float64(objects), "objects")
}
