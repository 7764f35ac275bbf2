package translate

import (
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// Types are the xDS types a Generator builds, in the order a push sends
// them (the table's, xdstype.URLs).
func Types() []string { return xdstype.URLs() }

// Resources returns the resources of one xDS type (a type URL of Types)
// with the names asked, sorted; nil names means all of them. Any other
// type gets none.
func (x *Generator) Resources(typeURL string, names []string) []proto.Message {
	var out []proto.Message
	switch typeURL {
	case resourcev3.ClusterType:
		for _, r := range x.Clusters(names) {
			out = append(out, r)
		}
	case resourcev3.EndpointType:
		for _, r := range x.Endpoints(names) {
			out = append(out, r)
		}
	case resourcev3.ListenerType:
		for _, r := range x.Listeners(names) {
			out = append(out, r)
		}
	case resourcev3.RouteType:
		for _, r := range x.Routes(names) {
			out = append(out, r)
		}
	case resourcev3.SecretType:
		for _, r := range x.Secrets(names) {
			out = append(out, r)
		}
	case resourcev3.ExtensionConfigType:
		for _, r := range x.ExtensionConfigs(names) {
			out = append(out, r)
		}
	case xdstype.NameTableType:
		out = append(out, x.NameTable())
	}
	return out
}

// ResourceName is the name a resource is known by in xDS: a load
// assignment's cluster name, any other resource's name.
func ResourceName(m proto.Message) string {
	if r, ok := m.(interface{ GetClusterName() string }); ok {
		return r.GetClusterName()
	}
	if r, ok := m.(interface{ GetName() string }); ok {
		return r.GetName()
	}
	return ""
}

// ConcernedTypes are the xDS types a full change can change for a proxy
// whose own workload it does not touch (model.ChangeSet.Kinds): every
// type, except when only VirtualServices changed. Clusters, their load
// assignments and secrets are never built from a VirtualService here, so
// those changes concern listeners (TCP and TLS routes) and route
// configurations (HTTP routes) only. Istio's EDS skips VirtualService
// changes too (skippedEdsConfigs); its CDS does not, because its Sidecar
// scope adds the services a VirtualService routes to, which Flotilla's
// scope does not.
func ConcernedTypes(cs model.ChangeSet) []string {
	if cs.All || len(cs.Kinds) == 0 {
		return Types()
	}
	for k := range cs.Kinds {
		if k != istio.VirtualService {
			return Types()
		}
	}
	return []string{resourcev3.ListenerType, resourcev3.RouteType}
}

// DependsOn tells which hosts the resource of an xDS type and name is
// built from, for this proxy and push context, so a server can tell which
// changes concern a proxy that watches resources by name (a proxyless gRPC
// client) without knowing how names are made:
//
//   - an outbound cluster or its endpoints ("outbound|80|v1|reviews…")
//     depend on its service's host, which follows from the name alone,
//     whatever the proxy (a server may match a change against a set of
//     such names once for every proxy watching them);
//   - a proxyless client's listener or route configuration ("host:port")
//     depends on that host and on every destination of the
//     VirtualService that applies to it for this proxy;
//   - anything else (a sidecar's port route "80", inbound and special
//     clusters, named listeners, a proxyless server's listener) depends on more than its name says: all
//     is true, and every change concerns it.
//
// The hosts may be ones that do not exist (yet): a client may watch a
// cluster before its service is there, and its arrival concerns it.
func (x *Generator) DependsOn(typeURL, name string) (hosts []string, all bool) {
	switch typeURL {
	case resourcev3.ClusterType, resourcev3.EndpointType:
		if _, _, host, ok := ParseClusterName(name); ok {
			return []string{host}, false
		}
	case resourcev3.ListenerType, resourcev3.RouteType:
		if strings.HasPrefix(name, GRPCInboundPrefix) {
			return nil, true // the workload's own services and policies
		}
		host, _, ok := ParseListenerName(name)
		if !ok {
			return nil, true
		}
		hosts = []string{host}
		if vs := x.g.scope.VirtualService(host); vs != nil {
			hosts = append(hosts, vs.DestinationHosts(x.g.pc.DomainSuffix)...)
		}
		return hosts, false
	}
	return nil, true
}
