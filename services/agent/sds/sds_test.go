package sds

import (
	"context"
	"crypto/tls"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
	"github.com/flotilla-mesh/flotilla/services/agent/uds"
)

// pod is an SDS server on a Unix socket in a temporary directory, with
// the state it serves and a mesh CA to issue certificates.
type pod struct {
	state *identity.State
	ca    *testpki.CA
	conn  *grpc.ClientConn
}

func newPod(tb testing.TB) *pod {
	tb.Helper()
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		tb.Fatal(err)
	}
	p := &pod{state: identity.New(), ca: ca}
	dir, err := os.MkdirTemp("", "sds") // a Unix socket path has at most 107 bytes
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "workload-spiffe-uds", "socket")
	lis, err := uds.Listen(sock, uds.Private)
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer()
	New(p.state, slog.New(slog.DiscardHandler)).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	if p.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.conn.Close() })
	return p
}

// rotate gives the pod a new certificate for uri.
func (p *pod) rotate(tb testing.TB, uri string) {
	tb.Helper()
	leaf, err := p.ca.Issue(testpki.Request{CommonName: "w", URIs: []string{uri}})
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.state.SetCertificate(&cert); err != nil {
		tb.Fatal(err)
	}
}

// decode checks a secret with its generated Validate and returns it.
func decode(t *testing.T, r *anypb.Any) *tlsv3.Secret {
	t.Helper()
	if r.GetTypeUrl() != TypeURL {
		t.Fatalf("type %s", r.GetTypeUrl())
	}
	s := &tlsv3.Secret{}
	if err := r.UnmarshalTo(s); err != nil {
		t.Fatal(err)
	}
	if err := s.ValidateAll(); err != nil {
		t.Fatalf("secret %s fails Validate: %v", s.GetName(), err)
	}
	return s
}

// leafURI is the SPIFFE ID of a served workload secret, which must hold a
// chain and a key that make a pair.
func leafURI(t *testing.T, s *tlsv3.Secret) string {
	t.Helper()
	tc := s.GetTlsCertificate()
	cert, err := tls.X509KeyPair(tc.GetCertificateChain().GetInlineBytes(), tc.GetPrivateKey().GetInlineBytes())
	if err != nil {
		t.Fatalf("the served chain and key: %v", err)
	}
	return cert.Leaf.URIs[0].String()
}

// reader receives a stream's messages in one goroutine, so a wait that
// times out loses nothing.
type reader[T any] struct {
	t    *testing.T
	msgs chan T
	errs chan error
}

func read[T any](t *testing.T, recv func() (T, error)) *reader[T] {
	t.Helper()
	r := &reader[T]{t: t, msgs: make(chan T, 16), errs: make(chan error, 1)}
	go func() {
		for {
			v, err := recv()
			if err != nil {
				r.errs <- err
				return
			}
			r.msgs <- v
		}
	}()
	return r
}

// next returns the next message within d, or false.
func (r *reader[T]) next(d time.Duration) (T, bool) {
	r.t.Helper()
	select {
	case v := <-r.msgs:
		return v, true
	case err := <-r.errs:
		r.t.Fatal(err)
	case <-time.After(d):
	}
	var zero T
	return zero, false
}

