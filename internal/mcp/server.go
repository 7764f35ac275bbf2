package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
)

// ErrUnknownType is returned for a type URL the server does not publish.
var ErrUnknownType = errors.New("unknown MCP collection")

// ResourceTypeURL types every resource's Any, as Istio's MCP sinks expect
// (the collection is the request's type URL, not the Any's).
const ResourceTypeURL = "type.googleapis.com/istio.mcp.v1alpha1.Resource"

// maxUnknownLogged bounds the unknown collections remembered for logging.
const maxUnknownLogged = 100

// emptyVersion is the version of a collection the server does not
// publish: that of an empty one (computeVersion over no resources).
func emptyVersion() string { return contentHash(nil) }

// unknownCollection answers a request for a collection the server does
// not publish: an empty collection, as Istio's pilot expects of its config
// sources (it asks for kinds galley has no use for), never a closed
// stream. Logged once per collection. Called with s.mu held.
func (s *Server) unknownCollection(typeURL string) {
	if !s.unknown[typeURL] && len(s.unknown) < maxUnknownLogged {
		s.unknown[typeURL] = true
		s.log.Info("a subscriber asked for a collection not published; it gets an empty one", "type_url", clip.String(typeURL, 200))
	}
}

// Server publishes collections of resources to subscribers. It is safe for
// concurrent use.
type Server struct {
	log     *slog.Logger
	xds     serverv3.Server
	metrics serverMetrics

	mu          sync.Mutex
	collections map[string]*collection
	// unknown are the collections asked for that the server does not
	// publish, logged once each (at most maxUnknownLogged of them).
	unknown map[string]bool
	// streams are the open streams, each its own subscriber (never keyed
	// by go-control-plane's stream numbers, which two streams may share);
	// nextStream numbers them for the logs.
	streams    map[*subscriber]struct{}
	nextStream uint64
	nextWatch  uint64
	// restricted collections are served only to the identities their
	// function allows (Restrict).
	restricted map[string]func(identity string) bool
	// controlPlane names the server in its responses (Identify).
	controlPlane *corev3.ControlPlane
	debugNonce   atomic.Uint64
	// debug answers the debug types served beside debugapi.Subscribers
	// (ServeDebug), by type URL.
	debug map[string]func() ([]*structpb.Struct, error)
}

