// Package xds serves Envoy's aggregated discovery service to sidecars and
// proxyless gRPC clients, state-of-the-world and delta, from the push
// contexts discovery builds. Each stream is served by its own goroutine:
// requests and pushes are handled in turn, so a stream never sends
// concurrently. Pushes go out in the order CDS, EDS, LDS, RDS so that a
// route never names a cluster the proxy does not have yet. A push whose
// content for a proxy is what it already has is not sent; a rejected
// (NACKed) version is not sent again until the configuration changes.
package xds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
	"github.com/flotilla-mesh/flotilla/services/discovery/proxy"
	"github.com/flotilla-mesh/flotilla/services/discovery/tokens"
)

// wildcardType: a type answered with every resource when the proxy
// names none (xdstype.Type.Wildcard).
func wildcardType(t string) bool {
	typ, ok := xdstype.Of(t)
	return ok && typ.Wildcard
}

// Limits on what a proxy may ask: names per request and per stream, the
// bytes of one name, and the bytes of the names a stream subscribes to
// (as many as a request may carry: 4 MiB).
const (
	maxResourceNames   = 100_000
	maxNameBytes       = 1024
	maxSubscribedBytes = 4 << 20
)

// SecretAccess tells whether the service account sa may read the Secrets
// of namespace ns: allowed, or why not; an error when it cannot tell.
type SecretAccess func(ctx context.Context, ns, sa string) (allowed bool, reason string, err error)

// Options configures a Server.
type Options struct {
	Log *slog.Logger
	// Tracer traces, under a push's span, each proxy's part of it
	// ("proxy.push": generation and sending) and each response's
	// acknowledgement ("proxy.ack", from the send to the ACK or NACK);
	// none when nil.
	Tracer trace.TracerProvider
	Meter  metric.Meter
	// IstioMeter is the meter of the metrics named as Istio's pilot names
	// them (telemetry.Providers.Istio); none when nil.
	IstioMeter metric.Meter
	// Concurrency bounds translations running at once; default twice the
	// number of CPUs.
	Concurrency int
	// SendTimeout bounds how long one response may wait for the proxy to
	// take it (HTTP/2 flow control: a proxy that reads nothing): past it
	// the stream is closed with DeadlineExceeded, and the proxy reconnects
	// and starts over. Zero waits for ever. Sending never holds a
	// translation slot, so a slow proxy delays only itself either way.
	SendTimeout time.Duration
	// VerifyIdentity refuses a proxy that presents a client certificate
	// (the mTLS port) whose SPIFFE ID names another namespace or service
	// account than its node claims: a workload cannot ask for another's
	// configuration. A proxy without a certificate (the plain-text port)
	// is not checked.
	VerifyIdentity bool
	// Tokens, when set, authenticates a proxy that connects over TLS with
	// no client certificate by the service-account token it sends
	// ("authorization: Bearer", as Istio's agent does), and refuses it
	// without a valid one: that identity is then checked against the node
	// exactly as a certificate's. Without Tokens such a proxy has no
	// identity (a TLS port that asks for no client certificate, as the
	// plain-text port).
	Tokens TokenAuthenticator
	// SystemNamespace is the control plane's: a debug client with a
	// certificate of it sees every proxy (internal/debugapi).
	SystemNamespace string
	// PlaintextDebug serves debug types to clients without a certificate
	// too: discovery sets it when its plain-text port listens on loopback
	// only (a local run, tests), never for a port other machines reach.
	PlaintextDebug bool
	// Replica names this replica in debug responses.
	Replica debugapi.Replica
	// SecretAccess tells whether a service account may read its
	// namespace's Secrets (galley's answer), asked before a proxy's
	// credentials are built; nil: every account may (no cluster).
	SecretAccess SecretAccess
	// ConnectionAge, when set, ends each proxy's stream after about that
	// long (±10 %), at its first moment with nothing in flight and at
	// the latest ConnectionAgeGrace later (age.go). The connection's own
	// GOAWAY must come before it, so that the proxy reconnects on a new
	// connection. ConnectionAgeGrace defaults to DefaultConnectionAgeGrace.
	ConnectionAge, ConnectionAgeGrace time.Duration
	// Registrar registers the WorkloadEntries of proxies that join with a
	// WorkloadGroup (node metadata AUTO_REGISTER_GROUP, Istio's
	// auto-registration): galley's WorkloadEntryService, told of their
	// connections and disconnections under Replica's ID
	// (RunRegistrations sends the disconnections). Nil refuses such
	// proxies.
	Registrar galleyv1.WorkloadEntryServiceClient
}

