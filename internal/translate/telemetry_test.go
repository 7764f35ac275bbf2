package translate

import (
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

func TestProxyStatusSaysWhichTelemetryAProxyGets(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    *model.Proxy
		want string
	}{
		{"Istio's Envoy", &model.Proxy{Type: model.SidecarProxy, IstioTelemetry: true}, "Istio's metrics"},
		{"upstream Envoy", &model.Proxy{Type: model.RouterProxy}, "no Istio metrics"},
		{"proxyless gRPC", &model.Proxy{Type: model.SidecarProxy, Generator: model.GeneratorGRPC, IstioTelemetry: true}, "none"},
	} {
		if got := TelemetryOf(tt.p); !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q, want it to say %q", tt.name, got, tt.want)
		}
	}
}
