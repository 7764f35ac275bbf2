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

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Names of the clusters and listeners every sidecar gets.
const (
	BlackHoleCluster   = "BlackHoleCluster"
	PassthroughCluster = "PassthroughCluster"
	VirtualOutbound    = "virtualOutbound"
	VirtualInbound     = "virtualInbound"

	// OutboundPort and InboundPort are where the init container's
	// iptables rules send a pod's traffic.
	OutboundPort = 15001
	InboundPort  = 15006

	// SDS secret names the agent serves.
	SecretWorkload = "default"
	SecretRoot     = "ROOTCA"
	// sdsCluster is the cluster the bootstrap defines for the agent's SDS
	// socket.
	sdsCluster = "sds-grpc"
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

// Generate translates the mesh for one proxy.
func Generate(pc *model.PushContext, p *model.Proxy) *Output {
	g := newGen(pc, p)
	out := &Output{}
	out.Clusters, out.Endpoints = g.clusters()
	out.Routes = g.routes()
	out.Listeners = g.listeners()
	out.Problems = g.problems
	check(out)
	return out
}

// gen carries what one proxy's translation needs.
type gen struct {
	pc    *model.PushContext
	p     *model.Proxy
	scope *model.Scope
	grpc  bool

	// clusterNames are the clusters generated, for routes to check
	// against.
	clusterNames map[string]bool
	problems     []string
}

func newGen(pc *model.PushContext, p *model.Proxy) *gen {
	return &gen{pc: pc, p: p, scope: pc.Scope(p), grpc: p.ProxylessGRPC(), clusterNames: map[string]bool{}}
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
	parts := strings.Split(name, "|")
	if len(parts) != 4 || parts[0] != "outbound" {
		return 0, "", "", false
	}
	n, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(n), parts[2], parts[3], true
}

// ListenerName of a proxyless gRPC client's API listener: "host:port".
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
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

// toAny packs a message. Marshalling a well-formed message cannot fail;
// a failure is a bug and is reported by the checks as an empty Any.
func toAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		return &anypb.Any{}
	}
	return a
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func sortByName[T interface{ GetName() string }](s []T) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(a.GetName(), b.GetName()) })
}

// serviceFQDNs are the names by which a service is reached from the
// proxy's namespace: its hostname, and for Kubernetes services
// name.namespace, name.namespace.svc and, in the same namespace, name.
func (g *gen) serviceNames(svc *registryv1.Service) []string {
	host := svc.GetHostname()
	names := []string{host}
	if svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE {
		suffix := ".svc." + g.pc.DomainSuffix
		if base, ok := strings.CutSuffix(host, suffix); ok {
			names = append(names, base+".svc", base)
			if svc.GetNamespace() == g.p.Namespace {
				short, _, _ := strings.Cut(base, ".")
				names = append(names, short)
			}
		}
	}
	return names
}
