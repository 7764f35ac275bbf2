package istioagent_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// databases are ServiceEntries without addresses of their own, as
// `kubectl get -o yaml` shows them once galley's leader has allocated
// theirs (status.addresses), and one with its own address.
const databases = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: databases, namespace: demo}
spec:
  hosts: [pg.example.com, mysql.example.com]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 5432, name: tcp, protocol: TCP}]
status:
  addresses:
  - {host: pg.example.com, value: 240.240.0.1}
  - {host: pg.example.com, value: "2001:2::1"}
  - {host: mysql.example.com, value: 240.240.0.2}
  - {host: mysql.example.com, value: "2001:2::2"}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: demo}
spec:
  hosts: [billing.internal]
  addresses: [10.20.30.40]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}]
  endpoints: [{address: 10.20.0.1}]
`

// resolver asks the DNS server at addr over network ("udp" or "tcp")
// only, with Go's own resolver.
func resolver(addr, network string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// TestIstiosAgentAnswersItsPodsDNSFromTheNameTable runs Istio's own
// pilot-agent with DNS capture on (the mesh's proxyMetadata
// ISTIO_META_DNS_CAPTURE): it asks discovery for the name table (NDS) and
// its DNS proxy answers the ServiceEntry hosts with their allocated
// addresses, over UDP and TCP, as it answers istiod's; the sidecar gets a
// listener of its own for each such TCP host at that address.
func TestIstiosAgentAnswersItsPodsDNSFromTheNameTable(t *testing.T) {
	config := greeterConfig(t, proc.FreeAddr(t), proc.FreeAddr(t))
	xdstest.WriteFile(t, config, "databases.yaml", databases)
	m := startMesh(t, config)
	p := startPod(t, m, podSpec{
		name: "greeter-client-1", namespace: "demo", account: "greeter-client", workload: "greeter-client",
		labels: map[string]string{"app": "greeter-client"}, certTTL: time.Hour, dnsCapture: true,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := p.envoyBootstrap(t)
	// Envoy's stream is what makes the agent connect to discovery, and
	// ask for the name table beside it.
	e := startADS(t, ctx, b)
	if listeners := e.subscribe(t, resourcev3.ListenerType); !slices.Contains(listeners, "240.240.0.1_5432") || !slices.Contains(listeners, "240.240.0.2_5432") {
		t.Fatalf("listeners through pilot-agent: %q; want one per database at its allocated address", listeners)
	}

	want := map[string]netip.Addr{
		"pg.example.com":    netip.MustParseAddr("240.240.0.1"),
		"mysql.example.com": netip.MustParseAddr("240.240.0.2"),
		"billing.internal":  netip.MustParseAddr("10.20.30.40"),
	}
	for _, network := range []string{"udp", "tcp"} {
		r := resolver(p.dns, network)
		for host, addr := range want {
			var got []netip.Addr
			xdstest.Eventually(t, host+" over "+network+" from pilot-agent's DNS proxy", func() bool {
				lctx, lcancel := context.WithTimeout(ctx, 2*time.Second)
				defer lcancel()
				var err error
				got, err = r.LookupNetIP(lctx, "ip4", host)
				return err == nil
			})
			if len(got) != 1 || got[0] != addr {
				t.Errorf("%s over %s: %v, want %s", host, network, got, addr)
			}
		}
	}
}
