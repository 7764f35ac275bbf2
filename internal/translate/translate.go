// Package translate turns a push context and a proxy into the Envoy xDS
// resources that proxy gets: clusters (CDS), endpoints (EDS), listeners
// (LDS) and route configurations (RDS), in the flavour its kind accepts
// (Envoy sidecars, or proxyless gRPC clients for GENERATOR=grpc nodes).
// Everything here is pure and deterministic: the same input gives the same
// resources, sorted by name. Resources that fail their generated Validate()
// or the cross-reference checks are dropped and reported, never returned.
package translate

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Names of the clusters and listeners every sidecar gets.
const (
	BlackHoleCluster   = "BlackHoleCluster"
	PassthroughCluster = "PassthroughCluster"
	// InboundPassthroughCluster takes inbound connections no port of the
	// workload's claims to their original destination, from 127.0.0.6,
	// which the capture rules let through (InboundPassthroughBind).
	InboundPassthroughCluster = "InboundPassthroughCluster" //nolint:gosec // a cluster's name, not a credential
	InboundPassthroughBind    = proxycontract.InboundPassthroughSource
	inboundPassthroughBind6   = proxycontract.InboundPassthroughSource6
	VirtualOutbound           = proxycontract.VirtualOutbound
	VirtualInbound            = proxycontract.VirtualInbound

	// OutboundPort and InboundPort are where the init container's
	// iptables rules send a pod's traffic.
	OutboundPort = proxycontract.OutboundCapturePort
	InboundPort  = proxycontract.InboundCapturePort

	// SDS secret names the agent serves.
	SecretWorkload = proxycontract.SecretWorkload
	SecretRoot     = proxycontract.SecretRoot
	// sdsCluster is the cluster the bootstrap defines for the agent's SDS
	// socket.
	sdsCluster = proxycontract.SDSCluster
)

// Output is everything generated for one proxy.
type Output struct {
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	// Problems lists what was dropped or degraded, and why. Translation
	// goes on without the bad part.
	Problems []string
}

// Generate translates the whole mesh for one proxy: every resource it
// can ask for. The server asks a Generator for what a proxy watches.
func Generate(pc *model.PushContext, p *model.Proxy) *Output {
	g := NewGenerator(pc, p)
	out := &Output{
		Clusters:  g.Clusters(nil),
		Endpoints: g.Endpoints(nil),
		Routes:    g.Routes(nil),
		Listeners: g.Listeners(nil),
	}
	out.Problems = g.Problems()
	return out
}

// Generator translates for one proxy and one push context, resource by
// resource, remembering what it built: a route that names a cluster
// builds (and validates) that cluster once. Not safe for concurrent use.
type Generator struct{ g *gen }

// NewGenerator returns a generator for a proxy.
func NewGenerator(pc *model.PushContext, p *model.Proxy) *Generator {
	return &Generator{g: newGen(pc, p)}
}

// Clusters returns the named clusters that exist, sorted; nil names means
// all of them.
func (x *Generator) Clusters(names []string) []*clusterv3.Cluster {
	if names == nil {
		names = x.g.clusterCandidates()
	}
	var out []*clusterv3.Cluster
	for _, n := range uniqueSorted(names) {
		if c := x.g.cluster(n); c != nil {
			out = append(out, c.c)
		}
	}
	return out
}

// Endpoints returns the load assignments of the named EDS clusters,
// sorted; nil names means every EDS cluster. A name the proxy has no EDS
// cluster for gets no assignment.
func (x *Generator) Endpoints(names []string) []*endpointv3.ClusterLoadAssignment {
	if names == nil {
		names = x.g.clusterCandidates()
	}
	var out []*endpointv3.ClusterLoadAssignment
	for _, n := range uniqueSorted(names) {
		if la := x.g.endpoints(n); la != nil {
			out = append(out, la)
		}
	}
	return out
}

// Routes returns the named route configurations that exist, sorted; nil
// names means all of them.
func (x *Generator) Routes(names []string) []*routev3.RouteConfiguration {
	if names == nil {
		names = x.g.routeCandidates()
	}
	var out []*routev3.RouteConfiguration
	for _, n := range uniqueSorted(names) {
		if rc := x.g.route(n); rc != nil {
			out = append(out, rc)
		}
	}
	return out
}

