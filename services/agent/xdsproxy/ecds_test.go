package xdsproxy

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/services/agent/wasm"
)

// scripted is a discovery that plays a script on each stream.
type scripted struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	sotw  func(discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error
	delta func(discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error
}

func (s scripted) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.sotw(st)
}

func (s scripted) DeltaAggregatedResources(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return s.delta(st)
}

// wasmPod is a pod whose proxy converts ECDS with a cache.
func wasmPod(t *testing.T, srv discoveryv3.AggregatedDiscoveryServiceServer) *pod {
	t.Helper()
	cache, err := wasm.New(wasm.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	p := newPodWith(t, srv, func(o *Options) { o.Wasm = cache })
	p.give(t, "spiffe://cluster.local/ns/shop/sa/cart")
	return p
}

// slowModule serves a module once release is closed.
func slowModule(t *testing.T) (url string, module []byte, release chan struct{}) {
	t.Helper()
	module = append([]byte("\x00asm\x01\x00\x00\x00"), "flotilla"...)
	release = make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			_, _ = w.Write(module)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/plugin.wasm", module, release
}

func anyOf(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// remoteWasm is an ECDS resource loading its module from url.
func remoteWasm(t *testing.T, url string) *anypb.Any {
	t.Helper()
	w := &httpwasmv3.Wasm{Config: &wasmv3.PluginConfig{Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{
		Code:                 &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Remote{Remote: &corev3.RemoteDataSource{HttpUri: &corev3.HttpUri{Uri: url}}}},
		EnvironmentVariables: &wasmv3.EnvironmentVariables{KeyValues: map[string]string{"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1"}},
	}}}}
	return anyOf(t, &corev3.TypedExtensionConfig{Name: "shop.plugin", TypedConfig: anyOf(t, w)})
}

// undecodable is an ECDS resource that is not one.
func undecodable() *anypb.Any {
	return &anypb.Any{TypeUrl: ecdsType, Value: []byte{0xff, 0xff, 0xff}}
}

// localModule checks that r loads module from a local file.
func localModule(t *testing.T, r *anypb.Any, module []byte) {
	t.Helper()
	ec := &corev3.TypedExtensionConfig{}
	if err := r.UnmarshalTo(ec); err != nil {
		t.Fatal(err)
	}
	w := &httpwasmv3.Wasm{}
	if err := ec.GetTypedConfig().UnmarshalTo(w); err != nil {
		t.Fatal(err)
	}
	vm := w.GetConfig().GetVmConfig()
	file := vm.GetCode().GetLocal().GetFilename()
	if file == "" {
		t.Fatalf("the code is %v", vm.GetCode())
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, module) {
		t.Fatalf("%s: %v", file, err)
	}
	if vm.GetEnvironmentVariables() != nil {
		t.Fatal("the agent's variables reached Envoy")
	}
}

func timeout(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAnECDSResponseReachesEnvoyRewrittenWithoutHoldingBackWhatFollows(t *testing.T) {
	url, module, release := slowModule(t)
	lds := &discoveryv3.DiscoveryResponse{
		TypeUrl: resourcev3.ListenerType, Nonce: "l1", VersionInfo: "1",
		Resources: []*anypb.Any{anyOf(t, &listenerv3.Listener{Name: "virtualOutbound"})},
	}
	p := wasmPod(t, scripted{sotw: func(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: ecdsType, Nonce: "e1", VersionInfo: "1", Resources: []*anypb.Any{remoteWasm(t, url)}}); err != nil {
			return err
		}
		if err := s.Send(lds); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}})
	s, err := p.envoy.StreamAggregatedResources(timeout(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	// The listeners come while the module is still being fetched, as
	// discovery sent them.
	got, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, lds) {
		t.Fatalf("first: %v, want the listeners", got)
	}
	close(release)
	got, err = s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got.GetTypeUrl() != ecdsType || got.GetNonce() != "e1" || got.GetVersionInfo() != "1" || len(got.GetResources()) != 1 {
		t.Fatalf("second: %v", got)
	}
	localModule(t, got.GetResources()[0], module)
}