// Restrict serves a collection only to subscribers whose identity (the
// SPIFFE ID of their client certificate; "plaintext" without one) allow
// accepts: a request for it from anyone else ends the stream with
// PermissionDenied (what galley does with credentials, for discovery
// only). Its aliases, made before or after, are restricted alike. Call
// before serving.
func (s *Server) Restrict(typeURL string, allow func(identity string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restricted[typeURL] = allow
	if c, ok := s.collections[typeURL]; ok {
		for _, a := range c.aliases {
			s.restricted[a.typeURL] = allow
		}
	}
}

// collection is one type URL: a LinearCache serves delta; the sotw fields
// serve state-of-the-world with full state in every response.
type collection struct {
	typeURL string
	// raw collections carry each resource's body itself, not wrapped in
	// an MCP Resource (an alias such as Istio's mesh config collection);
	// rawType is the bodies' type URL, read without the server's lock.
	raw     bool
	rawType atomic.Pointer[string]
	// aliases are collections that mirror this one (Server.Alias).
	aliases []*collection
	linear  *cache.LinearCache
	hashes  map[string]string     // name → content hash, to skip no-op updates
	encoded map[string]*anypb.Any // name → encoded resource, for sotw
	version string                // hash of the whole collection, for sotw
	watches map[uint64]sotwWatch
	// published says when each resource's content was last published,
	// for delta responses to carry (read by the streams under pubMu alone).
	pubMu     sync.RWMutex
	published map[string]*corev3.Metadata
}

type sotwWatch struct {
	req  *cache.Request
	ch   chan cache.Response
	done chan struct{} // closed when the server cancels the watch
}

// deliver sends resp without blocking the caller. The go-control-plane ADS
// loop creates watches and drains their shared channel on one goroutine,
// and that channel holds fewer responses than we have collections: a
// blocking send from CreateWatch could deadlock it. A cancelled watch drops
// its response; the request that cancelled it gets a fresh one.
func (w sotwWatch) deliver(resp cache.Response) {
	go func() {
		select {
		case w.ch <- resp:
		case <-w.done:
		}
	}()
}

// subscriber is one stream's subscriber, as its requests showed it.
type subscriber struct {
	stream uint64 // galley's number for the stream, in logs
	id     string // node ID
	// version is what the subscriber's node metadata says it runs
	// (VersionMetadata); connected when its stream opened.
	version   string
	connected time.Time
	// announce logs the subscriber at INFO once its stream has stayed
	// open announceAfter (nil until identified); announced says it did.
	announce  *time.Timer
	announced bool
	// label names the subscriber in metrics: its SPIFFE ID on the mTLS
	// port, "plaintext" otherwise. Node IDs are the subscriber's to choose,
	// and one per connection would grow the series without end.
	label string
	// types is the stream's state per collection asked for: at most
	// MaxCollections published ones and maxUnpublishedTypes others
	// (published and unpublished count them).
	types                  map[string]*typeState
	published, unpublished int
	// names and bytes total the names subscribed over all collections.
	names, bytes int
	// paced holds back every request but the first answer to a response
	// (a NACK or ACK repeated in a loop, a fresh nonce each time,
	// subscriptions changed over and over): a subscriber looping costs
	// itself time, and galley little.
	paced *rate.Limiter
}

// typeState is one collection's state on one stream.
type typeState struct {
	// names are the names subscribed: for delta what was subscribed less
	// what was unsubscribed of it (an unknown name unsubscribed buys
	// nothing); for state of the world the last request's. bytes is the
	// sum of their lengths.
	names map[string]struct{}
	bytes int
	// sent is the nonce of the latest response, sentVersion its version
	// and sentAt when it was sent; answered says the subscriber answered
	// it (ACK or NACK); rejected is the reason of the latest response
	// rejected (cut short), nackLogged the version whose NACK was logged.
	sent, sentVersion string
	sentAt            time.Time
	answered          bool
	rejected          string
	nackLogged        string
}

// A subscriber's requests, but the first answer to each response, are
// served at this rate (with this burst) at most. A stream may subscribe
// to this many names, of these many bytes, over all collections, and ask
// for this many collections the server does not publish.
const (
	pacedRequestsPerSecond = 50
	pacedRequestsBurst     = 100
	maxSubscribedNames     = 10_000
	maxSubscribedBytes     = 1 << 20
	maxUnpublishedTypes    = 64
)

// announceAfter is how long a subscriber's stream stays open before its
// connection and end are logged at INFO: a discovery replica's stays for
// hours; a command's (flotilla wait, analyze --live) reads once and
// goes, logged at DEBUG, so the CLI is not a line at INFO per call. How
// long a stream lasted is galley's to see, not the subscriber's to say.
const announceAfter = time.Second

func newSubscriber(label string) *subscriber {
	return &subscriber{
		label: label, connected: time.Now(), types: map[string]*typeState{},
		paced: rate.NewLimiter(pacedRequestsPerSecond, pacedRequestsBurst),
	}
}

// asked is one request as the server decides it.
type asked struct {
	node    *corev3.Node
	typeURL string
	nonce   string
	// nack is the request's error detail, nil for an ACK or a subscription.
	nack error
	// subscribe and unsubscribe change the names subscribed (delta);
	// replace says subscribe replaces them (state of the world).
	subscribe, unsubscribe []string
	replace                bool
}

// subscribe applies a request's names to ts and to the stream's totals,
// at a cost that grows with the request, never with the set; it refuses
// a stream over maxSubscribedNames or maxSubscribedBytes.
func (sub *subscriber) subscribe(ts *typeState, r *asked) error {
	if r.replace {
		sub.names -= len(ts.names)
		sub.bytes -= ts.bytes
		ts.names, ts.bytes = nil, 0
	}
	for _, n := range r.unsubscribe {
		if _, ok := ts.names[n]; ok {
			delete(ts.names, n)
			ts.bytes -= len(n)
			sub.names--
			sub.bytes -= len(n)
		}
	}
	for _, n := range r.subscribe {
		if _, ok := ts.names[n]; ok {
			continue
		}
		if sub.names >= maxSubscribedNames || sub.bytes+len(n) > maxSubscribedBytes {
			return status.Errorf(codes.ResourceExhausted,
				"the subscriber subscribes to more than %d names or %d bytes of names", maxSubscribedNames, maxSubscribedBytes)
		}
		if ts.names == nil {
			ts.names = map[string]struct{}{}
		}
		ts.names[n] = struct{}{}
		ts.bytes += len(n)
		sub.names++
		sub.bytes += len(n)
	}
	return nil
}

type serverMetrics struct {
	subscribers metric.Int64UpDownCounter
	responses   metric.Int64Counter
	resources   metric.Int64Counter
	nacks       metric.Int64Counter
}

// MaxCollections is how many published collections one stream may
// subscribe to. A delta stream's responses share one channel of
// go-control-plane's, buffered 2×types.UnknownType; each collection's
// watch holds at most one response until the stream takes it, so with no
// more collections than that buffer a subscriber that never reads can
// never block a collection's update (which sends with the cache's lock
// held) for the others. A server may publish more (galley does: every
// Istio kind, the registry and the aliases); no stream holds more.
const MaxCollections = 2 * int(types.UnknownType)

// NewServer returns a server publishing the given collections, all empty.
func NewServer(ctx context.Context, log *slog.Logger, meter metric.Meter, typeURLs []string) (*Server, error) {
	s := &Server{
		log:         log.With("component", "mcp-server"),
		collections: map[string]*collection{},
		streams:     map[*subscriber]struct{}{},
		unknown:     map[string]bool{},
		restricted:  map[string]func(string) bool{},
	}
	var err error
	m := &s.metrics
	if m.subscribers, err = meter.Int64UpDownCounter("flotilla.mcp.server.subscribers",
		metric.WithDescription("Open MCP subscription streams.")); err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	if m.responses, err = meter.Int64Counter("flotilla.mcp.server.responses",
		metric.WithDescription("MCP responses sent, per subscriber identity (SPIFFE ID, or plaintext) and collection.")); err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	if m.resources, err = meter.Int64Counter("flotilla.mcp.server.resources_sent",
		metric.WithDescription("Resources sent in MCP responses, per subscriber identity (SPIFFE ID, or plaintext) and collection.")); err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	if m.nacks, err = meter.Int64Counter("flotilla.mcp.server.nacks",
		metric.WithDescription("Responses subscribers rejected, per subscriber identity (SPIFFE ID, or plaintext) and collection.")); err != nil {
		return nil, fmt.Errorf("mcp metrics: %w", err)
	}
	for _, t := range typeURLs {
		s.collections[t] = newCollection(t)
	}
	// No callbacks: go-control-plane numbers its state-of-the-world and
	// delta streams apart, so two live streams may share a number; each
	// stream's state is its own (ads wraps every stream).
	s.xds = serverv3.NewServer(ctx, (*muxCache)(s), serverv3.CallbackFuncs{})
	return s, nil
}

// VersionMetadata is the node metadata field in which a subscriber says
// its version (ClientOptions.Version).
const VersionMetadata = "FLOTILLA_VERSION"

// Subscribers are the open streams that have identified themselves, by
// node ID.
func (s *Server) Subscribers() []debugapi.Subscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]debugapi.Subscriber, 0, len(s.streams))
	for sub := range s.streams {
		if sub.id == "" {
			continue
		}
		d := debugapi.Subscriber{ID: sub.id, Identity: sub.label, Version: sub.version, ConnectedAt: sub.connected}
		for t, ts := range sub.types {
			if ts.sent != "" && !ts.answered {
				if d.Unanswered == nil {
					d.Unanswered = map[string]time.Time{}
				}
				d.Unanswered[t] = ts.sentAt
			}
			if ts.rejected != "" {
				if d.Rejected == nil {
					d.Rejected = map[string]string{}
				}
				d.Rejected[t] = ts.rejected
			}
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b debugapi.Subscriber) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Identify names the server in every response's control_plane, as
// istiod does (debugapi.Replica's JSON); call before serving.
func (s *Server) Identify(cp *corev3.ControlPlane) { s.controlPlane = cp }

// ServeDebug answers the debug type typeURL (a state-of-the-world
// stream whose first request asks for it, as debugapi.Subscribers is
// asked) with what list returns, one Struct a resource, request by
// request; call before serving.
func (s *Server) ServeDebug(typeURL string, list func() ([]*structpb.Struct, error)) {
	if s.debug == nil {
		s.debug = map[string]func() ([]*structpb.Struct, error){}
	}
	s.debug[typeURL] = list
}

// Register adds the aggregated discovery service to g.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, ads{Server: s.xds, s: s})
}