// TokenAuthenticator tells who a proxy is from its token, for a proxy at
// peerAddress; errors wrap tokens.ErrRefused or tokens.ErrUnavailable
// (services/discovery/tokens.Reviewer asks ca).
type TokenAuthenticator interface {
	Authenticate(ctx context.Context, token, peerAddress string) (id spiffe.ID, cached bool, err error)
}

// Server is the ADS server.
type Server struct {
	log             *slog.Logger
	tokens          TokenAuthenticator
	refusals        *rate.Limiter // log lines for refused proxies: peers choose how many they cause
	verifyIdentity  bool
	sendTimeout     time.Duration
	connectionAge   time.Duration
	ageGrace        time.Duration
	systemNamespace string
	plaintextDebug  bool
	secretAccess    SecretAccess
	registrations   *registrations
	replica         debugapi.Replica
	metrics         *metrics
	tracer          trace.Tracer
	sem             chan struct{}
	nonce           atomic.Uint64
	ledger          ledger
	held            heldSets  // what streams hold, shared among them
	encodings       encodings // what push contexts share, encoded

	mu    sync.Mutex
	pc    *model.PushContext
	seen  time.Time // when the change the current push context holds was first seen
	conns map[*conn]struct{}
}

// New returns a server with no push context: streams wait until the first
// Push.
func New(o Options) (*Server, error) {
	if o.Concurrency <= 0 {
		o.Concurrency = 2 * runtime.GOMAXPROCS(0)
	}
	s := &Server{
		log: o.Log.With("component", "xds"),
		sem: make(chan struct{}, o.Concurrency),

		tokens:          o.Tokens,
		refusals:        rate.NewLimiter(refusalLogsPerSecond, refusalLogBurst),
		verifyIdentity:  o.VerifyIdentity,
		sendTimeout:     o.SendTimeout,
		connectionAge:   o.ConnectionAge,
		ageGrace:        cmp.Or(o.ConnectionAgeGrace, DefaultConnectionAgeGrace),
		systemNamespace: o.SystemNamespace,
		plaintextDebug:  o.PlaintextDebug,
		secretAccess:    o.SecretAccess,
		registrations:   newRegistrations(o.Registrar, o.Replica.ID, o.Log.With("component", "xds")),
		replica:         o.Replica,
		conns:           map[*conn]struct{}{},
	}
	m, err := newMetrics(o.Meter, cmp.Or[metric.Meter](o.IstioMeter, noop.Meter{}), o.Replica.Info.Version)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.tracer = cmp.Or[trace.TracerProvider](o.Tracer, tracenoop.NewTracerProvider()).Tracer("flotilla/discovery")
	return s, nil
}

// RunRegistrations tells galley, until ctx ends, of the disconnections of
// the proxies it registered (Options.Registrar).
func (s *Server) RunRegistrations(ctx context.Context) { s.registrations.run(ctx) }

// Register adds the ADS service to a gRPC server.
func (s *Server) Register(gs *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
}

// Push makes pc current and tells every connected proxy what changed;
// seen is when the first change in it was observed (for convergence).
func (s *Server) Push(ctx context.Context, pc *model.PushContext, changes model.ChangeSet, seen time.Time) {
	s.mu.Lock()
	prev := s.pc
	s.pc, s.seen = pc, seen
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if prev == nil {
		changes.Full = true
	}
	s.ledger.record(pc.Seq, changes.Objects)
	changes.Objects = nil // the ledger's: not merged into every stream's pending push
	s.metrics.pushes(changes)
	ev := &pushEvent{pc: pc, prev: prev, changes: changes, seen: seen, affected: new(sync.Map), trace: trace.SpanContextFromContext(ctx)}
	if ev.trace.IsValid() {
		_, span := s.tracer.Start(ctx, "fanout", trace.WithAttributes(attribute.Int("proxies", len(conns))))
		if len(conns) == 0 {
			span.End()
		} else {
			ev.fanout = &fanout{span: span}
			ev.fanout.left.Store(int64(len(conns)))
		}
	}
	for _, c := range conns {
		c.enqueue(ev)
	}
}

