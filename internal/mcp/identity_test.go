package mcp

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// restrictedType is a collection served to allowedIdentity alone, as
// galley serves credentials to discovery alone.
const (
	restrictedType  = "registry.flotilla.io/v1/Credential"
	allowedIdentity = "spiffe://cluster.local/ns/istio-system/sa/flotilla-discovery"
)

// meshIdentities are the identities the harness's subscribers present:
// the allowed one first, then two of the mesh (the CLI's and the chart's
// gateways' identity, and a workload's) and none at all.
func meshIdentities() []string {
	return []string{
		allowedIdentity,
		"spiffe://cluster.local/ns/istio-system/sa/default",
		"spiffe://cluster.local/ns/demo/sa/greeter",
		"plaintext",
	}
}

// identityHarness is one Server serving over mTLS and over plaintext on
// 127.0.0.1, and a connection per identity of meshIdentities.
type identityHarness struct {
	conns []*grpc.ClientConn
}

func newIdentityHarness(tb testing.TB) *identityHarness {
	tb.Helper()
	ca, err := testpki.NewCA("mcp-identity-test")
	if err != nil {
		tb.Fatal(err)
	}
	cert := ca.IssueTLS(tb, testpki.Request{CommonName: "galley", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	srv, err := NewServer(ctx, quiet(), noop.NewMeterProvider().Meter("test"), []string{vsType, restrictedType})
	if err != nil {
		tb.Fatal(err)
	}
	srv.Restrict(restrictedType, func(id string) bool { return id == allowedIdentity })
	if _, err := srv.Update(vsType, []*Resource{vs(tb, "r", "reviews")}, nil); err != nil {
		tb.Fatal(err)
	}
	if _, err := srv.Update(restrictedType, []*Resource{vs(tb, "private-key", "secret")}, nil); err != nil {
		tb.Fatal(err)
	}
	mtls := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	})))
	plain := grpc.NewServer()
	addrs := map[*grpc.Server]string{}
	for _, g := range []*grpc.Server{mtls, plain} {
		srv.Register(g)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		addrs[g] = lis.Addr().String()
		go func() { _ = g.Serve(lis) }()
		tb.Cleanup(g.Stop)
	}
	h := &identityHarness{}
	for _, id := range meshIdentities() {
		creds, addr := insecure.NewCredentials(), addrs[plain]
		if id != "plaintext" {
			c := ca.IssueTLS(tb, testpki.Request{CommonName: "subscriber", URIs: []string{id}})
			creds = credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS13})
			addr = addrs[mtls]
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { conn.Close() })
		h.conns = append(h.conns, conn)
	}
	return h
}

// probe is one open stream of the harness, of either protocol.
type probe struct {
	identity int
	delta    bool
	send     func(typeURL string) error
	types    chan string   // the type URL of each response received
	done     chan struct{} // closed when the stream has ended
	err      error         // why it ended, read after done
	cancel   context.CancelFunc
	asked    bool
}

// open opens a stream as identity and waits for its first response (of an
// unrestricted collection), so that the server knows the stream.
func (h *identityHarness) open(t *testing.T, identity int, delta bool) *probe {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	p := &probe{identity: identity, delta: delta, types: make(chan string, 16), done: make(chan struct{}), cancel: cancel}
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(h.conns[identity])
	node := &corev3.Node{Id: fmt.Sprintf("subscriber-%d", identity)}
	var recv func() (string, error)
	if delta {
		st, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.send = func(typeURL string) error {
			return st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL})
		}
		recv = func() (string, error) {
			r, err := st.Recv()
			return r.GetTypeUrl(), err
		}
	} else {
		st, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.send = func(typeURL string) error {
			return st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL})
		}
		recv = func() (string, error) {
			r, err := st.Recv()
			return r.GetTypeUrl(), err
		}
	}
	go func() {
		defer close(p.done)
		for {
			typeURL, err := recv()
			if err != nil {
				p.err = err
				return
			}
			p.types <- typeURL
		}
	}()
	if err := p.send(vsType); err != nil {
		t.Fatal(err)
	}
	if served, _ := p.await(t, vsType); !served {
		t.Fatalf("a stream of %s was not served %s: %v", meshIdentities()[identity], vsType, p.err)
	}
	return p
}

