package translate

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// efValues are patch values by applyTo: some valid, some that break
// what they are applied to (a field out of range, a filter after the
// router, a nameless virtual host).
var efValues = map[networking.EnvoyFilter_ApplyTo][]map[string]any{
	networking.EnvoyFilter_CLUSTER: {
		{"per_connection_buffer_limit_bytes": 1024.0},
		{"connect_timeout": "-1s"},
		{"name": "added", "type": "STATIC", "connect_timeout": "1s"},
		{"lb_policy": "RING_HASH", "ring_hash_lb_config": map[string]any{"minimum_ring_size": 10.0, "maximum_ring_size": 5.0}},
	},
	networking.EnvoyFilter_LISTENER: {
		{"per_connection_buffer_limit_bytes": 2048.0},
		{"address": map[string]any{"socket_address": map[string]any{"address": "0.0.0.0", "port_value": 99999.0}}},
		{"name": "added", "address": map[string]any{"socket_address": map[string]any{"address": "0.0.0.0", "port_value": 7000.0}}, "filter_chains": []any{map[string]any{"filters": []any{tcpProxyValue("BlackHoleCluster")}}}},
	},
	networking.EnvoyFilter_LISTENER_FILTER: {
		{"name": "envoy.filters.listener.proxy_protocol", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol"}},
		{"name": ""},
	},
	networking.EnvoyFilter_FILTER_CHAIN: {
		{"transport_socket_connect_timeout": "5s"},
		{"name": "added", "filters": []any{tcpProxyValue("PassthroughCluster")}, "filter_chain_match": map[string]any{"server_names": []any{"x.example.com"}}},
		{"filters": []any{map[string]any{"name": ""}}},
	},
	networking.EnvoyFilter_NETWORK_FILTER: {
		{"name": "envoy.filters.network.local_ratelimit", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit", "stat_prefix": "rl", "token_bucket": map[string]any{"max_tokens": 1.0, "fill_interval": "1s"}}},
		{"name": "envoy.filters.network.local_ratelimit", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit"}},
		{"typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager", "server_name": "patched"}},
	},
	networking.EnvoyFilter_HTTP_FILTER: {
		{"name": "lua", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "default_source_code": map[string]any{"inline_string": "-- x"}}},
		{"name": "envoy.filters.http.router", "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", "suppress_envoy_headers": true}},
		{"name": ""},
	},
	networking.EnvoyFilter_ROUTE_CONFIGURATION: {
		{"request_headers_to_add": []any{map[string]any{"header": map[string]any{"key": "x-a", "value": "1"}}}},
		{"virtual_hosts": []any{map[string]any{"name": "", "domains": []any{"*"}}}},
	},
	networking.EnvoyFilter_VIRTUAL_HOST: {
		{"name": "added", "domains": []any{"added.example.com"}, "routes": []any{map[string]any{"match": map[string]any{"prefix": "/"}, "direct_response": map[string]any{"status": 204.0}}}},
		{"include_request_attempt_count": true},
		{"domains": []any{""}},
	},
	networking.EnvoyFilter_HTTP_ROUTE: {
		{"name": "added", "match": map[string]any{"prefix": "/x"}, "direct_response": map[string]any{"status": 200.0}},
		{"route": map[string]any{"timeout": "3s"}},
		{"direct_response": map[string]any{"status": 99.0}},
	},
}

func tcpProxyValue(cluster string) map[string]any {
	return map[string]any{"name": tcpProxyFilter, "typed_config": map[string]any{
		"@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy", "stat_prefix": "p", "cluster": cluster,
	}}
}

// efMatches are matches for random patches, of every kind.
func efMatches() []*networking.EnvoyFilter_EnvoyConfigObjectMatch {
	lm := func(l *networking.EnvoyFilter_ListenerMatch) *networking.EnvoyFilter_EnvoyConfigObjectMatch_Listener {
		return &networking.EnvoyFilter_EnvoyConfigObjectMatch_Listener{Listener: l}
	}
	hcm := &networking.EnvoyFilter_ListenerMatch_FilterChainMatch{Filter: &networking.EnvoyFilter_ListenerMatch_FilterMatch{
		Name: hcmFilter, SubFilter: &networking.EnvoyFilter_ListenerMatch_SubFilterMatch{Name: "envoy.filters.http.router"},
	}}
	return []*networking.EnvoyFilter_EnvoyConfigObjectMatch{
		nil,
		{Context: networking.EnvoyFilter_SIDECAR_OUTBOUND},
		{Context: networking.EnvoyFilter_SIDECAR_INBOUND},
		{Context: networking.EnvoyFilter_GATEWAY},
		{ObjectTypes: lm(&networking.EnvoyFilter_ListenerMatch{PortNumber: 80})},
		{ObjectTypes: lm(&networking.EnvoyFilter_ListenerMatch{PortNumber: 80, FilterChain: hcm})},
		{ObjectTypes: lm(&networking.EnvoyFilter_ListenerMatch{Name: VirtualInbound, FilterChain: hcm})},
		{ObjectTypes: lm(&networking.EnvoyFilter_ListenerMatch{PortNumber: 9000, FilterChain: &networking.EnvoyFilter_ListenerMatch_FilterChainMatch{
			Filter: &networking.EnvoyFilter_ListenerMatch_FilterMatch{Name: "envoy.filters.network.tcp_proxy"},
		}})},
		{ObjectTypes: lm(&networking.EnvoyFilter_ListenerMatch{ListenerFilter: "envoy.filters.listener.http_inspector"})},
		{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_RouteConfiguration{RouteConfiguration: &networking.EnvoyFilter_RouteConfigurationMatch{PortNumber: 80}}},
		{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_RouteConfiguration{RouteConfiguration: &networking.EnvoyFilter_RouteConfigurationMatch{
			Vhost: &networking.EnvoyFilter_RouteConfigurationMatch_VirtualHostMatch{Route: &networking.EnvoyFilter_RouteConfigurationMatch_RouteMatch{Name: "default"}},
		}}},
		{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Cluster{Cluster: &networking.EnvoyFilter_ClusterMatch{Service: "a.default.svc.cluster.local"}}},
		{ObjectTypes: &networking.EnvoyFilter_EnvoyConfigObjectMatch_Cluster{Cluster: &networking.EnvoyFilter_ClusterMatch{PortNumber: 9000}}},
	}
}

