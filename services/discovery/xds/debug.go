package xds

// This file serves the debug types of internal/debugapi over ADS (Istio's
// syncz and config_dump, and Flotilla's acked_config_dump): a stream whose
// first request asks for one is a debug client's, not a proxy's, and is
// answered request by request from the proxies' sync state.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmnetworkv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// syncState is the proxy's sync state as debugapi.Syncz reports it.
func (c *conn) syncState() debugapi.ProxySync {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := debugapi.ProxySync{
		ID: c.id, Namespace: c.proxy.Namespace, ProxyType: string(c.proxy.Type), IstioVersion: c.proxy.IstioVersion,
		ClusterID: c.proxy.ClusterID, Identity: c.identity, Generator: c.proxy.Generator, Delta: c.delta,
		ConnectedAt: c.connectedAt, Problems: c.allProblems(), PushSeenAt: c.pushSeen,
		Telemetry: translate.TelemetryOf(c.proxy),
	}
	if c.pcSeen != nil {
		ps.PushVersion = c.pcSeen.Version
	}
	for _, t := range translate.Types() {
		w := c.watches[t]
		if w == nil || !w.started {
			continue
		}
		ts := debugapi.TypeSync{
			TypeURL: t, AckedVersion: w.ackedVersion, AckedAt: w.ackedAt, SentVersion: w.sentVersion, Resources: w.sentCount, SentAt: w.sentAt,
		}
		switch {
		case w.sentNonce == "" && w.ackedVersion != "" && !w.resumed:
			// A resumed stream whose proxy holds what this replica
			// would send: nothing sent, and nothing to send.
			ts.Status = debugapi.Synced
		case w.sentNonce == "":
			ts.Status = debugapi.NotSent
		case w.nack != nil && w.nack.Nonce == w.sentNonce:
			ts.Status, ts.Nack, ts.NackRepeats = debugapi.Nacked, w.nack.Message, w.nack.Repeats
		case w.ackedNonce == w.sentNonce:
			ts.Status = debugapi.Synced
		default:
			ts.Status = debugapi.Stale
		}
		ps.Types = append(ps.Types, ts)
	}
	return ps
}