// offload runs a stream's generation on a short-lived goroutine, at most
// Concurrency at once, while the stream's goroutine waits. Only
// generation takes a slot: sending waits on the proxy, and a proxy that
// reads slowly (or not at all) must not hold what the others need.
// Translation needs deep stacks; on the stream goroutines they would stay
// grown for the life of every connection, which at thousands of proxies is
// most of the process's memory.
func (s *Server) offload(f func()) {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

// Latest is the push context proxies are served from now (nil before
// the first push).
func (s *Server) Latest() *model.PushContext {
	pc, _ := s.current()
	return pc
}

func (s *Server) current() (*model.PushContext, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pc, s.seen
}

func (s *Server) nextNonce() string { return strconv.FormatUint(s.nonce.Add(1), 10) }

// StreamAggregatedResources serves state-of-the-world ADS.
// A stream whose first request asks for a debug type is a debug
// client's (debug.go).
func (s *Server) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	first, err := stream.Recv()
	if err != nil {
		return recvError(err)
	}
	if debugapi.IsDebugType(first.GetTypeUrl()) {
		return s.serveDebug(stream.Context(), first, stream.Recv, stream.Send)
	}
	recv := func(c *conn) (*sotwRequest, error) {
		if first != nil {
			req := first
			first = nil
			return &sotwRequest{DiscoveryRequest: req}, nil
		}
		req := &sotwRequest{DiscoveryRequest: &discoveryv3.DiscoveryRequest{}}
		if c != nil {
			req.subscribed = c.subscribed
		}
		if err := stream.RecvMsg(req); err != nil {
			return nil, err // unwrapped: gRPC's status, as Recv returns it
		}
		return req, nil
	}
	return serveStream(s, stream.Context(), recv, false,
		func(c *conn) { c.sendSotw = func(r *sotwResponse) error { return stream.SendMsg(r) } },
		(*conn).onSotwRequest)
}

// DeltaAggregatedResources serves incremental ADS. Debug types are served
// over state-of-the-world streams only, as istiod's debug clients use.
func (s *Server) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	first, err := stream.Recv()
	if err != nil {
		return recvError(err)
	}
	if debugapi.IsDebugType(first.GetTypeUrl()) {
		return status.Error(codes.InvalidArgument, "debug types are served over state-of-the-world ADS (StreamAggregatedResources)")
	}
	recv := func(*conn) (*discoveryv3.DeltaDiscoveryRequest, error) {
		if first != nil {
			req := first
			first = nil
			return req, nil
		}
		return stream.Recv()
	}
	return serveStream(s, stream.Context(), recv, true,
		func(c *conn) { c.sendDelta = func(r *deltaResponse) error { return stream.SendMsg(r) } },
		(*conn).onDeltaRequest)
}

// serveStream is one ADS stream: a goroutine reads and answers requests
// (the first identifies the proxy); pushes run on goroutines started when
// there is something to push. The handler's goroutine waits for the
// reader to end, or for the stream to be aborted (a send that timed out),
// which it ends at once: returning is what makes gRPC end the stream and
// release a send blocked on the proxy.
func serveStream[Req interface{ GetNode() *corev3.Node }](
	s *Server, ctx context.Context, recv func(*conn) (Req, error), delta bool,
	setSend func(*conn), onRequest func(*conn, context.Context, Req) error,
) error {
	aborted, retired := make(chan struct{}), make(chan struct{})
	var connected atomic.Pointer[conn]
	done := make(chan error, 1)
	go func() {
		var c *conn
		for {
			req, err := recv(c)
			if err != nil {
				done <- recvError(err)
				return
			}
			if c == nil {
				if c, err = s.connect(ctx, req.GetNode(), delta, setSend, aborted, retired); err != nil {
					done <- err
					return
				}
				connected.Store(c)
			}
			if err := c.handle(func() error { return onRequest(c, ctx, req) }); err != nil {
				done <- err
				return
			}
		}
	}()
	var err error
	select {
	case err = <-done:
	case <-aborted:
		err = connected.Load().abortedWith()
	case <-retired:
		// Past its connection age (age.go): the proxy reconnects, on a
		// new connection, the old one told to take no more streams.
	}
	if c := connected.Load(); c != nil {
		s.disconnect(c)
	}
	return err
}