// ads is go-control-plane's ADS, but for a state-of-the-world stream
// whose first request asks for debugapi.Subscribers: that one is
// answered with the list of subscribers, request by request.
type ads struct {
	serverv3.Server
	s *Server
}

func (a ads) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	first, err := st.Recv()
	if err != nil {
		return err // the transport's status
	}
	if first.GetTypeUrl() == debugapi.Subscribers {
		return a.s.serveDebug(st, first, a.s.subscriberStructs)
	}
	if list, ok := a.s.debug[first.GetTypeUrl()]; ok {
		return a.s.serveDebug(st, first, list)
	}
	w := &sotwStream{AggregatedDiscoveryService_StreamAggregatedResourcesServer: st, s: a.s, sub: a.s.open(st.Context()), first: first}
	defer a.s.close(w.sub)
	return w.refused.or(a.Server.StreamAggregatedResources(w)) // go-control-plane's status
}

func (a ads) DeltaAggregatedResources(st discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	w := &deltaStream{AggregatedDiscoveryService_DeltaAggregatedResourcesServer: st, s: a.s, sub: a.s.open(st.Context())}
	defer a.s.close(w.sub)
	return w.refused.or(a.Server.DeltaAggregatedResources(w)) // go-control-plane's status
}

// subscriberStructs is Subscribers, as debugapi.Subscribers sends it.
func (s *Server) subscriberStructs() ([]*structpb.Struct, error) {
	return debugapi.Structs(s.Subscribers())
}

