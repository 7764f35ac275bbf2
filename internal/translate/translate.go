// Package translate turns a push context and a proxy into the Envoy xDS
// resources that proxy gets: clusters (CDS), endpoints (EDS), listeners
// (LDS) and route configurations (RDS), in the flavour its kind accepts
// (Envoy sidecars, or proxyless gRPC clients for GENERATOR=grpc nodes).
// Everything here is pure and deterministic: the same input gives the same
// resources, sorted by name. Resources that fail their generated Validate()
// or the cross-reference checks are dropped and reported, never returned.
package translate

import (
	"maps"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Output is everything generated for one proxy.
type Output struct {
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	// ExtensionConfigs are the ECDS resources (ExtensionConfigs).
	ExtensionConfigs []*corev3.TypedExtensionConfig
	// Problems lists what was dropped or degraded, and why. Translation
	// goes on without the bad part.
	Problems []string
	// PatchedBy names the EnvoyFilters that changed or added each
	// resource, by "kind/name" (Generator.PatchedBy).
	PatchedBy map[string][]string
	// EnvoyFilterProblems are the problems of each EnvoyFilter, by its
	// key (Generator.EnvoyFilterProblems).
	EnvoyFilterProblems map[string][]string
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
	out.ExtensionConfigs = g.ExtensionConfigs(nil)
	out.Problems = g.Problems()
	out.PatchedBy = g.PatchedBy()
	out.EnvoyFilterProblems = g.EnvoyFilterProblems()
	return out
}

// Generator translates for one proxy and one push context, resource by
// resource, remembering what it built: a route that names a cluster
// builds (and validates) that cluster once. Not safe for concurrent use.
type Generator struct {
	g *gen
	// taken is how much of what g found Found has returned.
	taken struct{ problems, envoyFilters int }
}

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
	ps := x.g.envoyFilters()
	patch := ps.has([]networking.EnvoyFilter_ApplyTo{networking.EnvoyFilter_CLUSTER})
	var built []*builtCluster
	for _, n := range uniqueSorted(names) {
		c := x.g.cluster(n)
		switch {
		case c == nil:
		case patch:
			built = append(built, c)
		default:
			out = append(out, c.c)
		}
	}
	if patch {
		out = withAdded(x.g, x.g.patchClusters(built, ps), x.g.addedClusters(), names, "cluster")
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
	ps := x.g.envoyFilters()
	patch := ps.has(routeApplyTos)
	for _, n := range uniqueSorted(names) {
		rc := x.g.route(n)
		switch {
		case rc == nil:
		case patch:
			out = append(out, x.g.patchOne("route configuration", rc, ps, x.g.patchRoute).(*routev3.RouteConfiguration))
		default:
			out = append(out, rc)
		}
	}
	return out
}

// Listeners returns the named listeners that exist, sorted; nil names
// means all of them.
func (x *Generator) Listeners(names []string) []*listenerv3.Listener {
	all := x.g.patchListeners(x.g.fl.listeners(x.g, names))
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

// PatchedBy names the EnvoyFilters that changed or added each resource
// built so far, by "kind/name" ("cluster/outbound|80||a.b.svc.cluster.local").
func (x *Generator) PatchedBy() map[string][]string { return maps.Clone(x.g.ef.by) }

// DestinationRules names the DestinationRule ("namespace/name") each
// outbound cluster built so far follows, by cluster name: what an Envoy
// cluster's istio metadata says too, for proxyless clusters as well,
// whose xDS carries none (as Istio's grpcgen).
func (x *Generator) DestinationRules() map[string]string {
	out := map[string]string{}
	for name, b := range x.g.clusters {
		if b != nil && b.dr != nil {
			out[name] = b.dr.Namespace + "/" + b.dr.Name
		}
	}
	return out
}

// EnvoyFilterProblems are the problems so far of each EnvoyFilter that
// has any, by its key (namespace/name): a patch not applied, and why
// (they are among Problems too).
func (x *Generator) EnvoyFilterProblems() map[string][]string {
	out := map[string][]string{}
	for _, p := range x.g.ef.problems {
		out[p.filter] = append(out[p.filter], p.msg)
	}
	return out
}

// NameTable is the proxy's name table (NDS): the one resource of its
// type, which its agent answers DNS from (nameTable).
func (x *Generator) NameTable() *ndsv1.NameTable { return x.g.nameTable() }

// Problems lists what was dropped or degraded so far, and why.
func (x *Generator) Problems() []string { return slices.Clone(x.g.problems) }

// Found returns what the generator found since the last call (or since
// it was made): the problems (as Problems) and the EnvoyFilters' problems
// (as EnvoyFilterProblems). A generator finds a problem once.
func (x *Generator) Found() (problems []string, envoyFilters map[string][]string) {
	problems = slices.Clone(x.g.problems[x.taken.problems:])
	envoyFilters = map[string][]string{}
	for _, p := range x.g.ef.problems[x.taken.envoyFilters:] {
		envoyFilters[p.filter] = append(envoyFilters[p.filter], p.msg)
	}
	x.taken.problems, x.taken.envoyFilters = len(x.g.problems), len(x.g.ef.problems)
	return problems, envoyFilters
}

func newGen(pc *model.PushContext, p *model.Proxy) *gen {
	fl, c := flavourOf(p)
	return &gen{
		pc: pc, p: p, scope: pc.Scope(p), fl: fl, client: c,
		clusters: map[string]*builtCluster{}, las: map[string]*endpointv3.ClusterLoadAssignment{},
		routesBy: map[string]*routev3.RouteConfiguration{}, empties: map[string]*anypb.Any{},
	}
}

// flavourOf chooses the flavour of a proxy and the client it runs.
func flavourOf(p *model.Proxy) (flavour, client) {
	switch {
	case p.ProxylessGRPC():
		return proxyless{}, grpcClient()
	case p.Type == model.RouterProxy:
		return router{}, envoyClient(p.IstioTelemetry)
	default:
		c := envoyClient(p.IstioTelemetry)
		c.allocatedAddresses = p.CapturesDNS()
		return sidecar{}, c
	}
}

// TelemetryOf says what mesh telemetry a proxy's configuration carries,
// as proxy-status shows it: the client it runs decides (flavourOf).
func TelemetryOf(p *model.Proxy) string {
	_, c := flavourOf(p)
	switch {
	case c.istioTelemetry:
		return "Istio's metrics, access logs, tracing"
	case c.envoyTelemetry:
		return "access logs, tracing; no Istio metrics (its Envoy lacks Istio's stats filters)"
	}
	return "none (grpc-go runs no Envoy telemetry)"
}

// ExtensionConfigs returns the ECDS resources with the names asked
// (nil: all), sorted: the configuration of each Wasm extension of the
// proxy (Istio's InsertedTrafficExtensionConfigurations), and those that
// EnvoyFilters add with EXTENSION_CONFIG (Istio's
// InsertedExtensionConfigurations). Lua extensions are inline and have
// none.
func (x *Generator) ExtensionConfigs(names []string) []*corev3.TypedExtensionConfig {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	byName := map[string]*corev3.TypedExtensionConfig{}
	for _, e := range x.g.extensions() {
		if (names != nil && !want[e.ResourceName]) || e.Spec.GetWasm() == nil {
			continue
		}
		if ec := x.g.extensionConfig(e); ec != nil {
			byName[ec.GetName()] = ec
		}
	}
	for _, ec := range x.g.addedExtensionConfigs() {
		if _, taken := byName[ec.GetName()]; !taken && (names == nil || want[ec.GetName()]) {
			byName[ec.GetName()] = ec
		}
	}
	out := make([]*corev3.TypedExtensionConfig, 0, len(byName))
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[n])
	}
	return out
}
