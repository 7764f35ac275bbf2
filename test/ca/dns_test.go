package ca_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// externalDatabase is a ServiceEntry without addresses of its own, as
// `kubectl get -o yaml` shows it once galley's leader has allocated its
// addresses (status.addresses).
const externalDatabase = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: databases, namespace: shop}
spec:
  hosts: [pg.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 5432, name: tcp, protocol: TCP}]
status:
  addresses:
  - {host: pg.example.com, value: 240.240.0.1}
  - {host: pg.example.com, value: "2001:2::1"}
`

// TestTheAgentAnswersItsPodsDNSFromTheNameTable runs Flotilla's agent with
// DNS capture on (ISTIO_META_DNS_CAPTURE, as proxyMetadata sets it) against
// galley and discovery: its bootstrap tells discovery so, it asks for the
// name table once Envoy asks for listeners, and its DNS proxy answers the
// ServiceEntry's host with the allocated address over UDP and TCP, as
// Istio's agent does; the sidecar gets the host's own listener at that
// address, and the agent exports Istio's DNS metrics.
func TestTheAgentAnswersItsPodsDNSFromTheNameTable(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(xdstest.StartBackend(t, "v1"), "v1")))
	xdstest.WriteFile(t, dir, "databases.yaml", externalDatabase)
	secureXDS, _ := meshServing(t, c, s, dir)
	dnsAddr := proc.FreeAddr(t)
	t.Setenv("ISTIO_META_DNS_CAPTURE", "true")
	t.Setenv("DNS_PROXY_ADDR", dnsAddr)
	p := startAgent(t, c, s, secureXDS, "cart")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Envoy's stream, with the node of the bootstrap the agent wrote.
	bootPath := filepath.Join(filepath.Dir(p.xds), "envoy-rev.json")
	xdstest.Eventually(t, "the bootstrap", func() bool { _, err := os.Stat(bootPath); return err == nil })
	raw, err := os.ReadFile(bootPath)
	if err != nil {
		t.Fatal(err)
	}
	var boot struct{ Node json.RawMessage }
	node := &corev3.Node{}
	if err := json.Unmarshal(raw, &boot); err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(boot.Node, node); err != nil {
		t.Fatal(err)
	}
	if got := node.GetMetadata().GetFields()["DNS_CAPTURE"].GetStringValue(); got != "true" {
		t.Fatalf("the bootstrap's node metadata DNS_CAPTURE is %q, want true", got)
	}
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(unixConn(t, p.xds)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	lds, err := ads.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range lds.GetResources() {
		var l listenerv3.Listener
		if err := a.UnmarshalTo(&l); err == nil {
			names = append(names, l.GetName())
		}
	}
	if !slices.Contains(names, "240.240.0.1_5432") {
		t.Errorf("listeners %v: none of pg.example.com's own at its allocated address", names)
	}

	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, dnsAddr)
		}}
		var got []string
		xdstest.Eventually(t, "pg.example.com over "+network, func() bool {
			lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
			defer lcancel()
			got, err = r.LookupHost(lctx, "pg.example.com")
			slices.Sort(got)
			// The pod has an IPv4 address only: so are its answers
			// (Istio's GetAllAddressesForProxy).
			return err == nil && slices.Equal(got, []string{"240.240.0.1"})
		})
	}
	// Envoy never sees the name table: the agent takes and acknowledges it.
	recvd := make(chan string, 1)
	go func() {
		resp, err := ads.Recv()
		if err == nil {
			recvd <- resp.GetTypeUrl()
		}
	}()
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-recvd:
		if got != resourcev3.ClusterType {
			t.Errorf("Envoy got a response of type %s, want clusters", got)
		}
	case <-ctx.Done():
		t.Fatal("no clusters")
	}
	// The table, as Istio's agent shows it on /debug/ndsz.
	code, body := httpGet(t, "http://"+p.admin+"/debug/ndsz")
	var ndsz struct {
		Table map[string]struct{ Ips []string }
	}
	if err := json.Unmarshal([]byte(body), &ndsz); code != 200 || err != nil || !slices.Equal(ndsz.Table["pg.example.com"].Ips, []string{"240.240.0.1"}) {
		t.Errorf("/debug/ndsz: %d %s (%v)", code, body, err)
	}
	_, stats := httpGet(t, "http://"+p.admin+"/stats/prometheus")
	for _, m := range []string{"istio_agent_dns_requests_total"} {
		if !strings.Contains(stats, m) {
			t.Errorf("/stats/prometheus has no %s", m)
		}
	}
}