// serveDebug answers a debug client's requests of the type its first
// request names with what list returns.
func (s *Server) serveDebug(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer, first *discoveryv3.DiscoveryRequest,
	list func() ([]*structpb.Struct, error),
) error {
	typeURL := first.GetTypeUrl()
	a := debugapi.Answerer{
		Answer: func(*discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
			resp := &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, ControlPlane: s.controlPlane}
			items, err := list()
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			for _, m := range items {
				a, err := anypb.New(m)
				if err != nil {
					return nil, status.Error(codes.Internal, err.Error())
				}
				resp.Resources = append(resp.Resources, a)
			}
			return resp, nil
		},
		Nonce: func() string { return "debug-" + strconv.FormatUint(s.debugNonce.Add(1), 10) },
		Idle:  rate.NewLimiter(pacedRequestsPerSecond, pacedRequestsBurst),
	}
	return a.Serve(st.Context(), first, st.Recv, st.Send) // the transport's status
}

// Alias publishes the collection source also under the type URL alias,
// with the same resources. A raw alias carries each resource's body
// itself rather than an MCP Resource: Istio's pilot reads its mesh
// config from "core/v1alpha1/MeshConfig" that way (adsc reads the first
// resource's bytes as a MeshConfig). Call it before serving.
func (s *Server) Alias(alias, source string, raw bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	src, ok := s.collections[source]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownType, source)
	}
	if _, dup := s.collections[alias]; dup {
		return fmt.Errorf("mcp: collection %q already published", alias)
	}
	c := newCollection(alias)
	c.raw = raw
	src.aliases = append(src.aliases, c)
	s.collections[alias] = c
	if allow, ok := s.restricted[source]; ok {
		s.restricted[alias] = allow
	}
	return nil
}

// Update upserts and deletes resources of one collection (and its
// aliases) and returns how many actually changed. Resources whose content
// is unchanged are not re-sent; an update that changes nothing sends
// nothing.
func (s *Server) Update(typeURL string, upserts []*Resource, deletes []string) (int, error) {
	return s.UpdateContext(context.Background(), typeURL, upserts, deletes)
}