// efStore is a mesh of one HTTP and TCP service whose endpoint is the
// sidecar under test, a Gateway, and the given EnvoyFilters.
func efStore(efs ...*networking.EnvoyFilter) *model.Store {
	s := serviceA(&registryv1.Endpoint{Address: "10.1.0.9", Labels: map[string]string{"app": "a"}})
	kinds := kindsByName()
	s.PutObject(&istio.Object{Kind: kinds[istio.Gateway], Meta: istio.Meta{Name: "gw", Namespace: "default"}, Spec: &networking.Gateway{
		Selector: map[string]string{"istio": "ingress"},
		Servers:  []*networking.Server{{Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}, Hosts: []string{"*"}}},
	}})
	for i, ef := range efs {
		s.PutObject(&istio.Object{Kind: kinds[istio.EnvoyFilter], Meta: istio.Meta{Name: fmt.Sprintf("ef%d", i), Namespace: "default"}, Spec: ef})
	}
	return s
}

func efProxies() []*model.Proxy {
	return []*model.Proxy{
		{Type: model.SidecarProxy, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.9")}, ID: "a-1.default", Namespace: "default", Labels: map[string]string{"app": "a"}},
		{Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.1.0.20")}, ID: "gw-1.default", Namespace: "default", Labels: map[string]string{"istio": "ingress"}},
	}
}

var brokeRE = regexp.MustCompile(`makes (cluster|listener|route configuration) (\S+) invalid`)

// TestEnvoyFilterPatchesNeverSendAnInvalidResource applies random
// EnvoyFilters (every applyTo and operation, matches of every kind,
// values valid and breaking) to a sidecar and a gateway: whatever is
// sent passes validation and Envoy's HTTP filter rule, and a resource a
// patch broke is reported and sent exactly as generated without
// EnvoyFilters.
func TestEnvoyFilterPatchesNeverSendAnInvalidResource(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 7))
	plain, _ := efStore().Build(model.BuildOptions{}, nil, 1)
	unpatched := map[string]proto.Message{}
	for _, p := range efProxies() {
		out := Generate(plain, p)
		for _, c := range out.Clusters {
			unpatched[string(p.Type)+"/cluster/"+c.GetName()] = c
		}
		for _, l := range out.Listeners {
			unpatched[string(p.Type)+"/listener/"+l.GetName()] = l
		}
		for _, rc := range out.Routes {
			unpatched[string(p.Type)+"/route configuration/"+rc.GetName()] = rc
		}
	}
	applyTos := []networking.EnvoyFilter_ApplyTo{
		networking.EnvoyFilter_CLUSTER, networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_LISTENER_FILTER,
		networking.EnvoyFilter_FILTER_CHAIN, networking.EnvoyFilter_NETWORK_FILTER, networking.EnvoyFilter_HTTP_FILTER,
		networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE,
	}
	ops := []networking.EnvoyFilter_Patch_Operation{
		networking.EnvoyFilter_Patch_MERGE, networking.EnvoyFilter_Patch_ADD, networking.EnvoyFilter_Patch_REMOVE,
		networking.EnvoyFilter_Patch_INSERT_BEFORE, networking.EnvoyFilter_Patch_INSERT_AFTER, networking.EnvoyFilter_Patch_INSERT_FIRST,
		networking.EnvoyFilter_Patch_REPLACE, networking.EnvoyFilter_Patch_MERGE_AND_REPLACE_LIST,
	}
	matches := efMatches()
	broken, applied := 0, 0
	for iter := range 300 {
		var efs []*networking.EnvoyFilter
		for range 1 + r.IntN(3) {
			ef := &networking.EnvoyFilter{Priority: int32(r.IntN(3) - 1)}
			for range 1 + r.IntN(4) {
				a := applyTos[r.IntN(len(applyTos))]
				op := ops[r.IntN(len(ops))]
				cp := &networking.EnvoyFilter_EnvoyConfigObjectPatch{ApplyTo: a, Match: matches[r.IntN(len(matches))], Patch: &networking.EnvoyFilter_Patch{Operation: op}}
				if op != networking.EnvoyFilter_Patch_REMOVE {
					vs := efValues[a]
					v, err := structpb.NewStruct(vs[r.IntN(len(vs))])
					if err != nil {
						t.Fatal(err)
					}
					cp.Patch.Value = v
				}
				ef.ConfigPatches = append(ef.ConfigPatches, cp)
			}
			efs = append(efs, ef)
		}
		pc, _ := efStore(efs...).Build(model.BuildOptions{}, nil, 1)
		for _, p := range efProxies() {
			out := Generate(pc, p)
			sent := map[string]proto.Message{}
			for _, c := range out.Clusters {
				sent["cluster/"+c.GetName()] = c
			}
			for _, l := range out.Listeners {
				sent["listener/"+l.GetName()] = l
			}
			for _, rc := range out.Routes {
				sent["route configuration/"+rc.GetName()] = rc
			}
			for name, m := range sent {
				if err := Validate(m); err != nil {
					t.Fatalf("iteration %d, %s: %s is sent invalid: %v\n%v", iter, p.Type, name, err, efs)
				}
				if err := checkPatched(m); err != nil {
					t.Fatalf("iteration %d, %s: %s is sent as Envoy refuses it: %v", iter, p.Type, name, err)
				}
			}
			applied += len(out.PatchedBy)
			for _, prob := range out.Problems {
				sm := brokeRE.FindStringSubmatch(prob)
				if sm == nil {
					continue
				}
				broken++
				if !slices.ContainsFunc(slices.Collect(maps.Values(out.EnvoyFilterProblems)), func(ps []string) bool { return slices.Contains(ps, prob) }) {
					t.Fatalf("iteration %d, %s: %q is not among the EnvoyFilters' own problems %v", iter, p.Type, prob, out.EnvoyFilterProblems)
				}
				key := sm[1] + "/" + sm[2]
				if !proto.Equal(sent[key], unpatched[string(p.Type)+"/"+key]) {
					t.Fatalf("iteration %d, %s: %s was reported broken by a patch but is not sent as generated", iter, p.Type, key)
				}
			}
		}
	}
	// The property holds only if both outcomes happened.
	if broken == 0 || applied == 0 {
		t.Fatalf("%d resources patched, %d patches reported breaking one: the random patches exercise too little", applied, broken)
	}
	t.Logf("%d resources patched, %d breaking patches reported", applied, broken)
}

