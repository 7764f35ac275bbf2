// Package sds serves the workload's identity to its Envoy over the Secret
// Discovery Service, on a Unix socket in the pod (Istio's
// /var/run/secrets/workload-spiffe-uds/socket). Two secrets exist, as in
// Istio: "default", the certificate chain and private key, and "ROOTCA",
// the trust bundle. Every open stream, state-of-the-world or delta, gets a
// rotated certificate or bundle pushed as soon as the agent holds it.
//
// A name other than those two does not exist here. Istio's agent hands
// the workload certificate out under any other name; Flotilla does not:
// a state-of-the-world response leaves the name out (Envoy keeps waiting
// for it until its initial_fetch_timeout, and the listener needing it
// stays warming), and a delta response lists it as removed, which is how
// the delta protocol says a resource does not exist.
package sds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
)

// The secrets served (the names discovery's TLS contexts ask for), and
// their type URL.
const (
	SecretWorkload = proxycontract.SecretWorkload
	SecretRoot     = proxycontract.SecretRoot
	TypeURL        = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

	// SocketPath is Istio's workload SDS socket.
	SocketPath = "/var/run/secrets/workload-spiffe-uds/socket"

	maxNames     = 64
	maxNameBytes = 512

	// removed marks, among the versions a delta stream's proxy holds, a
	// name it was told does not exist.
	removed = "\x00removed"
)

// Server is the SDS server of one pod.
type Server struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer
	state  *identity.State
	log    *slog.Logger
	nonces atomic.Uint64
}

// New returns a server of state's secrets.
func New(state *identity.State, log *slog.Logger) *Server {
	return &Server{state: state, log: log.With("component", "sds")}
}

// Register adds the service to gs.
func (s *Server) Register(gs *grpc.Server) { secretv3.RegisterSecretDiscoveryServiceServer(gs, s) }

// secret is one served secret, encoded, with a version that is the hash
// of its content.
type secret struct {
	any     *anypb.Any
	version string
}

// secrets are the secrets snap holds (none before a certificate and
// roots are held).
func secrets(snap identity.Snapshot) map[string]secret {
	out := map[string]secret{}
	for _, s := range held(snap, snap.KeyPEM) {
		out[s.GetName()] = encode(s)
	}
	return out
}

// Redacted are the secrets snap holds as SDS serves them, the private key
// replaced by "[redacted]" as Envoy's config dump shows it: what the
// agent's debug endpoint (debugapi.AgentSecretsPath) shows.
func Redacted(snap identity.Snapshot) []*tlsv3.Secret { return held(snap, []byte("[redacted]")) }

// held are the workload certificate chain with key, and the trust
// bundle, as far as snap holds them.
func held(snap identity.Snapshot, key []byte) []*tlsv3.Secret {
	var out []*tlsv3.Secret
	if snap.Leaf != nil {
		out = append(out, &tlsv3.Secret{Name: SecretWorkload, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(snap.ChainPEM), PrivateKey: inline(key),
		}}})
	}
	if len(snap.RootsPEM) > 0 {
		out = append(out, &tlsv3.Secret{Name: SecretRoot, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(snap.RootsPEM),
		}}})
	}
	return out
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

func encode(m *tlsv3.Secret) secret {
	a, err := anypb.New(m)
	if err != nil { // a Secret always marshals
		panic(err)
	}
	sum := sha256.Sum256(a.GetValue())
	return secret{any: a, version: hex.EncodeToString(sum[:8])}
}

// known reports whether name is a secret this server can ever serve.
func known(name string) bool { return name == SecretWorkload || name == SecretRoot }

func checkNames(names []string) error {
	if len(names) > maxNames {
		return status.Errorf(codes.InvalidArgument, "%d secret names, more than %d", len(names), maxNames)
	}
	for _, n := range names {
		if len(n) > maxNameBytes {
			return status.Errorf(codes.InvalidArgument, "a secret name of %d bytes, more than %d", len(n), maxNameBytes)
		}
	}
	return nil
}

func checkType(t string) error {
	if t != "" && t != TypeURL {
		return status.Errorf(codes.InvalidArgument, "type %.100q is not served here: SDS serves %s", t, TypeURL)
	}
	return nil
}