// UpdateContext is Update within a change's span (ctx's): the changed
// resources carry its trace context to the subscribers.
func (s *Server) UpdateContext(ctx context.Context, typeURL string, upserts []*Resource, deletes []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.collections[typeURL]
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownType, typeURL)
	}
	n, err := c.update(ctx, upserts, deletes)
	if err != nil {
		return 0, err
	}
	for _, a := range c.aliases {
		if _, err := a.update(ctx, upserts, deletes); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// update applies an Update to one collection. Called with s.mu held.
func (c *collection) update(ctx context.Context, upserts []*Resource, deletes []string) (int, error) {
	typeURL := c.typeURL
	toUpdate := map[string]types.Resource{}
	var toDelete []string
	for _, r := range upserts {
		var msg types.Resource
		var a *anypb.Any
		if c.raw {
			body, err := r.Body.UnmarshalNew()
			if err != nil {
				return 0, fmt.Errorf("decode %s %s: %w", typeURL, r.Name, err)
			}
			msg, a = body, r.Body
			t := r.Body.GetTypeUrl()
			c.rawType.Store(&t)
		} else {
			p := r.toProto()
			enc, err := marshal(p)
			if err != nil {
				return 0, fmt.Errorf("encode %s %s: %w", typeURL, r.Name, err)
			}
			msg, a = named{p}, &anypb.Any{TypeUrl: ResourceTypeURL, Value: enc}
		}
		h := contentHash(a.GetValue())
		if c.hashes[r.Name] == h {
			continue
		}
		c.hashes[r.Name] = h
		c.encoded[r.Name] = a
		toUpdate[r.Name] = msg
	}
	for _, name := range deletes {
		if _, ok := c.hashes[name]; !ok {
			continue
		}
		delete(c.hashes, name)
		delete(c.encoded, name)
		toDelete = append(toDelete, name)
	}
	changed := len(toUpdate) + len(toDelete)
	if changed == 0 {
		return 0, nil
	}
	// Recorded before the cache notifies the watches whose responses say it.
	c.pubMu.Lock()
	md := publishedMetadata(ctx, time.Now()) // one message, shared by every response: never modified
	for name := range toUpdate {
		c.published[name] = md
	}
	for _, name := range toDelete {
		delete(c.published, name)
	}
	c.pubMu.Unlock()
	if err := c.linear.UpdateResources(toUpdate, toDelete); err != nil {
		return 0, fmt.Errorf("update %s: %w", typeURL, err)
	}
	c.version = c.computeVersion()
	c.notifySotw()
	return changed, nil
}

func newCollection(typeURL string) *collection {
	c := &collection{
		typeURL:   typeURL,
		linear:    cache.NewLinearCache(typeURL),
		hashes:    map[string]string{},
		encoded:   map[string]*anypb.Any{},
		published: map[string]*corev3.Metadata{},
		watches:   map[uint64]sotwWatch{},
	}
	c.version = c.computeVersion()
	return c
}

// computeVersion hashes the names and content hashes of the collection, so
// that the same content has the same state-of-the-world version everywhere.
func (c *collection) computeVersion() string {
	names := make([]string, 0, len(c.hashes))
	for n := range c.hashes {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n)
		b.WriteByte(0)
		b.WriteString(c.hashes[n])
		b.WriteByte(0)
	}
	return contentHash([]byte(b.String()))
}

// sentVersionKey records, in the subscription's returned resources (which
// the server hands back to the cache on the next request), the collection
// version last sent on a stream, even when the collection was empty.
const sentVersionKey = "\x00sent-version"

// sotwResponse is the full state of the collection for req.
func (c *collection) sotwResponse(req *cache.Request) *cache.PassthroughResponse {
	names := make([]string, 0, len(c.encoded))
	for n := range c.encoded {
		names = append(names, n)
	}
	slices.Sort(names)
	res := make([]*anypb.Any, 0, len(names))
	returned := make(map[string]string, len(names))
	for _, n := range names {
		res = append(res, c.encoded[n])
		returned[n] = c.version
	}
	returned[sentVersionKey] = c.version
	return &cache.PassthroughResponse{
		Request: req,
		DiscoveryResponse: &discoveryv3.DiscoveryResponse{
			VersionInfo: c.version,
			Resources:   res,
			TypeUrl:     c.typeURL,
		},
		ReturnedResources: returned,
	}
}

func (c *collection) notifySotw() {
	for id, w := range c.watches {
		w.deliver(c.sotwResponse(w.req))
		delete(c.watches, id)
	}
}

// muxCache is the cache.Cache the go-control-plane server reads: delta goes
// to each collection's LinearCache; sotw is answered here with full state.
type muxCache Server

func (m *muxCache) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	s := (*Server)(m)
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.collections[req.GetTypeUrl()]
	if !ok {
		s.unknownCollection(req.GetTypeUrl())
		w := sotwWatch{ch: ch, done: make(chan struct{})}
		if req.GetVersionInfo() != emptyVersion() && req.GetErrorDetail() == nil {
			w.deliver(&cache.PassthroughResponse{
				Request:           req,
				DiscoveryResponse: &discoveryv3.DiscoveryResponse{VersionInfo: emptyVersion(), TypeUrl: req.GetTypeUrl()},
				ReturnedResources: map[string]string{},
			})
		}
		var once sync.Once
		return func() { once.Do(func() { close(w.done) }) }, nil
	}
	// Reply at once when the subscriber's state differs from ours, unless it
	// just rejected the state we still have: then wait for a change, or we
	// would send the rejected state again in a loop.
	w := sotwWatch{req: req, ch: ch, done: make(chan struct{})}
	var once sync.Once
	s.nextWatch++
	id := s.nextWatch
	cancel := func() {
		once.Do(func() { close(w.done) })
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(c.watches, id)
	}
	rejectedCurrent := req.GetErrorDetail() != nil && sub.ReturnedResources()[sentVersionKey] == c.version
	if !rejectedCurrent && req.GetVersionInfo() != c.version {
		w.deliver(c.sotwResponse(req))
		return cancel, nil
	}
	c.watches[id] = w
	return cancel, nil
}

