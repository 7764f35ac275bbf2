package translate

import (
	"bytes"
	"os"
	"testing"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
)

// The gateway's HTTP connection managers are encoded from two parts
// (gatewayHCMFilter); each must be byte for byte the deterministic
// encoding of the whole message gatewayHCM builds, so that versions and
// hashes of the listener are what a plain marshal would give.
func TestGatewayHTTPConnectionManagersEncodeAsTheWholeMessage(t *testing.T) {
	input, err := os.ReadFile("testdata/gateway-servers/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range generators(t, string(input)) {
		if !x.g.isGateway() {
			continue
		}
		for _, l := range x.Listeners(nil) {
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					if f.GetName() != hcmFilter {
						continue
					}
					got := &hcmv3.HttpConnectionManager{}
					if err := f.GetTypedConfig().UnmarshalTo(got); err != nil {
						t.Fatalf("%s %s: %v", l.GetName(), fc.GetName(), err)
					}
					want := x.g.gatewayHCM(got.GetStatPrefix(), got.GetRds().GetRouteConfigName())
					if !proto.Equal(got, want) {
						t.Errorf("%s %s: the connection manager is not gatewayHCM's:\n got %v\nwant %v", l.GetName(), fc.GetName(), got, want)
					}
					raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(f.GetTypedConfig().GetValue(), raw) {
						t.Errorf("%s %s: the encoding differs from the whole message's deterministic encoding", l.GetName(), fc.GetName())
					}
					n++
				}
			}
		}
	}
	if n < 5 {
		t.Fatalf("checked %d gateway connection managers; the case has at least 5", n)
	}
}