// Listeners returns the named listeners that exist, sorted; nil names
// means all of them.
func (x *Generator) Listeners(names []string) []*listenerv3.Listener {
	all := x.g.listenerSet(names)
	if names == nil {
		return all
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []*listenerv3.Listener
	for _, l := range all {
		if want[l.GetName()] {
			out = append(out, l)
		}
	}
	return out
}

// PushContext is the push context the generator translates.
func (x *Generator) PushContext() *model.PushContext { return x.g.pc }

// Problems lists what was dropped or degraded so far, and why.
func (x *Generator) Problems() []string { return slices.Clone(x.g.problems) }

func uniqueSorted(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

// gen carries what one proxy's translation needs, and what it built.
type gen struct {
	pc    *model.PushContext
	p     *model.Proxy
	scope *model.Scope
	grpc  bool

	clusters  map[string]*builtCluster // name → built (nil entry: does not exist)
	las       map[string]*endpointv3.ClusterLoadAssignment
	routesBy  map[string]*routev3.RouteConfiguration
	listeners []*listenerv3.Listener
	inbound   []*clusterv3.Cluster
	inPorts   []inboundPort
	// gwMerge is what configures a gateway proxy (gatewayMerge).
	gwMerge *gatewayMerge
	egress  []egressPort
	// locality is where the proxy runs (proxyLocality), once known;
	// localityStr its key form.
	locality    *model.Locality
	localityStr string
	// defaultLocalityLB is Istio's default mesh setting, made once.
	defaultLocalityLB *networking.LocalityLoadBalancerSetting
	problems          []string
	// authzBuilt is the workload's authorization (workloadAuthz);
	// extAuthzs the extension providers built while making it.
	authzBuilt *workloadAuthz
	extAuthzs  map[string]extAuthzResult
	// filterChecks are the consistency checks of network filters, by
	// their packed configuration (networkFilter).
	filterChecks map[*anypb.Any]error
	// routeChecks are the validation results of routes (validVirtualHost).
	routeChecks map[*routev3.Route]error
	// validDomains stand in for a virtual host's domains once they are
	// known to pass (validVirtualHost).
	validDomains []string
	// gwTLS are a gateway's TLS transport sockets by their settings.
	gwTLS map[string]*corev3.TransportSocket
	// gwHCM is what a gateway's HTTP connection managers share
	// (gatewayHCMFilter).
	gwHCM *hcmTail
	// gwVSRoutes are the routes of VirtualServices on a gateway
	// (gatewayVSRoutes).
	gwVSRoutes map[gwVSKey][]*routev3.Route
	// defaultRetries are the default retry policies, without and with a
	// hash policy (sharedDefaultRetryPolicy).
	defaultRetries [2]*routev3.RetryPolicy
	// grpcDefaultRetries is the default retry policy of proxyless gRPC
	// clients' routes.
	grpcDefaultRetries *routev3.RetryPolicy
	// packErrs counts messages that failed validation when packed.
	packErrs int
	empties  map[string]*anypb.Any
}

type builtCluster struct {
	c   *clusterv3.Cluster
	svc *registryv1.Service
	// port and subset of an outbound EDS cluster, for its endpoints.
	port   *registryv1.ServicePort
	subset *networking.Subset
	dr     *model.DestinationRule
}

func newGen(pc *model.PushContext, p *model.Proxy) *gen {
	return &gen{
		pc: pc, p: p, scope: pc.Scope(p), grpc: p.ProxylessGRPC(),
		clusters: map[string]*builtCluster{}, las: map[string]*endpointv3.ClusterLoadAssignment{},
		routesBy: map[string]*routev3.RouteConfiguration{}, empties: map[string]*anypb.Any{},
	}
}

// problem records something dropped or degraded, once.
func (g *gen) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if !slices.Contains(g.problems, msg) {
		g.problems = append(g.problems, msg)
	}
}

// ClusterName is Istio's cluster name: "outbound|80|v1|reviews.default.svc.cluster.local".
func ClusterName(direction string, port uint32, subset, host string) string {
	return direction + "|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + host
}

// ParseClusterName splits an outbound cluster name.
func ParseClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, ok := strings.CutPrefix(name, "outbound|")
	if !ok {
		return 0, "", "", false
	}
	num, rest, _ := strings.Cut(rest, "|")
	subset, host, ok = strings.Cut(rest, "|")
	if !ok || strings.Contains(host, "|") {
		return 0, "", "", false
	}
	n, err := strconv.ParseUint(num, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(n), subset, host, true
}

// ListenerName of a proxyless gRPC client's API listener: "host:port".
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}