func (m *muxCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	s := (*Server)(m)
	s.mu.Lock()
	c, ok := s.collections[req.GetTypeUrl()]
	if !ok {
		s.unknownCollection(req.GetTypeUrl())
	}
	s.mu.Unlock()
	if !ok {
		// The first request gets the empty collection; later ones (ACKs)
		// wait for ever: nothing will change.
		if req.GetResponseNonce() == "" {
			resp := &cache.DeltaPassthroughResponse{
				DeltaRequest:           req,
				NextVersionMap:         map[string]string{},
				DeltaDiscoveryResponse: &discoveryv3.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), SystemVersionInfo: emptyVersion()},
			}
			// Called on the stream's own goroutine, whose channel is open
			// and buffered; should it be full, the empty answer is skipped.
			select {
			case ch <- resp:
			default:
			}
		}
		return func() {}, nil
	}
	// The LinearCache compares the versions the subscriber holds (from its
	// initial_resource_versions or what was last sent) with the current
	// content hashes, so a reconnecting subscriber gets only differences
	// and a NACK (which carries a nonce) is not answered with a resend.
	return c.linear.CreateDeltaWatch(req, sub, ch)
}

func (m *muxCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errors.New("mcp: fetch (REST) is not served")
}

// PeerIdentity is the identity Restrict's functions are given: the SPIFFE
// ID of the verified client certificate of the call in ctx, "plaintext"
// without one. It is fixed for a stream's life, as its TLS connection's
// peer is.
func PeerIdentity(ctx context.Context) string {
	if sid, ok, err := spiffe.FromPeer(ctx); ok && err == nil {
		return sid.String()
	}
	return "plaintext"
}

// open starts the bookkeeping of a stream whose context is ctx: its own
// subscriber, never shared with another stream, named by the stream's own
// PeerIdentity.
func (s *Server) open(ctx context.Context) *subscriber {
	sub := newSubscriber(PeerIdentity(ctx))
	s.mu.Lock()
	s.nextStream++
	sub.stream = s.nextStream
	s.streams[sub] = struct{}{}
	s.mu.Unlock()
	s.metrics.subscribers.Add(ctx, 1)
	return sub
}

// close ends a stream's bookkeeping.
func (s *Server) close(sub *subscriber) {
	s.metrics.subscribers.Add(context.Background(), -1)
	s.mu.Lock()
	delete(s.streams, sub)
	id, announced := sub.id, sub.announced
	if sub.announce != nil {
		sub.announce.Stop()
	}
	s.mu.Unlock()
	if announced {
		s.log.Info("subscriber disconnected", "subscriber", id, "stream", sub.stream)
		return
	}
	s.log.Debug("subscriber disconnected", "subscriber", id, "stream", sub.stream, "after", time.Since(sub.connected).Round(time.Millisecond))
}

// request records a request of sub's stream and decides whether it is
// served: it names the subscriber (identify), refuses what the stream may
// not ask for (admit), records whether it answers the latest response of
// its collection (answer), and holds back every request but such an
// answer (pace).
func (s *Server) request(ctx context.Context, sub *subscriber, r *asked) error {
	s.mu.Lock()
	s.identify(sub, r)
	id := sub.id
	ts, err := s.admit(sub, r)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	answersLatest, logNack := ts.answer(r)
	version := ts.sentVersion
	s.mu.Unlock()
	if r.nack != nil {
		s.metrics.nacks.Add(ctx, 1, metric.WithAttributes(
			attribute.String("subscriber", sub.label), attribute.String("type_url", s.typeLabel(r.typeURL))))
	}
	if logNack {
		s.log.Warn("subscriber rejected a response", "subscriber", id, "identity", sub.label, "type_url", r.typeURL,
			"version", version, "reason", clip.String(r.nack.Error(), 512))
	}
	if !answersLatest {
		pace(ctx, sub.paced)
	}
	return nil
}