// await waits (10 s at most) for a response of typeURL or the stream's end.
func (p *probe) await(t *testing.T, typeURL string) (served bool, ended error) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-p.types:
			if got == typeURL {
				return true, nil
			}
		case <-p.done:
			return false, p.err
		case <-timeout:
			t.Fatalf("neither a %s response nor the stream's end within 10 s", typeURL)
		}
	}
}

func (p *probe) close() {
	p.cancel()
	<-p.done
}

func (p *probe) String() string {
	kind := "sotw"
	if p.delta {
		kind = "delta"
	}
	return kind + "/" + meshIdentities()[p.identity]
}

// maxLiveProbes bounds the streams one sequence holds open at once.
const maxLiveProbes = 8

// run plays ops, a byte an operation: its low two bits open a
// state-of-the-world stream, open a delta stream, ask a live stream for
// the restricted collection, or close a live stream; its next two bits
// choose the identity that opens; its high four the live stream acted
// on. Every stream that asks must be served the restricted collection if
// and only if its own identity is allowed it; one not allowed has its
// stream ended with PermissionDenied.
func (h *identityHarness) run(t *testing.T, ops []byte) {
	t.Helper()
	var live []*probe
	defer func() {
		for _, p := range live {
			p.close()
		}
	}()
	var trace []string
	for _, op := range ops {
		identity, pick := int(op>>2)%len(h.conns), int(op>>4)
		switch op & 3 {
		case 0, 1:
			if len(live) == maxLiveProbes {
				continue
			}
			p := h.open(t, identity, op&3 == 1)
			live = append(live, p)
			trace = append(trace, "open "+p.String())
		case 2:
			if len(live) == 0 {
				continue
			}
			i := pick % len(live)
			p := live[i]
			if p.asked { // asked and served already: the same request again is answered by nothing new
				continue
			}
			p.asked = true
			trace = append(trace, "ask "+p.String())
			if err := p.send(restrictedType); err != nil {
				t.Fatal(err)
			}
			served, ended := p.await(t, restrictedType)
			allowed := meshIdentities()[p.identity] == allowedIdentity
			switch {
			case served && !allowed:
				t.Fatalf("the restricted collection was served to %s after:\n  %s", p, strings.Join(trace, "\n  "))
			case !served && allowed:
				t.Fatalf("the restricted collection was refused to %s (%v) after:\n  %s", p, ended, strings.Join(trace, "\n  "))
			case !served && grpcstatus.Code(ended) != codes.PermissionDenied:
				t.Fatalf("%s's stream ended with %v, want PermissionDenied", p, ended)
			}
			if !served {
				live = append(live[:i], live[i+1:]...)
			}
		case 3:
			if len(live) == 0 {
				continue
			}
			i := pick % len(live)
			trace = append(trace, "close "+live[i].String())
			live[i].close()
			live = append(live[:i], live[i+1:]...)
		}
	}
}

// maxOps bounds one fuzzed sequence.
const maxOps = 48

// FuzzRestrictedCollectionsReachOnlyTheIdentitiesAllowedThem: random
// interleavings of state-of-the-world and delta streams opening, asking
// and closing under four identities, over real mTLS and plaintext
// streams, never deliver the restricted collection to an identity not
// allowed it, and always to the one allowed. The seeds are the reported
// collision (a state-of-the-world stream of istio-system/default asking
// after discovery's delta stream took its number) and 24 sequences of a
// seeded generator, so go test runs them as a property test.
func FuzzRestrictedCollectionsReachOnlyTheIdentitiesAllowedThem(f *testing.F) {
	const (
		openSotw, openDelta, ask = 0, 1, 2
		asDiscovery, asDefault   = 0 << 2, 1 << 2
	)
	// Six streams of istio-system/default, then discovery's delta stream,
	// then each stream asks, oldest first (a refused one is gone).
	collision := []byte{}
	for range 6 {
		collision = append(collision, openSotw|asDefault)
	}
	collision = append(collision, openDelta|asDiscovery)
	for range 7 {
		collision = append(collision, ask)
	}
	f.Add(collision)
	f.Add([]byte{openDelta | asDefault, openSotw | asDiscovery, ask | 0<<4, ask | 1<<4})
	rng := rand.New(rand.NewPCG(38, 1))
	for range 24 {
		ops := make([]byte, 32)
		for i := range ops {
			ops[i] = byte(rng.UintN(256))
		}
		f.Add(ops)
	}
	h := newIdentityHarness(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > maxOps {
			ops = ops[:maxOps]
		}
		h.run(t, ops)
	})
}