// Status returns every connected proxy's sync state, by ID.
func (s *Server) Status() []debugapi.ProxySync {
	conns := s.Conns()
	out := make([]debugapi.ProxySync, 0, len(conns))
	for _, c := range conns {
		out = append(out, c.syncState())
	}
	slices.SortFunc(out, func(a, b debugapi.ProxySync) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// debugScope authorizes a debug client as istiod does: "" (every proxy)
// for a certificate of the system namespace, or on the plain-text port of
// a local run; the caller's namespace for any other certificate.
func (s *Server) debugScope(ctx context.Context) (string, error) {
	id, ok, err := spiffe.FromPeer(ctx)
	p, _ := peer.FromContext(ctx)
	switch {
	case !ok && s.plaintextDebug && p != nil && p.AuthInfo == nil: // plain text, not TLS without a certificate
		return "", nil
	case !ok:
		return "", status.Error(codes.Unauthenticated, "debug information is served on the mTLS xDS port, to a client certificate from the mesh's ca")
	case err != nil:
		return "", status.Error(codes.PermissionDenied, "client certificate: "+err.Error())
	case id.Namespace == s.systemNamespace:
		return "", nil
	}
	return id.Namespace, nil
}

// serveDebug answers a debug client's requests, the first of which is
// first, until it closes the stream. Each request that is not an ACK of
// the last response is answered once, built in one of the server's
// translation slots (so debug clients share the CPU translations are
// bounded to); a client sending requests in a loop is paced as a proxy's
// idle requests are, and one that takes no answer within the send
// timeout has its stream closed, as a proxy's is.
func (s *Server) serveDebug(ctx context.Context, first *discoveryv3.DiscoveryRequest,
	recv func() (*discoveryv3.DiscoveryRequest, error), send func(*discoveryv3.DiscoveryResponse) error,
) error {
	scope, err := s.debugScope(ctx)
	if err != nil {
		s.log.Warn("refusing a debug client", "node", clip.String(first.GetNode().GetId(), 200), "error", err)
		return err
	}
	s.metrics.debugRequests(first.GetTypeUrl())
	stalled := make(chan struct{})
	var once sync.Once
	sendWithin := func(resp *discoveryv3.DiscoveryResponse) error {
		if s.sendTimeout > 0 {
			t := time.AfterFunc(s.sendTimeout, func() { once.Do(func() { close(stalled) }) })
			defer t.Stop()
		}
		return send(resp)
	}
	done := make(chan error, 1)
	go func() { done <- s.debugLoop(ctx, first, recv, sendWithin, scope) }()
	select {
	case err := <-done:
		return err
	case <-stalled:
		// Returning ends the stream, which releases the blocked send.
		s.metrics.timedOut()
		s.log.Warn("closing a debug client's stream: it takes no answer", "timeout", s.sendTimeout)
		return status.Errorf(codes.DeadlineExceeded, "the debug client took no answer for %s: closing its stream", s.sendTimeout)
	}
}

func (s *Server) debugLoop(ctx context.Context, first *discoveryv3.DiscoveryRequest,
	recv func() (*discoveryv3.DiscoveryRequest, error), send func(*discoveryv3.DiscoveryResponse) error, scope string,
) error {
	a := debugapi.Answerer{
		Answer: func(req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, error) {
			if err := checkNames(req.GetResourceNames()); err != nil {
				return nil, err
			}
			var resp *discoveryv3.DiscoveryResponse
			var err error
			s.offload(func() { resp, err = s.debugResponse(req, scope) })
			if err == nil {
				resp.ControlPlane = s.replica.ControlPlane()
			}
			return resp, err
		},
		Nonce: s.nextNonce,
		Idle:  rate.NewLimiter(idleRequestsPerSecond, idleRequestsBurst),
	}
	return recvError(a.Serve(ctx, first, recv, send))
}

// debugResponse builds the answer to one debug request.
func (s *Server) debugResponse(req *discoveryv3.DiscoveryRequest, scope string) (*discoveryv3.DiscoveryResponse, error) {
	t := req.GetTypeUrl()
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: t}
	pc, _ := s.current()
	if pc != nil {
		resp.VersionInfo = pc.Version
	}
	switch t {
	case debugapi.Syncz:
		want := map[string]bool{}
		for _, n := range req.GetResourceNames() {
			want[n] = true
		}
		for _, ps := range s.Status() {
			if (scope != "" && ps.Namespace != scope) || (len(want) > 0 && !want[ps.ID]) {
				continue
			}
			if len(want) == 0 {
				ps.Problems = nil // a proxy's detail: the listing stays a few hundred bytes a proxy
			}
			a, err := anypb.New(ps.ClientConfig())
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			resp.Resources = append(resp.Resources, a)
		}
		return resp, nil
	case debugapi.ConfigDump, debugapi.AckedConfigDump:
		if len(req.GetResourceNames()) != 1 {
			return nil, status.Errorf(codes.InvalidArgument, "%s names one proxy ID, not %d", t, len(req.GetResourceNames()))
		}
		id := req.GetResourceNames()[0]
		c := s.conn(id)
		if c == nil || (scope != "" && c.proxy.Namespace != scope) {
			// As istiod: a proxy of another namespace is not told apart
			// from one that is not here (it may be on another replica).
			return nil, status.Errorf(codes.NotFound, "no proxy %q is connected to this replica", clip.String(id, 200))
		}
		var sections []proto.Message
		if t == debugapi.ConfigDump {
			if pc == nil {
				return nil, status.Error(codes.Unavailable, "no configuration yet")
			}
			sections = c.configDump(pc)
		} else {
			sections = c.ackedConfigDump()
		}
		for _, m := range sections {
			a, err := anypb.New(m)
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			resp.Resources = append(resp.Resources, a)
		}
		return resp, nil
	case debugapi.Distribution:
		a, err := s.distribution(req.GetResourceNames(), scope)
		if err != nil {
			return nil, err
		}
		resp.Resources = []*anypb.Any{a}
		return resp, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "unknown debug type %q (served: %s, %s, %s, %s)",
		clip.String(t, 200), debugapi.Syncz, debugapi.ConfigDump, debugapi.AckedConfigDump, debugapi.Distribution)
}

// conn is the connected proxy with this ID, if any.
func (s *Server) conn(id string) *conn {
	for _, c := range s.Conns() {
		if c.id == id {
			return c
		}
	}
	return nil
}

// watchedTypes are the types the proxy watches with their names (nil:
// every resource of the type), read under mu.
func (c *conn) watchedTypes() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]string{}
	for t, w := range c.watches {
		if w.started {
			out[t] = w.watchedNames()
		}
	}
	return out
}

