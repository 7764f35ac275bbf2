package istio

import "testing"

func TestAKindIsFoundByTheNamesKubectlTakes(t *testing.T) {
	for name, want := range map[string]string{
		"VirtualService": "VirtualService", "virtualservice": "VirtualService", "virtual-service": "VirtualService",
		"virtualservices": "VirtualService", "vs": "VirtualService", "dr": "DestinationRule", "PeerAuthentication": "PeerAuthentication",
		"sidecars": "Sidecar", "": "", "Service": "", "vss": "",
	} {
		k, ok := ByKubectlName(name)
		if ok != (want != "") || k.Kind != want {
			t.Errorf("ByKubectlName(%q) = %q, %v; want %q", name, k.Kind, ok, want)
		}
	}
}
