package xds

import (
	"fmt"
	"log/slog"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/metric/noop"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/services/discovery/proxy"
)

// sharingBench is 200 HTTP services with an endpoint each, and 50
// sidecars of their namespace (none at an endpoint's address), which
// get the same clusters, load assignments, listeners and routes.
type sharingBench struct {
	srv     *Server
	store   *model.Store
	last    *model.PushContext
	version uint64
	conns   []*conn
}

func newSharingBench(b *testing.B) *sharingBench {
	b.Helper()
	srv, err := New(Options{Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("bench")})
	if err != nil {
		b.Fatal(err)
	}
	sb := &sharingBench{srv: srv, store: model.NewStore()}
	for i := range 200 {
		name := fmt.Sprintf("svc-%03d", i)
		host := name + ".default.svc.cluster.local"
		sb.store.PutService(&registryv1.Service{
			Hostname: host, Name: name, Namespace: "default", Addresses: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports:      []*registryv1.ServicePort{{Name: "http", Number: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
		})
		sb.store.PutEndpointSet(&registryv1.EndpointSet{
			ServiceHostname: host, ServiceNamespace: "default", Shard: "0",
			Endpoints: []*registryv1.Endpoint{{Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 8080}}}},
		})
	}
	for i := range 50 {
		id := fmt.Sprintf("sidecar~10.2.0.%d~app-%d.default~default.svc.cluster.local", i+1, i)
		p, err := proxy.FromNode(&corev3.Node{Id: id})
		if err != nil {
			b.Fatal(err)
		}
		sb.conns = append(sb.conns, newConn(srv, p, id, false))
	}
	return sb
}

// build makes a new push context of the same configuration: nothing
// memoized or encoded yet.
func (sb *sharingBench) build() *model.PushContext {
	sb.version++
	pc, _ := sb.store.Build(model.BuildOptions{}, sb.last, sb.version)
	sb.last = pc
	return pc
}

// generateAll builds and encodes every type for c from pc, as a full push
// does; it reports how many resources.
func (sb *sharingBench) generateAll(c *conn, pc *model.PushContext) int {
	gen := translate.NewGenerator(pc, c.proxy)
	n := 0
	for _, t := range translate.Types() {
		n += len(c.generate(t, gen, nil))
	}
	return n
}

// BenchmarkSharedEncodings is what sharing encodings costs and saves: a
// push context's every type generated for 50 sidecars of one scope
// ("push": the first encodes what they share, the others find it), and
// for one more sidecar once the push context holds every encoding
// ("warm").
func BenchmarkSharedEncodings(b *testing.B) {
	b.Run("push", func(b *testing.B) {
		sb := newSharingBench(b)
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			pc := sb.build()
			b.StartTimer()
			for _, c := range sb.conns {
				if sb.generateAll(c, pc) == 0 {
					b.Fatal("nothing generated")
				}
			}
		}
	})
	b.Run("warm", func(b *testing.B) {
		sb := newSharingBench(b)
		pc := sb.build()
		sb.generateAll(sb.conns[0], pc)
		c := sb.conns[1]
		b.ReportAllocs()
		for b.Loop() {
			if sb.generateAll(c, pc) == 0 {
				b.Fatal("nothing generated")
			}
		}
	})
}
