package translate

import (
	"fmt"
	"slices"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// The generator's state: what one proxy's translation reads, remembers
// and reports, shared by every builder.

// gen carries what one proxy's translation needs, and what it built. Its
// flavour and client are chosen once (flavourOf); sc and gw are the
// state of one flavour's own builders, left zero for the others.
type gen struct {
	pc     *model.PushContext
	p      *model.Proxy
	scope  *model.Scope
	fl     flavour
	client client

	clusters  map[string]*builtCluster // name → built (nil entry: does not exist)
	las       map[string]*endpointv3.ClusterLoadAssignment
	routesBy  map[string]*routev3.RouteConfiguration
	listeners []*listenerv3.Listener
	sc        sidecarState
	gw        gatewayState
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
	// defaultRetries are the default retry policies, without and with a
	// hash policy (sharedDefaultRetryPolicy).
	defaultRetries [2]*routev3.RetryPolicy
	// grpcDefaultRetries is the default retry policy with only the
	// conditions gRPC clients understand (grpcDefaultRetryPolicy).
	grpcDefaultRetries *routev3.RetryPolicy
	// packErrs counts messages that failed validation when packed.
	packErrs int
	empties  map[string]*anypb.Any
	// tel is the proxy's telemetry, as far as built (access logs).
	tel telemetryState
	// ef is the proxy's EnvoyFilter patches (envoyfilter.go).
	ef efState
}

// telemetryState is what a generator built of the proxy's telemetry.
type telemetryState struct {
	applied   *model.AppliedTelemetry
	logs      map[[2]int][]*accesslogv3.AccessLog
	providers map[string]*accesslogv3.AccessLog
	tracing   map[model.WorkloadMode]builtTracing
	stats     map[model.WorkloadMode][]*anypb.Any
}

type builtCluster struct {
	c   *clusterv3.Cluster
	svc *registryv1.Service
	// port and subset of an outbound EDS cluster, for its endpoints.
	port   *registryv1.ServicePort
	subset *networking.Subset
	dr     *model.DestinationRule
}

// problem records something dropped or degraded, once.
func (g *gen) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if !slices.Contains(g.problems, msg) {
		g.problems = append(g.problems, msg)
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

// shared is something built once per push context for many proxies, with
// the problems found building it (replayed to each proxy's report).
type shared struct {
	value    any
	problems []string
}

// isolated is a generator sharing g's inputs but none of its findings, to
// build what goes into the push context's memo.
func (g *gen) isolated() *gen {
	return &gen{
		pc: g.pc, p: g.p, scope: g.scope, fl: g.fl, client: g.client, locality: g.locality, localityStr: g.localityStr,
		clusters: map[string]*builtCluster{}, las: map[string]*endpointv3.ClusterLoadAssignment{},
		routesBy: map[string]*routev3.RouteConfiguration{}, empties: map[string]*anypb.Any{},
	}
}

// appliedTelemetry is the Telemetries that apply to the proxy.
func (g *gen) appliedTelemetry() *model.AppliedTelemetry {
	if g.tel.applied == nil {
		g.tel.applied = g.pc.ProxyTelemetry(g.p.Namespace, g.p.Labels)
	}
	return g.tel.applied
}