// identify names sub by the node of its first request that gives one.
// Called with s.mu held.
func (s *Server) identify(sub *subscriber, r *asked) {
	if sub.id == "" && r.node.GetId() != "" {
		sub.id = clip.String(r.node.GetId(), 256)
		sub.version = clip.String(r.node.GetMetadata().GetFields()[VersionMetadata].GetStringValue(), 64)
		s.log.Debug("subscriber connected", "subscriber", sub.id, "identity", sub.label, "stream", sub.stream)
		sub.announce = time.AfterFunc(max(announceAfter-time.Since(sub.connected), 0), func() {
			s.mu.Lock()
			_, open := s.streams[sub]
			sub.announced = open
			s.mu.Unlock()
			if open {
				s.log.Info("subscriber connected", "subscriber", sub.id, "identity", sub.label, "stream", sub.stream)
			}
		})
	}
}

// admit is sub's state for the collection r asks for, when the stream may
// ask for it: a restricted collection only by the identity of the stream
// that asks; names within the stream's bounds; no more than
// maxUnpublishedTypes collections not published. A refusal is logged.
// Called with s.mu held.
func (s *Server) admit(sub *subscriber, r *asked) (*typeState, error) {
	if allow, ok := s.restricted[r.typeURL]; ok && !allow(sub.label) {
		s.log.Warn("refusing a subscriber a restricted collection", "subscriber", sub.id, "identity", sub.label, "type_url", r.typeURL)
		return nil, status.Errorf(codes.PermissionDenied, "collection %s is not served to %s", r.typeURL, sub.label)
	}
	ts, err := s.typeState(sub, r.typeURL)
	if err == nil {
		err = sub.subscribe(ts, r)
	}
	if err != nil {
		s.log.Warn("refusing a subscriber", "subscriber", sub.id, "identity", sub.label, "error", err)
		return nil, err
	}
	return ts, nil
}

// answer records r if it is the first answer to the latest response of
// its collection (the only request that counts as one: stale or made-up
// nonces change nothing), and says whether its NACK is to be logged: once
// per collection and version. Called with s.mu held.
func (ts *typeState) answer(r *asked) (answersLatest, logNack bool) {
	if r.nonce == "" || r.nonce != ts.sent || ts.answered {
		return false, false
	}
	ts.answered = true
	ts.rejected = ""
	if r.nack != nil {
		ts.rejected = clip.String(r.nack.Error(), 256)
		logNack = ts.nackLogged != ts.sentVersion
		ts.nackLogged = ts.sentVersion
	}
	return true, logNack
}