func recvError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Canceled {
		return nil
	}
	return err // unwrapped: a gRPC status from the transport, returned as is
}

// connect identifies the proxy from its first request; a node that does
// not parse ends the stream with InvalidArgument and the reason.
func (s *Server) connect(ctx context.Context, node *corev3.Node, delta bool, setSend func(*conn), aborted, retired chan struct{}) (*conn, error) {
	p, err := proxy.FromNode(node)
	if err != nil {
		s.metrics.rejectedNodes.Add(ctx, 1)
		s.log.Warn("refusing a proxy", "node", clip.String(node.GetId(), 200), "error", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id, err := s.identify(ctx, p)
	if err != nil {
		s.metrics.rejectedNodes.Add(ctx, 1)
		if s.refusals.Allow() {
			s.log.Warn("refusing a proxy (such lines are rate-limited)", "node", clip.String(node.GetId(), 200), "peer", grpcserver.PeerIP(ctx), "error", clip.String(err.Error(), 512))
		}
		return nil, err
	}
	reg, err := s.registrations.connect(ctx, p, time.Now())
	if err != nil {
		s.metrics.rejectedNodes.Add(ctx, 1)
		if s.refusals.Allow() {
			s.log.Warn("refusing a proxy (such lines are rate-limited)", "node", clip.String(node.GetId(), 200), "peer", grpcserver.PeerIP(ctx), "error", clip.String(err.Error(), 512))
		}
		return nil, err
	}
	c := newConn(s, p, node.GetId(), delta)
	c.identity, c.aborted, c.retire.done, c.registration = id, aborted, retired, reg
	setSend(c)
	if s.connectionAge > 0 {
		c.startAge(s.connectionAge, s.ageGrace)
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.metrics.connected(ctx, p.IstioVersion, 1)
	s.log.Info("proxy connected", "proxy", c.id, "delta", delta, "generator", p.Generator)
	return c, nil
}

// identify reads the proxy's verified identity: its client certificate's
// SPIFFE ID or, over TLS without a certificate, its token's (Tokens); the
// plain-text port has none. With VerifyIdentity it refuses a node whose
// namespace or service account is not the identity's, as istiod's
// checkConnectionIdentity does (pilot/pkg/xds/ads.go). A node that names
// no service account takes the identity's.
func (s *Server) identify(ctx context.Context, p *model.Proxy) (string, error) {
	method, accepted := "certificate", "accepted"
	id, ok, err := spiffe.FromPeer(ctx)
	if !ok && s.tokens != nil && overTLS(ctx) {
		var cached bool
		method = "token"
		if id, cached, err = s.tokenIdentity(ctx); err != nil {
			return "", err
		}
		if cached {
			accepted = "cached"
		}
		ok = true
	}
	switch {
	case !ok:
		return "", nil
	case err != nil && s.verifyIdentity:
		s.metrics.authenticated(method, "refused")
		return "", status.Error(codes.PermissionDenied, "client certificate: "+err.Error())
	case err != nil:
		return "", nil // not checked: no identity to show
	}
	if s.verifyIdentity && (p.Namespace != id.Namespace || (p.ServiceAccount != "" && p.ServiceAccount != id.ServiceAccount)) {
		s.metrics.authenticated(method, "refused")
		return "", status.Errorf(codes.PermissionDenied, "node claims namespace %q and service account %q; its %s is %s",
			p.Namespace, p.ServiceAccount, method, id)
	}
	s.metrics.authenticated(method, accepted)
	if p.ServiceAccount == "" {
		p.ServiceAccount = id.ServiceAccount
	}
	p.VerifiedNamespace, p.VerifiedServiceAccount = id.Namespace, id.ServiceAccount
	return id.String(), nil
}

// tokenIdentity authenticates a proxy that came over TLS with no client
// certificate by its bearer token, as istiod authenticates Istio's agent
// (once per stream, at its first request).
func (s *Server) tokenIdentity(ctx context.Context) (id spiffe.ID, cached bool, err error) {
	token, err := bearer(ctx)
	if err != nil {
		s.metrics.authenticated("token", "refused")
		return spiffe.ID{}, false, status.Error(codes.Unauthenticated, err.Error())
	}
	id, cached, err = s.tokens.Authenticate(ctx, token, grpcserver.PeerIP(ctx))
	switch {
	case errors.Is(err, tokens.ErrRefused):
		s.metrics.authenticated("token", "refused")
		return spiffe.ID{}, false, status.Error(codes.Unauthenticated, err.Error())
	case err != nil:
		s.metrics.authenticated("token", "unavailable")
		return spiffe.ID{}, false, status.Error(codes.Unavailable, err.Error())
	}
	return id, cached, nil
}

// bearer is the token of the stream's one "authorization: Bearer" header.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	switch {
	case len(vals) == 0:
		return "", errors.New("no client certificate and no token: send the pod's service account token (audience istio-ca) as \"authorization: Bearer <token>\", or present a certificate from ca")
	case len(vals) > 1:
		return "", errors.New("more than one authorization header")
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("authorization is not a bearer token")
	}
	return tok, nil
}

// overTLS reports whether the stream came over TLS (the secure port).
func overTLS(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return false
	}
	_, isTLS := p.AuthInfo.(credentials.TLSInfo)
	return isTLS
}