// configDump (run in a translation slot, as debugResponse is) is what
// the proxy would be sent from pc now: for the types
// it watches, the names it watches; an Envoy proxy's clusters, endpoints,
// listeners and routes in full when it does not watch them (yet).
func (c *conn) configDump(pc *model.PushContext) []proto.Message {
	watched := c.watchedTypes()
	gen := translate.NewGenerator(pc, c.proxy)
	var out []proto.Message
	for _, t := range translate.Types() {
		if typ, _ := xdstype.Of(t); typ.AgentOnly {
			continue // not Envoy's: no section of its config dump
		}
		names, ok := watched[t]
		if !ok && (c.proxy.ProxylessGRPC() || t == resourcev3.SecretType || t == resourcev3.ExtensionConfigType) {
			continue // a proxyless client names all it gets; a secret and an extension configuration are asked for by name
		}
		res := c.generate(t, gen, names)
		out = append(out, dumpSection(t, sotwVersion(res), res, nil))
	}
	meta := map[string]any{}
	if by := gen.PatchedBy(); len(by) > 0 {
		m := map[string]any{}
		for k, efs := range by {
			l := make([]any, len(efs))
			for i, ef := range efs {
				l[i] = ef
			}
			m[k] = l
		}
		meta[debugapi.MetadataEnvoyFilters] = m
	}
	if drs := gen.DestinationRules(); len(drs) > 0 {
		m := make(map[string]any, len(drs))
		for k, dr := range drs {
			m[k] = dr
		}
		meta[debugapi.MetadataDestinationRules] = m
	}
	if len(meta) > 0 {
		if st, err := structpb.NewStruct(meta); err == nil { // strings only
			out = append(out, st)
		}
	}
	return out
}

// ackedConfigDump is what the proxy acknowledged, for each type whose
// acknowledged version regenerating from the push context it was last
// served reproduces: the content is then what the proxy holds. The other
// types are listed, with their acknowledged versions, in a last Struct.
func (c *conn) ackedConfigDump() []proto.Message {
	watched := c.watchedTypes()
	c.mu.Lock()
	pc := c.pcSeen
	acked := map[string]string{}
	held := map[string]heldSet{}
	for t, w := range c.watches {
		acked[t] = w.ackedVersion
		if c.delta && w.ackedNonce != "" && w.ackedNonce == w.sentNonce {
			held[t] = w.held // never changed in place
		}
	}
	c.mu.Unlock()
	unknown := map[string]any{}
	var out []proto.Message
	var gen *translate.Generator
	if pc != nil {
		gen = translate.NewGenerator(pc, c.proxy)
	}
	for _, t := range translate.Types() {
		names, ok := watched[t]
		if typ, _ := xdstype.Of(t); !ok || typ.AgentOnly {
			continue
		}
		if acked[t] == "" {
			unknown[t] = ""
			continue
		}
		var res []*named
		if gen != nil {
			res = c.generate(t, gen, names)
		}
		h, holds := held[t]
		switch {
		case !c.delta && gen != nil && sotwVersion(res) == acked[t]:
		case c.delta && holds && sameAsHeld(res, nil, h):
		default:
			unknown[t] = acked[t]
			continue
		}
		out = append(out, dumpSection(t, acked[t], res, nil))
	}
	st, _ := structpb.NewStruct(map[string]any{debugapi.MetadataUnknownTypes: unknown}) // strings only
	return append(out, st)
}

