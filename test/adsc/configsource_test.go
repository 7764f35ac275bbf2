package adsc_test

import (
	"path/filepath"
	"sync"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"istio.io/istio/pilot/pkg/config/memory"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pkg/adsc"
	"istio.io/istio/pkg/config/schema/collections"
	"istio.io/istio/pkg/config/schema/gvk"
)

// meshSeen decodes the mesh config responses exactly as adsc does (the
// first resource's bytes as a MeshConfig), on adsc's own receive
// goroutine, so the test reads it without racing adsc's unguarded field.
type meshSeen struct {
	mu          sync.Mutex
	trustDomain string
}

func (m *meshSeen) HandleResponse(_ *adsc.ADSC, resp *discoveryv3.DiscoveryResponse) {
	if resp.GetTypeUrl() != gvk.MeshConfig.String() || len(resp.GetResources()) == 0 {
		return
	}
	mc := &meshv1alpha1.MeshConfig{}
	if err := proto.Unmarshal(resp.GetResources()[0].GetValue(), mc); err != nil {
		return
	}
	m.mu.Lock()
	m.trustDomain = mc.GetTrustDomain()
	m.mu.Unlock()
}

func (m *meshSeen) get() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.trustDomain
}

// TestIstiosPilotTakesGalleyAsItsConfigSource: Istio's pilot-discovery
// reads an MCP config source ("configSources: [{address: xds://galley:15019}]",
// the pre-1.5 split) with adsc, asking for the mesh config and every kind
// it knows, into a memory config store. Done here exactly as pilot does
// it (bootstrap/configcontroller.go, same requests, same store), against
// galley as a process: pilot becomes synced (galley answers the kinds it
// does not publish with empty collections), its store holds galley's
// objects as Istio's types, the mesh config reads as Istio reads it, and
// an edit reaches the store.
func TestIstiosPilotTakesGalleyAsItsConfigSource(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "mesh.yaml", mesh)
	writeFile(t, dir, "routing.yaml", routing(90, 10))
	meshDir := t.TempDir()
	writeFile(t, meshDir, "mesh-config.yaml", "trustDomain: galley.example\n")
	meshFile := filepath.Join(meshDir, "mesh-config.yaml")
	mcp, galleyAdmin := freeAddr(t), freeAddr(t)
	start(t, "galley", "--config-dir", dir, "--mesh-config-file", meshFile, "--mcp-address", mcp, "--admin-address", galleyAdmin)
	waitReady(t, galleyAdmin)

	seen := &meshSeen{}
	client, err := adsc.New(mcp, &adsc.ADSConfig{
		InitialDiscoveryRequests: adsc.ConfigInitialRequests(),
		Config: adsc.Config{
			Namespace: "istio-system",
			Workload:  "istiod-1",
			IP:        "127.0.0.1",
			Meta:      model.NodeMetadata{Generator: "api"}.ToStruct(),
		},
		ResponseHandler: seen,
	})
	if err != nil {
		t.Fatal(err)
	}
	store := memory.NewController(memory.Make(collections.Pilot))
	store.RegisterHasSyncedHandler(client.HasSynced)
	client.Store = store
	if err := client.Run(); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	stop := make(chan struct{})
	defer close(stop)
	go store.Run(stop)

	waitFor(t, "pilot's config store to sync", store.HasSynced)
	waitFor(t, "galley's objects in pilot's store", func() bool {
		return len(store.List(gvk.ServiceEntry, "default")) == 1 && len(store.List(gvk.DestinationRule, "default")) == 1 &&
			len(store.List(gvk.VirtualService, "default")) == 1
	})
	waitFor(t, "the mesh config as pilot reads it", func() bool { return seen.get() == "galley.example" })
	weight := func() int32 {
		vss := store.List(gvk.VirtualService, "default")
		if len(vss) != 1 {
			return -1
		}
		vs, ok := vss[0].Spec.(*networking.VirtualService)
		if !ok || len(vs.GetHttp()) == 0 || len(vs.GetHttp()[0].GetRoute()) != 2 {
			return -1
		}
		return vs.GetHttp()[0].GetRoute()[1].GetWeight()
	}
	if w := weight(); w != 10 {
		t.Fatalf("the VirtualService in pilot's store routes %d%% to v2, want 10", w)
	}
	writeFile(t, dir, "routing.yaml", routing(0, 100))
	waitFor(t, "the edit to reach pilot's store", func() bool { return weight() == 100 })

	// Removing an object removes it from pilot's store.
	writeFile(t, dir, "routing.yaml", "")
	waitFor(t, "the removed VirtualService to leave pilot's store", func() bool { return len(store.List(gvk.VirtualService, "default")) == 0 })
}