// ParseListenerName splits a ListenerName (also the name of its route
// configuration).
func ParseListenerName(name string) (host string, port uint32, ok bool) {
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(name[i+1:], 10, 32)
	if err != nil {
		return "", 0, false
	}
	return name[:i], uint32(n), true
}

// isHTTP reports whether a port protocol is routed by HTTP attributes.
func isHTTP(p registryv1.Protocol) bool {
	switch p {
	case registryv1.Protocol_PROTOCOL_HTTP, registryv1.Protocol_PROTOCOL_HTTP2, registryv1.Protocol_PROTOCOL_GRPC:
		return true
	default:
		return false
	}
}

// isHTTP2 reports whether upstream connections speak HTTP/2.
func isHTTP2(p registryv1.Protocol) bool {
	return p == registryv1.Protocol_PROTOCOL_HTTP2 || p == registryv1.Protocol_PROTOCOL_GRPC
}

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func sdsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType:             corev3.ApiConfigSource_GRPC,
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{
				TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: sdsCluster}},
			}},
			SetNodeOnFirstMessageOnly: true,
		}},
		ResourceApiVersion: corev3.ApiVersion_V3,
	}
}

// pack validates and packs a message into an Any. Validation here is
// what makes the cheap check of the resources that hold the Any enough
// (the generated Validate does not open Anys): an invalid message is
// recorded, and the resource holding it then gets the deep check, which
// names the problem and drops it. Empty messages (filters without
// settings) are packed once per generator.
func (g *gen) pack(m proto.Message) *anypb.Any {
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			g.packErrs++
		}
	}
	empty := proto.Size(m) == 0
	name := string(m.ProtoReflect().Descriptor().FullName())
	if empty {
		if a, ok := g.empties[name]; ok {
			return a
		}
	}
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		g.packErrs++
		return &anypb.Any{TypeUrl: "type.googleapis.com/" + name}
	}
	if empty {
		g.empties[name] = a
	}
	return a
}

// valid checks a resource just built: its generated validation, and the
// deep check (opening every Any) when something packed into it failed.
func (g *gen) valid(m proto.Message, packErrsBefore int) error {
	if g.packErrs > packErrsBefore {
		return Validate(m)
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		return v.Validate() //nolint:wrapcheck // the generated message names the field
	}
	return nil
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func sortByName[T interface{ GetName() string }](s []T) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(a.GetName(), b.GetName()) })
}

// serviceNames are the names by which a service is reached from the
// proxy, as Istio's generateVirtualHostDomains makes them: its hostname,
// the absolute form "host." (Istio adds it by default:
// PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN), and for a host under
// <ns>.svc.<domain> — a Kubernetes Service or a ServiceEntry alike —
// name.namespace and name.namespace.svc, and name alone from the same
// namespace. Other hosts get no short names: they could collide with a
// Kubernetes Service's.
func (g *gen) serviceNames(svc *registryv1.Service) []string {
	host := svc.GetHostname()
	names := []string{host}
	if _, err := netip.ParseAddr(host); err != nil {
		names = append(names, host+".")
	}
	if base, ok := strings.CutSuffix(host, ".svc."+g.pc.DomainSuffix); ok {
		if name, ns, ok := strings.Cut(base, "."); ok && name != "" && ns != "" && !strings.Contains(ns, ".") {
			names = append(names, base+".svc", base)
			if ns == g.p.Namespace {
				names = append(names, name)
			}
		}
	}
	return names
}
