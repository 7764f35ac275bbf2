package wasm

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// FuzzConvert feeds arbitrary bytes to Convert as an ECDS resource: it
// must not panic, and what it returns without an error must decode. The
// context is cancelled, so no module is fetched from what the input names.
func FuzzConvert(f *testing.F) {
	for _, r := range []*anypb.Any{
		plugin{name: "p", uri: "http://127.0.0.1:1/m.wasm", env: map[string]string{envPullSecret: "{}", "K": "v"}}.resource(f),
		plugin{name: "n", uri: "oci://example.com/p:latest", network: true}.resource(f),
		extensionConfig(f, "router", &routerv3.Router{}),
	} {
		f.Add(r.GetValue())
	}
	f.Add([]byte{0xff})
	c := newCache(f, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.Fuzz(func(t *testing.T, data []byte) {
		resources := []*anypb.Any{{TypeUrl: typePrefix + "envoy.config.core.v3.TypedExtensionConfig", Value: data}}
		if err := c.Convert(ctx, resources); err != nil {
			return
		}
		if err := resources[0].UnmarshalTo(&corev3.TypedExtensionConfig{}); err != nil {
			t.Fatalf("the converted resource does not decode: %v", err)
		}
	})
}