func (s *Server) nonce() string { return strconv.FormatUint(s.nonces.Add(1), 10) }

// receive forwards a stream's requests to a channel until the stream
// ends (ctx is the stream's, done when its handler returns); the error
// ends it.
func receive[T any](ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	reqs, errs := make(chan T), make(chan error, 1)
	go func() {
		for {
			r, err := recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errs
}

// streamEnd maps the end of a client's stream to what the handler returns.
func streamEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

// FetchSecrets answers one request with the named secrets held now.
func (s *Server) FetchSecrets(_ context.Context, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
	if err := errors.Join(checkType(req.GetTypeUrl()), checkNames(req.GetResourceNames())); err != nil {
		return nil, err
	}
	snap := s.state.Snapshot()
	have := secrets(snap)
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: strconv.FormatUint(snap.Version, 10), TypeUrl: TypeURL, Nonce: s.nonce()}
	for _, n := range req.GetResourceNames() {
		if sec, ok := have[n]; ok {
			resp.Resources = append(resp.Resources, sec.any)
		}
	}
	return resp, nil
}

// protocol is how one stream, state-of-the-world or delta, answers the
// secrets' changes and its proxy's requests; an error of either ends the
// stream.
type protocol[Req any] interface {
	changed(snap identity.Snapshot) error
	request(req Req) error
}

// serve runs a stream until it ends: every change of the secrets held is
// handed to p, and every request of the stream's proxy.
func serve[Req any](ctx context.Context, state *identity.State, recv func() (Req, error), p protocol[Req]) error {
	reqs, errs := receive(ctx, recv)
	var seen uint64 // the state's version last looked at
	for {
		// The channel is taken before the state is read, so a change
		// between the two is never missed.
		changed := state.Changed()
		if snap := state.Snapshot(); snap.Version != seen {
			seen = snap.Version
			if err := p.changed(snap); err != nil {
				return streamEnd(ctx, err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return streamEnd(ctx, err)
		case req := <-reqs:
			if err := p.request(req); err != nil {
				return streamEnd(ctx, err)
			}
		case <-changed: // read at the top of the loop
		}
	}
}

// StreamSecrets serves state-of-the-world SDS: each (changed) request is
// answered with the named secrets held, and every change of them is
// pushed; ACKs are recorded, a NACK is logged and nothing is resent until
// the secrets change.
func (s *Server) StreamSecrets(stream secretv3.SecretDiscoveryService_StreamSecretsServer) error {
	return serve(stream.Context(), s.state, stream.Recv, &sotw{s: s, stream: stream, warned: map[string]bool{}})
}

// sotw is a state-of-the-world stream's protocol.
type sotw struct {
	s           *Server
	stream      secretv3.SecretDiscoveryService_StreamSecretsServer
	names       []string
	lastNonce   string
	sentVersion uint64
	sent        bool
	warned      map[string]bool
}

func (p *sotw) changed(snap identity.Snapshot) error {
	if len(p.names) > 0 && p.ready(snap) && (!p.sent || snap.Version != p.sentVersion) {
		return p.respond(snap)
	}
	return nil
}

func (p *sotw) request(req *discoveryv3.DiscoveryRequest) error {
	if err := errors.Join(checkType(req.GetTypeUrl()), checkNames(req.GetResourceNames())); err != nil {
		return err
	}
	if n := req.GetResponseNonce(); n != "" && n != p.lastNonce {
		return nil // answered by a later response already
	}
	if d := req.GetErrorDetail(); d != nil {
		p.s.log.Warn("the proxy rejected its secrets", "version", p.sentVersion, "error", clip.String(d.GetMessage(), 1024))
		return nil
	}
	asked := slices.Clone(req.GetResourceNames())
	slices.Sort(asked)
	asked = slices.Compact(asked)
	if p.sent && slices.Equal(asked, p.names) {
		return nil // an ACK
	}
	p.names = asked
	if len(p.names) == 0 {
		p.sent = false // unsubscribed: nothing to send until asked again
		return nil
	}
	if snap := p.s.state.Snapshot(); p.ready(snap) {
		return p.respond(snap)
	}
	p.sent = false // answered when the secrets arrive
	return nil
}

func (p *sotw) respond(snap identity.Snapshot) error {
	have := secrets(snap)
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: strconv.FormatUint(snap.Version, 10), TypeUrl: TypeURL, Nonce: p.s.nonce()}
	for _, n := range p.names {
		sec, ok := have[n]
		switch {
		case ok:
			resp.Resources = append(resp.Resources, sec.any)
		case !known(n) && !p.warned[n] && len(p.warned) < maxNames:
			p.warned[n] = true
			p.s.log.Warn("a proxy asked for a secret that does not exist here; it is left out", "name", n)
		}
	}
	if err := p.stream.Send(resp); err != nil {
		return err
	}
	p.lastNonce, p.sentVersion, p.sent = resp.GetNonce(), snap.Version, true
	return nil
}

// ready says whether the named secrets that can exist are all held, so no
// half answer is sent while the first certificate is on its way.
func (p *sotw) ready(snap identity.Snapshot) bool {
	for _, n := range p.names {
		if (n == SecretWorkload && snap.Leaf == nil) || (n == SecretRoot && len(snap.RootsPEM) == 0) {
			return false
		}
	}
	return true
}

// DeltaSecrets serves incremental SDS: subscribed secrets are sent when
// their content differs from what the proxy holds (its initial versions
// count), a name that does not exist is answered as removed, and every
// change of a subscribed secret is pushed alone.
func (s *Server) DeltaSecrets(stream secretv3.SecretDiscoveryService_DeltaSecretsServer) error {
	return serve(stream.Context(), s.state, stream.Recv, &delta{s: s, stream: stream, subscribed: map[string]bool{}, held: map[string]string{}})
}

// delta is an incremental stream's protocol.
type delta struct {
	s          *Server
	stream     secretv3.SecretDiscoveryService_DeltaSecretsServer
	subscribed map[string]bool
	held       map[string]string // name → version the proxy holds
	lastNonce  string
}

func (p *delta) changed(snap identity.Snapshot) error { return p.push(snap) }

func (p *delta) request(req *discoveryv3.DeltaDiscoveryRequest) error {
	if err := errors.Join(checkType(req.GetTypeUrl()), checkNames(req.GetResourceNamesSubscribe()),
		checkNames(req.GetResourceNamesUnsubscribe())); err != nil {
		return err
	}
	if len(req.GetInitialResourceVersions()) > maxNames {
		return status.Errorf(codes.InvalidArgument, "%d initial resource versions, more than %d", len(req.GetInitialResourceVersions()), maxNames)
	}
	if d := req.GetErrorDetail(); d != nil && req.GetResponseNonce() == p.lastNonce {
		p.s.log.Warn("the proxy rejected its secrets", "error", clip.String(d.GetMessage(), 1024))
	}
	for n, v := range req.GetInitialResourceVersions() {
		p.subscribed[n], p.held[n] = true, v
	}
	for _, n := range req.GetResourceNamesSubscribe() {
		if !p.subscribed[n] {
			p.subscribed[n] = true
			delete(p.held, n) // newly asked for: sent even if unchanged
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		delete(p.subscribed, n)
		delete(p.held, n)
	}
	if len(p.subscribed) > maxNames {
		return status.Errorf(codes.InvalidArgument, "%d secrets subscribed, more than %d", len(p.subscribed), maxNames)
	}
	return p.push(p.s.state.Snapshot())
}

// push sends what the proxy does not hold of the subscribed secrets, if
// anything.
func (p *delta) push(snap identity.Snapshot) error {
	have := secrets(snap)
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: TypeURL, SystemVersionInfo: strconv.FormatUint(snap.Version, 10)}
	for _, n := range slices.Sorted(maps.Keys(p.subscribed)) {
		sec, ok := have[n]
		switch {
		case ok && p.held[n] != sec.version:
			resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: n, Version: sec.version, Resource: sec.any})
			p.held[n] = sec.version
		case !known(n) && p.held[n] != removed:
			resp.RemovedResources = append(resp.RemovedResources, n)
			p.held[n] = removed
		}
	}
	if len(resp.Resources) == 0 && len(resp.RemovedResources) == 0 {
		return nil
	}
	resp.Nonce = p.s.nonce()
	p.lastNonce = resp.Nonce
	return p.stream.Send(resp)
}