// Log lines for refused proxies: a few a second at most, whatever peers
// send.
const (
	refusalLogsPerSecond = 1
	refusalLogBurst      = 20
)

func (s *Server) disconnect(c *conn) {
	c.close()
	c.stopAge()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.metrics.connected(context.Background(), c.proxy.IstioVersion, -1)
	s.registrations.disconnect(c.registration, time.Now())
	s.log.Info("proxy disconnected", "proxy", c.id)
}

// Conns returns the connected proxies' sync status, by ID.
func (s *Server) Conns() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c)
	}
	return out
}

// EnvoyFilterFinding is what the connected proxies met of one
// EnvoyFilter: its patches not applied, and why.
type EnvoyFilterFinding struct {
	Namespace, Name string
	// Problems are the distinct problems, sorted.
	Problems []string
	// Proxies counts the proxies that met any.
	Proxies int
}

// EnvoyFilterFindings are the problems the connected proxies met of each
// EnvoyFilter that has any, sorted by EnvoyFilter; galley writes them in
// the EnvoyFilters' status. Keys are the configuration's (EnvoyFilter
// names), never a proxy's.
func (s *Server) EnvoyFilterFindings() []EnvoyFilterFinding {
	byKey := map[string]*EnvoyFilterFinding{}
	for _, c := range s.Conns() {
		c.mu.Lock()
		for key, problems := range c.envoyFilterProblems() {
			f := byKey[key]
			if f == nil {
				ns, name, _ := strings.Cut(key, "/")
				f = &EnvoyFilterFinding{Namespace: ns, Name: name}
				byKey[key] = f
			}
			f.Proxies++
			for _, p := range problems {
				if !slices.Contains(f.Problems, p) {
					f.Problems = append(f.Problems, p)
				}
			}
		}
		c.mu.Unlock()
	}
	out := make([]EnvoyFilterFinding, 0, len(byKey))
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		f := byKey[key]
		slices.Sort(f.Problems)
		out = append(out, *f)
	}
	return out
}

// errTooMany is returned for requests naming too much.
func checkNames(names []string) error {
	if len(names) > maxResourceNames {
		return status.Error(codes.InvalidArgument, fmt.Sprintf("request names %d resources, more than %d", len(names), maxResourceNames))
	}
	for _, n := range names {
		if len(n) > maxNameBytes {
			return status.Error(codes.InvalidArgument, fmt.Sprintf("resource name of %d bytes, more than %d", len(n), maxNameBytes))
		}
	}
	return nil
}