func node() *corev3.Node {
	return &corev3.Node{Id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local"}
}

func TestStateOfTheWorldSecretsAreSentWhenHeldAndPushedWhenRotated(t *testing.T) {
	p := newPod(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(p.conn).StreamSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: TypeURL, ResourceNames: []string{SecretWorkload, SecretRoot, "not-a-secret"}}); err != nil {
		t.Fatal(err)
	}
	in := read(t, stream.Recv)
	if _, got := in.next(300 * time.Millisecond); got {
		t.Fatal("a response before any certificate is held")
	}
	p.state.SetRoots(p.ca.CertPEM)
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart")
	resp, ok := in.next(10 * time.Second)
	if !ok {
		t.Fatal("no response once the certificate and roots are held")
	}
	byName := map[string]*tlsv3.Secret{}
	for _, r := range resp.GetResources() {
		s := decode(t, r)
		byName[s.GetName()] = s
	}
	if len(byName) != 2 || byName[SecretRoot] == nil || string(byName[SecretRoot].GetValidationContext().GetTrustedCa().GetInlineBytes()) != string(p.ca.CertPEM) {
		t.Fatalf("got secrets %v: want default and ROOTCA with the roots, and nothing for an unknown name", slices.Collect(maps.Keys(byName)))
	}
	if got := leafURI(t, byName[SecretWorkload]); got != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("served %s", got)
	}
	// An ACK gets no response.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResourceNames: []string{SecretWorkload, SecretRoot, "not-a-secret"}, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	if _, got := in.next(300 * time.Millisecond); got {
		t.Fatal("an ACK was answered")
	}
	// A rotation is pushed on the open stream.
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart-rotated")
	pushed, ok := in.next(10 * time.Second)
	if !ok {
		t.Fatal("the rotated certificate was not pushed")
	}
	if pushed.GetVersionInfo() == resp.GetVersionInfo() {
		t.Fatal("the push has the old version")
	}
	// SotW: the push holds every secret the stream watches, the rotated
	// certificate among them (a push without it would leave Envoy the old
	// one: the check must not pass for its absence).
	rotated := ""
	for _, r := range pushed.GetResources() {
		if s := decode(t, r); s.GetName() == SecretWorkload {
			rotated = leafURI(t, s)
		}
	}
	if rotated != "spiffe://cluster.local/ns/shop/sa/cart-rotated" {
		t.Fatalf("the push's %s certificate is %q, want the rotated one", SecretWorkload, rotated)
	}
}

func TestDeltaSecretsSendWhatChangedAndAnswerAnUnknownNameAsRemoved(t *testing.T) {
	p := newPod(t)
	p.state.SetRoots(p.ca.CertPEM)
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(p.conn).DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(), TypeUrl: TypeURL, ResourceNamesSubscribe: []string{SecretWorkload, SecretRoot, "not-a-secret"}}); err != nil {
		t.Fatal(err)
	}
	in := read(t, stream.Recv)
	first, ok := in.next(10 * time.Second)
	if !ok {
		t.Fatal("no response")
	}
	versions := map[string]string{}
	for _, r := range first.GetResources() {
		s := decode(t, r.GetResource())
		versions[s.GetName()] = r.GetVersion()
	}
	if len(versions) != 2 || !slices.Equal(first.GetRemovedResources(), []string{"not-a-secret"}) {
		t.Fatalf("first response: %v, removed %v", versions, first.GetRemovedResources())
	}
	if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart-rotated")
	pushed, ok := in.next(10 * time.Second)
	if !ok {
		t.Fatal("the rotation was not pushed")
	}
	if len(pushed.GetResources()) != 1 || pushed.GetResources()[0].GetName() != SecretWorkload || len(pushed.GetRemovedResources()) != 0 {
		t.Fatalf("pushed %d resources (%v removed): want the workload certificate alone, the roots being unchanged", len(pushed.GetResources()), pushed.GetRemovedResources())
	}
	if got := leafURI(t, decode(t, pushed.GetResources()[0].GetResource())); got != "spiffe://cluster.local/ns/shop/sa/cart-rotated" {
		t.Fatalf("pushed %s", got)
	}

	// A reconnecting proxy that holds the current roots gets only what it
	// lacks.
	again, err := secretv3.NewSecretDiscoveryServiceClient(p.conn).DeltaSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(), TypeUrl: TypeURL, InitialResourceVersions: map[string]string{SecretRoot: versions[SecretRoot]}, ResourceNamesSubscribe: []string{SecretWorkload}}); err != nil {
		t.Fatal(err)
	}
	resumed, ok := read(t, again.Recv).next(10 * time.Second)
	if !ok || len(resumed.GetResources()) != 1 || resumed.GetResources()[0].GetName() != SecretWorkload {
		t.Fatalf("a resumed stream holding the roots got %v", resumed.GetResources())
	}
}

