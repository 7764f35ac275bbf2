package translate

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// The small helpers every builder borrows: what a service looks like to
// the proxy (headless, sniffed, reached per endpoint, by gRPC), its names
// and addresses, config sources, and filters built with their checks.

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

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func sortByName[T interface{ GetName() string }](s []T) {
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(a.GetName(), b.GetName()) })
}

func uniqueSorted(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
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

// sanMatchers match a certificate's SANs against names exactly: a URI
// SAN for "spiffe://…" and other URIs, an IP SAN for addresses, a DNS SAN
// otherwise (Istio matches the name against any SAN).
func sanMatchers(names []string) []*tlsv3.SubjectAltNameMatcher {
	out := make([]*tlsv3.SubjectAltNameMatcher, 0, len(names))
	for _, n := range names {
		t := tlsv3.SubjectAltNameMatcher_DNS
		if strings.Contains(n, "://") {
			t = tlsv3.SubjectAltNameMatcher_URI
		} else if _, err := netip.ParseAddr(n); err == nil {
			t = tlsv3.SubjectAltNameMatcher_IP_ADDRESS
		}
		out = append(out, &tlsv3.SubjectAltNameMatcher{SanType: t, Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: n}}})
	}
	return out
}

func single(cluster string) []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight {
	return []*tcpproxyv3.TcpProxy_WeightedCluster_ClusterWeight{{Name: cluster, Weight: 1}}
}

// headless reports whether a service is a Kubernetes Service without a
// cluster IP, whose clients reach each pod by its own address.
func headless(svc *registryv1.Service) bool {
	return svc.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE &&
		svc.GetResolution() == registryv1.Resolution_RESOLUTION_NONE && len(ipAddresses(svc.GetAddresses())) == 0
}

// sniffed reports whether a port's protocol is told per connection
// (Istio's "auto": no protocol declared, an unknown port name prefix).
func sniffed(p registryv1.Protocol) bool { return p == registryv1.Protocol_PROTOCOL_UNSPECIFIED }

// serviceAddresses are the addresses the proxy reaches a service at:
// its own, or for a client that resolves hosts through the name table
// (client.allocatedAddresses), those allocated to a ServiceEntry host
// without any, of the proxy's address families (Istio's
// GetAllAddressesForProxy).
func (g *gen) serviceAddresses(svc *registryv1.Service) []string {
	own := ipAddresses(svc.GetAddresses())
	if len(own) > 0 || !g.client.allocatedAddresses {
		return own
	}
	v4, v6 := g.addressFamilies()
	v4 = v4 || !v6 // IPv4 when the proxy names no address (Istio's DiscoverIPMode)
	var out []string
	for _, a := range svc.GetAutoAllocatedAddresses() {
		if ip, err := netip.ParseAddr(a); err == nil && ((ip.Is4() && v4) || (ip.Is6() && v6)) {
			out = append(out, a)
		}
	}
	return out
}

// addressFamilies tells whether the proxy has IPv4 and IPv6 addresses.
func (g *gen) addressFamilies() (v4, v6 bool) {
	for _, ip := range g.p.IPs {
		v4, v6 = v4 || ip.Is4(), v6 || ip.Is6()
	}
	return v4, v6
}

func ipAddresses(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if !strings.Contains(a, "/") && a != "" && a != "None" {
			out = append(out, a)
		}
	}
	return out
}

// grpcReachable reports whether a proxyless gRPC client can call the
// service: it needs endpoints it is told about (not passthrough, nor
// resolved by the proxy per request).
func grpcReachable(svc *registryv1.Service) bool {
	return svc.GetResolution() != registryv1.Resolution_RESOLUTION_NONE && svc.GetResolution() != registryv1.Resolution_RESOLUTION_DYNAMIC_DNS
}

// onPortRoute reports whether a service port's HTTP traffic is routed by
// the shared route configuration of its port number ("80"): HTTP ports,
// and sniffed ports of services without an address to listen on (neither
// their own nor their endpoints', see perEndpoint).
func (g *gen) onPortRoute(svc *registryv1.Service, port *registryv1.ServicePort) bool {
	return isHTTP(port.GetProtocol()) ||
		(sniffed(port.GetProtocol()) && len(g.serviceAddresses(svc)) == 0 && !g.perEndpoint(svc))
}

// perEndpoint reports whether a service's TCP and sniffed ports get a
// listener per endpoint address: headless Kubernetes Services, and
// passthrough ServiceEntries without an address that list endpoints
// (Istio's buildSidecarOutboundListeners).
func (g *gen) perEndpoint(svc *registryv1.Service) bool {
	if svc.GetResolution() != registryv1.Resolution_RESOLUTION_NONE || len(ipAddresses(svc.GetAddresses())) > 0 {
		return false
	}
	if headless(svc) {
		return true
	}
	return slices.ContainsFunc(g.pc.Endpoints(svc), func(ep *registryv1.Endpoint) bool {
		_, ok := g.peerAddress(ep)
		return ok
	})
}

// endpointAddresses are the IP addresses of a service's endpoints, sorted,
// but the proxy's own: traffic to itself does not go through an outbound
// listener.
func (g *gen) endpointAddresses(svc *registryv1.Service) []string {
	var out []string
	for _, ep := range g.pc.Endpoints(svc) {
		if a, ok := g.peerAddress(ep); ok {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// tlsSocket is Envoy's TLS transport socket holding ctx (an upstream or
// downstream TLS context).
func (g *gen) tlsSocket(ctx proto.Message) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: g.pack(ctx)}}
}

// hostPort finds the service and port a "host:port" name is about.
func (g *gen) hostPort(name string) (*registryv1.Service, *registryv1.ServicePort) {
	host, n, ok := ParseListenerName(name)
	if !ok {
		return nil, nil
	}
	svc := g.scope.Service(host)
	if svc == nil {
		return nil, nil
	}
	port := servicePort(svc, n)
	if port == nil {
		return nil, nil
	}
	return svc, port
}

func servicePort(svc *registryv1.Service, n uint32) *registryv1.ServicePort {
	for _, p := range svc.GetPorts() {
		if p.GetNumber() == n {
			return p
		}
	}
	return nil
}

// peerAddress is an endpoint's IP address, unless it is not one or is
// the proxy's own.
func (g *gen) peerAddress(ep *registryv1.Endpoint) (string, bool) {
	a, err := netip.ParseAddr(ep.GetAddress())
	if err != nil || slices.Contains(g.p.IPs, a) {
		return "", false
	}
	return a.String(), true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
