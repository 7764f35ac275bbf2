package registry

import (
	"testing"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

func TestKubernetesPortProtocolFollowsIstiosRules(t *testing.T) {
	tests := []struct {
		name, appProtocol, transport string
		want                         registryv1.Protocol
	}{
		{"http", "", "TCP", registryv1.Protocol_PROTOCOL_HTTP},
		{"http-web", "", "TCP", registryv1.Protocol_PROTOCOL_HTTP},
		{"http2-api", "", "", registryv1.Protocol_PROTOCOL_HTTP2},
		{"grpc", "", "TCP", registryv1.Protocol_PROTOCOL_GRPC},
		{"grpc-web", "", "TCP", registryv1.Protocol_PROTOCOL_HTTP},
		{"grpc-admin", "", "TCP", registryv1.Protocol_PROTOCOL_GRPC},
		{"tcp-db", "", "TCP", registryv1.Protocol_PROTOCOL_TCP},
		{"mongo", "", "TCP", registryv1.Protocol_PROTOCOL_MONGO},
		{"https", "", "TCP", registryv1.Protocol_PROTOCOL_HTTPS},
		{"web", "", "TCP", registryv1.Protocol_PROTOCOL_UNSPECIFIED},
		{"", "", "TCP", registryv1.Protocol_PROTOCOL_UNSPECIFIED},
		{"web", "http", "TCP", registryv1.Protocol_PROTOCOL_HTTP},
		{"tcp", "grpc", "TCP", registryv1.Protocol_PROTOCOL_GRPC},
		{"web", "kubernetes.io/h2c", "TCP", registryv1.Protocol_PROTOCOL_HTTP2},
		{"web", "kubernetes.io/wss", "TCP", registryv1.Protocol_PROTOCOL_HTTPS},
		{"web", "custom.example.com/thing", "TCP", registryv1.Protocol_PROTOCOL_UNSPECIFIED},
		{"http", "", "UDP", registryv1.Protocol_PROTOCOL_UDP},
	}
	for _, tc := range tests {
		if got := KubernetesPortProtocol(tc.name, tc.appProtocol, tc.transport); got != tc.want {
			t.Errorf("KubernetesPortProtocol(%q, %q, %q) = %v, want %v", tc.name, tc.appProtocol, tc.transport, got, tc.want)
		}
	}
}

func TestResourceNames(t *testing.T) {
	if got := ServiceName("prod", "reviews.prod.svc.cluster.local"); got != "prod/reviews.prod.svc.cluster.local" {
		t.Error(got)
	}
	if got := EndpointSetName("prod", "reviews.prod.svc.cluster.local", "reviews-x7k2p"); got != "prod/reviews.prod.svc.cluster.local/reviews-x7k2p" {
		t.Error(got)
	}
}

// Every protocol's Istio name reads back as that protocol; sniffed is
// Istio's UnsupportedProtocol.
func TestEveryProtocolHasItsIstioNameAndReadsBack(t *testing.T) {
	for v := range registryv1.Protocol_name {
		p := registryv1.Protocol(v)
		if got := ParseProtocol(ProtocolName(p)); got != p {
			t.Errorf("%s: named %q, read back as %s", p, ProtocolName(p), got)
		}
	}
	if got := ProtocolName(registryv1.Protocol_PROTOCOL_UNSPECIFIED); got != "UnsupportedProtocol" {
		t.Errorf("sniffed: %q", got)
	}
}