func TestHostileRequestsEndOnlyTheirOwnStream(t *testing.T) {
	p := newPod(t)
	p.state.SetRoots(p.ca.CertPEM)
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := secretv3.NewSecretDiscoveryServiceClient(p.conn)
	many := make([]string, maxNames+1)
	for i := range many {
		many[i] = string(rune('a' + i%26))
	}
	for name, req := range map[string]*discoveryv3.DiscoveryRequest{
		"too many names":   {TypeUrl: TypeURL, ResourceNames: many},
		"a huge name":      {TypeUrl: TypeURL, ResourceNames: []string{string(make([]byte, maxNameBytes+1))}},
		"another xDS type": {TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResourceNames: []string{SecretWorkload}},
	} {
		s, err := client.StreamSecrets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// The server still serves.
	resp, err := client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResourceNames: []string{SecretRoot}})
	if err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("FetchSecrets after hostile streams: %v, %v", resp, err)
	}
}

// FuzzSecretStreams sends what the fuzzer makes of a state-of-the-world
// and a delta SDS request, three times each, on real streams over the
// Unix socket: the server answers or ends the stream with a status, never
// fails, and Envoy's ordinary request is answered afterwards.
func FuzzSecretStreams(f *testing.F) {
	seed := func(m proto.Message) []byte {
		b, _ := proto.Marshal(m)
		return b
	}
	f.Add(seed(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResourceNames: []string{SecretWorkload, "x"}}),
		seed(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: TypeURL, ResourceNamesSubscribe: []string{SecretRoot}, ResourceNamesUnsubscribe: []string{"*"}}))
	f.Add(seed(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: "9", VersionInfo: "v"}), []byte{0xff, 0x00})
	p := newPod(f)
	p.state.SetRoots(p.ca.CertPEM)
	p.rotate(f, "spiffe://cluster.local/ns/shop/sa/cart")
	client := secretv3.NewSecretDiscoveryServiceClient(p.conn)
	f.Fuzz(func(t *testing.T, sotwBytes, deltaBytes []byte) {
		var sreq discoveryv3.DiscoveryRequest
		if proto.Unmarshal(sotwBytes, &sreq) == nil {
			sreq.Node = node()
			xdstest.SendAndDrain(func(ctx context.Context) (secretv3.SecretDiscoveryService_StreamSecretsClient, error) {
				return client.StreamSecrets(ctx)
			}, &sreq, 3)
		}
		var dreq discoveryv3.DeltaDiscoveryRequest
		if proto.Unmarshal(deltaBytes, &dreq) == nil {
			dreq.Node = node()
			xdstest.SendAndDrain(func(ctx context.Context) (secretv3.SecretDiscoveryService_DeltaSecretsClient, error) {
				return client.DeltaSecrets(ctx)
			}, &dreq, 3)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResourceNames: []string{SecretRoot}})
		if err != nil || len(resp.GetResources()) != 1 {
			t.Fatalf("FetchSecrets after the fuzzed streams: %v, %v", resp, err)
		}
	})
}

// The debug endpoint's secrets are the served ones with the key left out.
func TestRedactedSecretsAreTheServedOnesWithoutTheKey(t *testing.T) {
	p := newPod(t)
	if got := Redacted(p.state.Snapshot()); len(got) != 0 {
		t.Fatalf("before anything is held: %v", got)
	}
	p.state.SetRoots(p.ca.CertPEM)
	p.rotate(t, "spiffe://cluster.local/ns/shop/sa/cart")
	snap := p.state.Snapshot()
	got := Redacted(snap)
	if len(got) != 2 || got[0].GetName() != SecretWorkload || got[1].GetName() != SecretRoot {
		t.Fatalf("secrets %v", got)
	}
	tc := got[0].GetTlsCertificate()
	if string(tc.GetCertificateChain().GetInlineBytes()) != string(snap.ChainPEM) || string(tc.GetPrivateKey().GetInlineBytes()) != "[redacted]" {
		t.Fatalf("the workload secret: %v", tc)
	}
	if string(got[1].GetValidationContext().GetTrustedCa().GetInlineBytes()) != string(snap.RootsPEM) {
		t.Fatalf("the roots: %v", got[1])
	}
}