// TestASidecarAndAGatewayWithTheSamePatchesPatchInTheirOwnContexts: one
// EnvoyFilter applies to both (the root namespace's, no selector), one of
// its patches says SIDECAR_OUTBOUND, the other GATEWAY: the cluster they
// share is patched for each by its own, whichever is generated first.
func TestASidecarAndAGatewayWithTheSamePatchesPatchInTheirOwnContexts(t *testing.T) {
	patch := func(ctx networking.EnvoyFilter_PatchContext, limit float64) *networking.EnvoyFilter_EnvoyConfigObjectPatch {
		v, err := structpb.NewStruct(map[string]any{"per_connection_buffer_limit_bytes": limit})
		if err != nil {
			t.Fatal(err)
		}
		return &networking.EnvoyFilter_EnvoyConfigObjectPatch{
			ApplyTo: networking.EnvoyFilter_CLUSTER, Match: &networking.EnvoyFilter_EnvoyConfigObjectMatch{Context: ctx},
			Patch: &networking.EnvoyFilter_Patch{Operation: networking.EnvoyFilter_Patch_MERGE, Value: v},
		}
	}
	s := efStore()
	s.PutObject(&istio.Object{Kind: kindsByName()[istio.EnvoyFilter], Meta: istio.Meta{Name: "by-context", Namespace: model.DefaultRootNamespace}, Spec: &networking.EnvoyFilter{
		ConfigPatches: []*networking.EnvoyFilter_EnvoyConfigObjectPatch{patch(networking.EnvoyFilter_SIDECAR_OUTBOUND, 1024), patch(networking.EnvoyFilter_GATEWAY, 2048)},
	}})
	const name = "outbound|80||a.default.svc.cluster.local"
	for _, order := range [][]int{{0, 1}, {1, 0}} {
		pc, _ := s.Build(model.BuildOptions{}, nil, 1)
		got := map[model.ProxyType]uint32{}
		for _, i := range order {
			p := efProxies()[i]
			for _, c := range NewGenerator(pc, p).Clusters([]string{name}) {
				got[p.Type] = c.GetPerConnectionBufferLimitBytes().GetValue()
			}
		}
		if got[model.SidecarProxy] != 1024 || got[model.RouterProxy] != 2048 {
			t.Errorf("order %v: buffer limits %v, want the sidecar's 1024 and the gateway's 2048", order, got)
		}
	}
}