func TestAnUndecodableECDSResponseIsNackedToDiscoveryAndNotForwarded(t *testing.T) {
	nacks := make(chan *discoveryv3.DiscoveryRequest, 1)
	p := wasmPod(t, scripted{sotw: func(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil { // Envoy's ECDS ack of version 7
			return err
		}
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: ecdsType, Nonce: "bad", VersionInfo: "8", Resources: []*anypb.Any{undecodable()}}); err != nil {
			return err
		}
		req, err := s.Recv()
		if err != nil {
			return err
		}
		nacks <- req
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: resourcev3.ListenerType, Nonce: "after"}); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}})
	s, err := p.envoy.StreamAggregatedResources(timeout(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: ecdsType, VersionInfo: "7", ResponseNonce: "n7"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got.GetNonce() != "after" {
		t.Fatalf("Envoy got %v, want only what discovery sent after the NACK", got)
	}
	nack := <-nacks
	if nack.GetTypeUrl() != ecdsType || nack.GetResponseNonce() != "bad" || nack.GetVersionInfo() != "7" || nack.GetErrorDetail().GetMessage() == "" {
		t.Fatalf("discovery got %v, want a NACK of version 7", nack)
	}
}

func TestDeltaECDSIsRewrittenAndNackedAlike(t *testing.T) {
	url, module, release := slowModule(t)
	close(release)
	nacks := make(chan *discoveryv3.DeltaDiscoveryRequest, 1)
	p := wasmPod(t, scripted{delta: func(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: ecdsType, Nonce: "bad", Resources: []*discoveryv3.Resource{{Name: "x", Resource: undecodable()}}}); err != nil {
			return err
		}
		req, err := s.Recv()
		if err != nil {
			return err
		}
		nacks <- req
		if err := s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: ecdsType, Nonce: "good", Resources: []*discoveryv3.Resource{
			{Name: "shop.plugin", Version: "1", Resource: remoteWasm(t, url)},
		}, RemovedResources: []string{"old"}}); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	}})
	s, err := p.envoy.DeltaAggregatedResources(timeout(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: ecdsType, ResourceNamesSubscribe: []string{"shop.plugin"}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got.GetNonce() != "good" || len(got.GetResources()) != 1 || got.GetResources()[0].GetVersion() != "1" || len(got.GetRemovedResources()) != 1 {
		t.Fatalf("Envoy got %v", got)
	}
	localModule(t, got.GetResources()[0].GetResource(), module)
	nack := <-nacks
	if nack.GetTypeUrl() != ecdsType || nack.GetResponseNonce() != "bad" || nack.GetErrorDetail().GetMessage() == "" {
		t.Fatalf("discovery got %v, want a NACK", nack)
	}
}

func TestPeekingFindsTheLastOccurrenceAndSurvivesGarbage(t *testing.T) {
	b, err := proto.Marshal(&discoveryv3.DiscoveryResponse{VersionInfo: "v", TypeUrl: "first", Nonce: "n"})
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, 0x22, 0x04, 'l', 'a', 's', 't') // field 4 again
	if got, ok := peekString(b, responseTypeURL); !ok || got != "last" {
		t.Fatalf("got %q", got)
	}
	if got, _ := peekString(b, responseNonce); got != "n" {
		t.Fatalf("nonce %q", got)
	}
	if _, ok := peekString([]byte{0x22, 0x10, 'x'}, responseTypeURL); ok {
		t.Fatal("a truncated field was read")
	}
}

func FuzzPeekString(f *testing.F) {
	f.Add([]byte{0x22, 0x01, 'x'})
	f.Fuzz(func(_ *testing.T, b []byte) {
		_, _ = peekString(b, responseTypeURL)
	})
}
