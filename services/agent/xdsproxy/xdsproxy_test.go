package xdsproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/spiffe"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
)

// discovery is a stand-in for discovery's mTLS port: it requires a client
// certificate from the mesh CA and answers each request with the
// caller's SPIFFE ID as the version; a request of type "end" ends the
// stream with PermissionDenied, one of type "end/<n>" with code n.
type discovery struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func callerID(ctx context.Context) string {
	p, _ := peer.FromContext(ctx)
	info, _ := p.AuthInfo.(credentials.TLSInfo)
	id, err := spiffe.FromCertificate(info.State.VerifiedChains[0][0])
	if err != nil {
		return "no identity: " + err.Error()
	}
	return id.String()
}

func (discovery) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		if req.GetTypeUrl() == "end" {
			return status.Error(codes.PermissionDenied, "bye")
		}
		if n, ok := strings.CutPrefix(req.GetTypeUrl(), "end/"); ok {
			code, _ := strconv.Atoi(n)
			return status.Error(codes.Code(code), "bye")
		}
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), VersionInfo: callerID(s.Context()), Nonce: req.GetNode().GetId()}); err != nil {
			return err
		}
	}
}

func (discovery) DeltaAggregatedResources(s discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went away
		}
		if err := s.Send(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), SystemVersionInfo: callerID(s.Context())}); err != nil {
			return err
		}
	}
}

type pod struct {
	state *identity.State
	ca    *testpki.CA
	proxy *Proxy
	envoy discoveryv3.AggregatedDiscoveryServiceClient
	// upstream is the stand-in discovery's address.
	upstream string
}

// newPod starts the stand-in discovery and an agent's proxy on a Unix
// socket; the pod holds no certificate until give is called.
func newPod(tb testing.TB) *pod {
	tb.Helper()
	return newPodWith(tb, discovery{})
}

// newPodWith is newPod with srv as discovery, and the proxy's options
// edited.
func newPodWith(tb testing.TB, srv discoveryv3.AggregatedDiscoveryServiceServer, edit ...func(*Options)) *pod {
	tb.Helper()
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		tb.Fatal(err)
	}
	serving, err := ca.Issue(testpki.Request{CommonName: "discovery", DNSNames: []string{"flotilla-discovery.istio-system.svc"}})
	if err != nil {
		tb.Fatal(err)
	}
	sc, err := serving.TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	up := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{sc}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
	})))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(up, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = up.Serve(lis) }()
	tb.Cleanup(up.Stop)

	p := &pod{state: identity.New(), ca: ca, upstream: lis.Addr().String()}
	o := Options{Address: lis.Addr().String(), ServerName: "flotilla-discovery.istio-system.svc", State: p.state, Log: slog.New(slog.DiscardHandler)}
	for _, e := range edit {
		e(&o)
	}
	if p.proxy, err = New(o); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.proxy.Close() })
	dir, err := os.MkdirTemp("", "xds")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "XDS")
	ulis, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer(ServerOptions()...)
	p.proxy.Register(gs)
	go func() { _ = gs.Serve(ulis) }()
	tb.Cleanup(gs.Stop)
	// Envoy's HTTP/2 windows are large (256 MiB by default): so is this
	// stand-in's.
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(windowBytes), grpc.WithInitialConnWindowSize(windowBytes))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	p.envoy = discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
	return p
}

func (p *pod) give(tb testing.TB, uri string) {
	tb.Helper()
	leaf, err := p.ca.Issue(testpki.Request{CommonName: "w", URIs: []string{uri}})
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	p.state.SetRoots(p.ca.CertPEM)
	if err := p.state.SetCertificate(&cert); err != nil {
		tb.Fatal(err)
	}
}

func TestEnvoysStreamsReachDiscoveryAsTheWorkloadIdentity(t *testing.T) {
	p := newPod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sotw, err := p.envoy.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local"}, TypeUrl: "cds"}); err != nil {
		t.Fatal(err)
	}
	// The stream waits for the workload certificate: once the relay
	// serves it (serve, before it waits), the certificate is given, and
	// the stream then reaches discovery as that identity (the stand-in
	// takes only a client certificate of the mesh). A relay that gave up
	// without a certificate would have ended the stream.
	xdstest.Eventually(t, "the relay serving the stream", func() bool {
		p.proxy.mu.Lock()
		defer p.proxy.mu.Unlock()
		return p.proxy.current != nil
	})
	if p.proxy.Connected() {
		t.Fatal("connected without a certificate")
	}
	p.give(t, "spiffe://cluster.local/ns/shop/sa/cart")
	resp, err := sotw.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVersionInfo() != "spiffe://cluster.local/ns/shop/sa/cart" || resp.GetNonce() != "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local" {
		t.Fatalf("discovery saw %q for node %q", resp.GetVersionInfo(), resp.GetNonce())
	}
	if !p.proxy.Connected() {
		t.Fatal("not connected after discovery answered")
	}
	// A second stream from Envoy replaces the first (delta here).
	delta, err := p.envoy.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "lds"}); err != nil {
		t.Fatal(err)
	}
	dresp, err := delta.Recv()
	if err != nil || dresp.GetSystemVersionInfo() != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("delta: %v, %v", dresp, err)
	}
	if _, err := sotw.Recv(); status.Code(err) != codes.Aborted {
		t.Fatalf("the replaced stream: %v, want Aborted", err)
	}
}

func TestDiscoveryEndingAStreamEndsEnvoysWithTheSameCodeAndEnvoyClosingItsSideEndsItWithOK(t *testing.T) {
	p := newPod(t)
	p.give(t, "spiffe://cluster.local/ns/shop/sa/cart")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, code := range []codes.Code{codes.PermissionDenied, codes.FailedPrecondition, codes.InvalidArgument, codes.ResourceExhausted, codes.Unauthenticated, codes.Internal, codes.Unavailable} {
		s, err := p.envoy.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "end/" + strconv.Itoa(int(code))}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); status.Code(err) != code {
			t.Errorf("discovery ended the stream with %v; Envoy got %v", code, err)
		}
	}
	// Envoy closing its side ends the relay cleanly: OK, which Envoy reads
	// as the end of the stream.
	s, err := p.envoy.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "cds"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: %v, want the stream ended with OK", err)
	}
}