// pace waits for a request's turn at the paced rate, or for ctx to end.
func pace(ctx context.Context, paced *rate.Limiter) {
	t := time.NewTimer(paced.Reserve().Delay())
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// typeState is sub's state for typeURL, made on its first request; a
// stream may ask for at most MaxCollections collections the server
// publishes and maxUnpublishedTypes it does not. Called with s.mu held.
func (s *Server) typeState(sub *subscriber, typeURL string) (*typeState, error) {
	if ts, ok := sub.types[typeURL]; ok {
		return ts, nil
	}
	if _, published := s.collections[typeURL]; published {
		if sub.published >= MaxCollections {
			return nil, status.Errorf(codes.ResourceExhausted,
				"the subscriber asks for more than %d collections on one stream", MaxCollections)
		}
		sub.published++
	} else {
		if sub.unpublished >= maxUnpublishedTypes {
			return nil, status.Errorf(codes.ResourceExhausted,
				"the subscriber asks for more than %d collections not published", maxUnpublishedTypes)
		}
		sub.unpublished++
	}
	ts := &typeState{}
	sub.types[typeURL] = ts
	return ts, nil
}

// typeLabel is typeURL as a metric attribute: every collection the server
// does not publish shares one series, "other" (the type URL is the
// subscriber's to choose). The collections are fixed once serving starts:
// read without the lock.
func (s *Server) typeLabel(typeURL string) string {
	if _, ok := s.collections[typeURL]; ok {
		return typeURL
	}
	return "other"
}

// sent records a response sent on sub's stream.
func (s *Server) sent(sub *subscriber, typeURL, version, nonce string, n int) {
	s.mu.Lock()
	if ts, ok := sub.types[typeURL]; ok { // it asked first
		ts.sent, ts.sentVersion, ts.sentAt, ts.answered = nonce, version, time.Now(), false
	}
	s.mu.Unlock()
	attrs := metric.WithAttributes(attribute.String("subscriber", sub.label), attribute.String("type_url", s.typeLabel(typeURL)))
	s.metrics.responses.Add(context.Background(), 1, attrs)
	s.metrics.resources.Add(context.Background(), int64(n), attrs)
}

// refusal is why galley ended a stream (a request refused), kept by the
// stream's reader for the handler to return: go-control-plane ends a
// stream whose Recv fails without an error of its own.
type refusal struct {
	mu  sync.Mutex
	err error
}

func (r *refusal) set(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	return err
}

// or is the refusal, if any, else err.
func (r *refusal) or(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	return err
}

// sotwStream is a state-of-the-world stream as go-control-plane's server
// sees it: each request is decided by galley for this stream's own
// subscriber before the server reads it, each response recorded for it.
type sotwStream struct {
	discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	s       *Server
	sub     *subscriber
	first   *discoveryv3.DiscoveryRequest // read already, to tell a debug client
	refused refusal
}

func (w *sotwStream) Recv() (*discoveryv3.DiscoveryRequest, error) {
	r := w.first
	if r != nil {
		w.first = nil
	} else {
		var err error
		if r, err = w.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Recv(); err != nil {
			return nil, err // the transport's status
		}
	}
	err := w.s.request(w.Context(), w.sub, &asked{
		node: r.GetNode(), typeURL: r.GetTypeUrl(), nonce: r.GetResponseNonce(),
		nack:      statusErr(r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil),
		subscribe: r.GetResourceNames(), replace: true,
	})
	if err != nil {
		return nil, w.refused.set(err)
	}
	return r, nil
}

func (w *sotwStream) Send(r *discoveryv3.DiscoveryResponse) error {
	r.ControlPlane = w.s.controlPlane // the response is this watch's own (sotwResponse)
	w.s.sent(w.sub, r.GetTypeUrl(), r.GetVersionInfo(), r.GetNonce(), len(r.GetResources()))
	return w.AggregatedDiscoveryService_StreamAggregatedResourcesServer.Send(r) // the transport's status
}

// deltaStream is sotwStream's delta counterpart.
type deltaStream struct {
	discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	s       *Server
	sub     *subscriber
	refused refusal
}

func (w *deltaStream) Recv() (*discoveryv3.DeltaDiscoveryRequest, error) {
	r, err := w.AggregatedDiscoveryService_DeltaAggregatedResourcesServer.Recv()
	if err != nil {
		return nil, err // the transport's status
	}
	err = w.s.request(w.Context(), w.sub, &asked{
		node: r.GetNode(), typeURL: r.GetTypeUrl(), nonce: r.GetResponseNonce(),
		nack:      statusErr(r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil),
		subscribe: r.GetResourceNamesSubscribe(), unsubscribe: r.GetResourceNamesUnsubscribe(),
	})
	if err != nil {
		return nil, w.refused.set(err)
	}
	return r, nil
}

func (w *deltaStream) Send(r *discoveryv3.DeltaDiscoveryResponse) error {
	s := w.s
	r.ControlPlane = s.controlPlane
	// The LinearCache types each resource's Any with the collection;
	// Istio's sinks expect Istio's MCP Resource, or for a raw alias the
	// body's own type (the response is this stream's own, built for it).
	// The collections are fixed once serving starts: read without the
	// lock, which Update holds while it encodes.
	typeURL := ResourceTypeURL
	c := s.collections[r.GetTypeUrl()]
	if c != nil && c.raw {
		if t := c.rawType.Load(); t != nil {
			typeURL = *t
		}
	}
	for _, res := range r.GetResources() {
		if a := res.GetResource(); a != nil {
			a.TypeUrl = typeURL
		}
	}
	// When each resource's content was published, for the subscriber's
	// lag (under the collection's own lock: Update may hold the server's
	// while it notifies watches).
	if c != nil {
		c.pubMu.RLock()
		for _, res := range r.GetResources() {
			if md, ok := c.published[res.GetName()]; ok {
				res.Metadata = md
			}
		}
		c.pubMu.RUnlock()
	}
	s.sent(w.sub, r.GetTypeUrl(), r.GetSystemVersionInfo(), r.GetNonce(), len(r.GetResources())+len(r.GetRemovedResources()))
	return w.AggregatedDiscoveryService_DeltaAggregatedResourcesServer.Send(r) // the transport's status
}

func statusErr(msg string, nack bool) error {
	if !nack {
		return nil
	}
	if msg == "" {
		msg = "no reason given"
	}
	return errors.New(msg)
}