// dumpSection is one type's resources as the section of Envoy's admin
// config dump for it; a secret's private key is redacted as Envoy's dump
// redacts it.
func dumpSection(t, version string, res []*named, at *timestamppb.Timestamp) proto.Message {
	switch t {
	case resourcev3.ClusterType:
		d := &adminv3.ClustersConfigDump{VersionInfo: version}
		for _, r := range res {
			d.DynamicActiveClusters = append(d.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{VersionInfo: r.version, Cluster: r.any, LastUpdated: at})
		}
		return d
	case resourcev3.EndpointType:
		d := &adminv3.EndpointsConfigDump{}
		for _, r := range res {
			d.DynamicEndpointConfigs = append(d.DynamicEndpointConfigs, &adminv3.EndpointsConfigDump_DynamicEndpointConfig{VersionInfo: r.version, EndpointConfig: r.any, LastUpdated: at})
		}
		return d
	case resourcev3.ListenerType:
		d := &adminv3.ListenersConfigDump{VersionInfo: version}
		for _, r := range res {
			d.DynamicListeners = append(d.DynamicListeners, &adminv3.ListenersConfigDump_DynamicListener{
				Name: r.name, ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: r.version, Listener: r.any, LastUpdated: at},
			})
		}
		return d
	case resourcev3.RouteType:
		d := &adminv3.RoutesConfigDump{}
		for _, r := range res {
			d.DynamicRouteConfigs = append(d.DynamicRouteConfigs, &adminv3.RoutesConfigDump_DynamicRouteConfig{VersionInfo: r.version, RouteConfig: r.any, LastUpdated: at})
		}
		return d
	case resourcev3.SecretType:
		d := &adminv3.SecretsConfigDump{}
		for _, r := range res {
			d.DynamicActiveSecrets = append(d.DynamicActiveSecrets, &adminv3.SecretsConfigDump_DynamicSecret{Name: r.name, VersionInfo: r.version, LastUpdated: at, Secret: redacted(r.any)})
		}
		return d
	case resourcev3.ExtensionConfigType:
		d := &adminv3.EcdsConfigDump{}
		for _, r := range res {
			d.EcdsFilters = append(d.EcdsFilters, &adminv3.EcdsConfigDump_EcdsFilterConfig{VersionInfo: r.version, EcdsFilter: redactedPullSecret(r.any), LastUpdated: at})
		}
		return d
	}
	panic(fmt.Sprintf("xds: no config dump section for %s", t)) // this switch has a case for every type served (translate.Types)
}

// redacted is a secret with its private key (and any other secret bytes)
// replaced by "[redacted]", as Envoy's /config_dump shows it.
func redacted(a *anypb.Any) *anypb.Any {
	var s tlsv3.Secret
	if err := a.UnmarshalTo(&s); err != nil {
		return nil
	}
	hide := &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "[redacted]"}}
	if tc := s.GetTlsCertificate(); tc != nil {
		if tc.GetPrivateKey() != nil {
			tc.PrivateKey = hide
		}
		if tc.GetPassword() != nil {
			tc.Password = hide
		}
	}
	if gs := s.GetGenericSecret(); gs != nil {
		gs.Secret = hide
	}
	out, err := anypb.New(&s)
	if err != nil {
		return nil
	}
	return out
}

// redactedPullSecret is an extension configuration with the registry
// credentials discovery gives the agent for a Wasm module replaced by
// "[redacted]".
func redactedPullSecret(a *anypb.Any) *anypb.Any {
	var ec corev3.TypedExtensionConfig
	if err := a.UnmarshalTo(&ec); err != nil {
		return nil
	}
	inner, err := ec.GetTypedConfig().UnmarshalNew()
	if err != nil {
		return a // not one of the Wasm filters: nothing of the agent's
	}
	var vm *wasmv3.VmConfig
	switch w := inner.(type) {
	case *wasmhttpv3.Wasm:
		vm = w.GetConfig().GetVmConfig()
	case *wasmnetworkv3.Wasm:
		vm = w.GetConfig().GetVmConfig()
	default:
		return a
	}
	kv := vm.GetEnvironmentVariables().GetKeyValues()
	if _, ok := kv[proxycontract.WasmPullSecretEnv]; !ok {
		return a
	}
	kv[proxycontract.WasmPullSecretEnv] = "[redacted]"
	if ec.TypedConfig, err = anypb.New(inner); err != nil {
		return nil
	}
	out, err := anypb.New(&ec)
	if err != nil {
		return nil
	}
	return out
}
