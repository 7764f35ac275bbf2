package translate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	extauthzhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	rbachttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	extauthztcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbactcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Filter names, as Istio writes them.
const (
	rbacHTTPFilter     = "envoy.filters.http.rbac"
	rbacTCPFilter      = "envoy.filters.network.rbac"
	extAuthzHTTPFilter = "envoy.filters.http.ext_authz"
	extAuthzTCPFilter  = "envoy.filters.network.ext_authz"
	// grpc-go needs distinct names for filters of one type (Istio's
	// grpcgen names).
	rbacGRPCDeny   = "envoy.filters.http.rbac.DENY"
	rbacGRPCCustom = "envoy.filters.http.rbac.CUSTOM"
)

// workloadAuthz is the authorization of one workload's inbound traffic,
// as filters, with what building them reported.
type workloadAuthz struct {
	http []*hcmv3.HttpFilter  // sidecar HTTP connection managers
	tcp  []*listenerv3.Filter // sidecar TCP chains
	grpc []*hcmv3.HttpFilter  // proxyless gRPC servers
	// httpJWT and httpRBAC are where in http the JWT filter and the
	// RBAC filters begin (what comes before is CUSTOM's); tcpRBAC where
	// in tcp the RBAC filters begin: extensions go between them
	// (policyHTTPFilters, policyNetworkFilters).
	httpJWT, httpRBAC, tcpRBAC int
	problems                   []string
	packErrs                   int
}

// httpParts are the HTTP filters of CUSTOM policies, the JWT filter and
// the RBAC filters.
func (w *workloadAuthz) httpParts() (custom, jwt, rbac []*hcmv3.HttpFilter) {
	return w.http[:w.httpJWT], w.http[w.httpJWT:w.httpRBAC], w.http[w.httpRBAC:]
}

// tcpParts are the network filters of CUSTOM policies and the RBAC
// filters.
func (w *workloadAuthz) tcpParts() (custom, rbac []*listenerv3.Filter) {
	return w.tcp[:w.tcpRBAC], w.tcp[w.tcpRBAC:]
}

// workloadAuthz returns the proxy's authorization filters. They depend on
// nothing but the policies that apply and the push context, so proxies
// under the same policies share them (memoised in the push context; the
// filters are never changed once built); each proxy reports their
// problems.
func (g *gen) workloadAuthz() *workloadAuthz {
	if g.authzBuilt != nil {
		return g.authzBuilt
	}
	policies := g.pc.WorkloadAuthorizationPolicies(g.p.Namespace, g.p.Labels)
	var authns []*model.RequestAuthentication
	if g.client.envoyHTTP {
		// grpc-go has no JWT filter: RequestAuthentication does not
		// apply to proxyless servers (as in Istio), whose requestPrincipals
		// then never match.
		authns = g.pc.WorkloadRequestAuthentications(g.p.Namespace, g.p.Labels)
	}
	var key strings.Builder
	key.WriteString("authz|" + g.client.name + "|" + strconv.FormatBool(g.fl.jwtClearsRouteCache()) + "|")
	for _, ap := range policies {
		key.WriteString(ap.Namespace + "/" + ap.Name + ",")
	}
	key.WriteString("|")
	for _, ra := range authns {
		key.WriteString(ra.Namespace + "/" + ra.Name + ",")
	}
	w, _ := g.pc.Memo(key.String(), func() any {
		b := g.isolated()
		w := &workloadAuthz{}
		switch {
		case g.client.grpcRBAC && len(policies) > 0:
			w.grpc = b.authzGRPCFilters(policies)
		case len(policies) > 0 || len(authns) > 0:
			w.http, w.httpJWT, w.httpRBAC = b.authzHTTPFilters(policies, b.jwtFilter(authns))
			w.tcp, w.tcpRBAC = b.authzTCPFilters(policies)
		}
		w.problems, w.packErrs = b.problems, b.packErrs
		return w
	}).(*workloadAuthz)
	for _, p := range w.problems {
		g.problem("%s", p)
	}
	g.packErrs += w.packErrs
	g.authzBuilt = w
	return w
}

// authz translates the policies for one target, its problems reported.
func (g *gen) authz(policies []*model.AuthorizationPolicy, t authz.Target) *authz.Set {
	s := authz.Build(policies, authz.Options{Target: t, TrustDomains: g.trustDomains()})
	for _, p := range s.Problems {
		g.problem("%s", p)
	}
	return &s
}

// trustDomains are the mesh's trust domain, then its aliases.
func (g *gen) trustDomains() []string {
	return append([]string{g.pc.TrustDomain}, g.pc.Mesh.GetTrustDomainAliases()...)
}

// authzHTTPFilters are the authentication and authorization filters of
// an inbound HTTP connection manager, in Istio's order: CUSTOM (RBAC in
// shadow mode choosing the requests, then ext_authz asking the provider),
// the JWT filter (jwt, may be nil), then RBAC for AUDIT, DENY and ALLOW;
// and where the JWT filter and RBAC begin.
func (g *gen) authzHTTPFilters(policies []*model.AuthorizationPolicy, jwt *hcmv3.HttpFilter) (out []*hcmv3.HttpFilter, jwtAt, rbacAt int) {
	s := g.authz(policies, authz.HTTP)
	rbacFilter := func(m *rbachttpv3.RBAC) {
		out = append(out, &hcmv3.HttpFilter{Name: rbacHTTPFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(m)}})
	}
	for _, c := range g.customProviders(s) {
		ext, err := g.extAuthz(c.Provider)
		if c.bad || err != nil {
			rbacFilter(&rbachttpv3.RBAC{Rules: authz.DenyInstead(c.Custom)})
			continue
		}
		m := &rbachttpv3.RBAC{ShadowRules: c.Enforce, ShadowRulesStatPrefix: authz.ExtAuthzShadowPrefix}
		if c.Shadow != nil && len(c.Shadow.GetPolicies()) > 0 {
			m.Rules = c.Shadow
		}
		rbacFilter(m)
		ext.http.FilterEnabledMetadata = extAuthzEnabled(rbacHTTPFilter, c.Provider)
		out = append(out, &hcmv3.HttpFilter{Name: extAuthzHTTPFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(ext.http)}})
	}
	jwtAt = len(out)
	if jwt != nil {
		out = append(out, jwt)
	}
	rbacAt = len(out)
	for _, r := range []authz.Rules{s.Audit, s.Deny, s.Allow} {
		if r == (authz.Rules{}) {
			continue
		}
		rbacFilter(&rbachttpv3.RBAC{Rules: r.Enforce, ShadowRules: r.Shadow, ShadowRulesStatPrefix: shadowPrefix(r.Shadow)})
	}
	return out, jwtAt, rbacAt
}

// authzTCPFilters are the authorization filters of an inbound TCP chain,
// before tcp_proxy: CUSTOM with a gRPC provider (an HTTP provider cannot
// check a connection: Istio leaves the policy off TCP chains, and so do
// we, reported), then network RBAC for AUDIT, DENY and ALLOW, where
// rules with request attributes are dropped (ALLOW) or narrowed to the
// rest of their fields (the others); and where RBAC begins.
func (g *gen) authzTCPFilters(policies []*model.AuthorizationPolicy) (out []*listenerv3.Filter, rbacAt int) {
	s := g.authz(policies, authz.TCP)
	rbacFilter := func(m *rbactcpv3.RBAC) {
		m.StatPrefix = "tcp."
		out = append(out, g.networkFilter(rbacTCPFilter, m))
	}
	for _, c := range g.customProviders(s) {
		ext, err := g.extAuthz(c.Provider)
		switch {
		case c.bad || err != nil:
			rbacFilter(&rbactcpv3.RBAC{Rules: authz.DenyInstead(c.Custom)})
		case ext.tcp == nil:
			g.problem("AuthorizationPolicy CUSTOM: provider %q is HTTP only; its policies do not apply to TCP traffic, as in Istio", c.Provider)
		default:
			m := &rbactcpv3.RBAC{ShadowRules: c.Enforce, ShadowRulesStatPrefix: authz.ExtAuthzShadowPrefix}
			if c.Shadow != nil && len(c.Shadow.GetPolicies()) > 0 {
				m.Rules = c.Shadow
			}
			rbacFilter(m)
			ext.tcp.FilterEnabledMetadata = extAuthzEnabled(rbacTCPFilter, c.Provider)
			out = append(out, g.networkFilter(extAuthzTCPFilter, ext.tcp))
		}
	}
	rbacAt = len(out)
	for _, r := range []authz.Rules{s.Audit, s.Deny, s.Allow} {
		if r == (authz.Rules{}) {
			continue
		}
		rbacFilter(&rbactcpv3.RBAC{Rules: r.Enforce, ShadowRules: r.Shadow, ShadowRulesStatPrefix: shadowPrefix(r.Shadow)})
	}
	return out, rbacAt
}

// authzGRPCFilters are the authorization filters of a proxyless gRPC
// server's listener. grpc-go's RBAC (gRFC A41) enforces ALLOW and DENY
// only: CUSTOM cannot ask a provider there, so the requests it would ask
// about are denied (reported); AUDIT and dry-run policies, which enforce
// nothing, are left out.
func (g *gen) authzGRPCFilters(policies []*model.AuthorizationPolicy) []*hcmv3.HttpFilter {
	s := g.authz(policies, authz.GRPC)
	var out []*hcmv3.HttpFilter
	add := func(name string, rules *rbacv3.RBAC) {
		out = append(out, &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(&rbachttpv3.RBAC{Rules: rules})}})
	}
	if len(s.Custom) > 0 {
		deny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{}}
		for _, c := range s.Custom {
			g.problem("AuthorizationPolicy CUSTOM (provider %q): proxyless gRPC servers cannot call an external authorizer; the requests it would check are denied", c.Provider)
			for n, p := range authz.DenyInstead(c).GetPolicies() {
				deny.Policies[n] = p
			}
		}
		add(rbacGRPCCustom, deny)
	}
	if s.Deny.Enforce != nil {
		add(rbacGRPCDeny, s.Deny.Enforce)
	}
	if s.Allow.Enforce != nil {
		add(rbacHTTPFilter, s.Allow.Enforce)
	}
	return out
}

// customProviders are the CUSTOM providers of a set. Istio allows one
// provider per workload (without PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS):
// with more, every one of them is denied instead (reported).
func (g *gen) customProviders(s *authz.Set) []customProvider {
	out := make([]customProvider, 0, len(s.Custom))
	for _, c := range s.Custom {
		out = append(out, customProvider{Custom: c})
	}
	if len(out) > 1 {
		names := make([]string, 0, len(out))
		for _, c := range out {
			names = append(names, c.Provider)
		}
		g.problem("AuthorizationPolicy CUSTOM: a workload may use one provider, found %s; the requests they would check are denied", strings.Join(names, ", "))
		for i := range out {
			out[i].bad = true
		}
	}
	return out
}

type customProvider struct {
	authz.Custom
	bad bool
}

type builtExtAuthz struct {
	http *extauthzhttpv3.ExtAuthz
	tcp  *extauthztcpv3.ExtAuthz
}

// extAuthz builds the ext_authz filters of a mesh extension provider, as
// Istio's processExtensionProvider: envoyExtAuthzHttp (HTTP only) or
// envoyExtAuthzGrpc (HTTP and TCP), its service found in the registry
// ("namespace/host", or a host in the first namespace that has it), the
// call timing out after timeout (600 s by default). An error (reported)
// means the provider is unusable.
func (g *gen) extAuthz(provider string) (*builtExtAuthz, error) {
	if r, ok := g.extAuthzs[provider]; ok {
		return r.built, r.err
	}
	built, err := g.buildExtAuthz(provider)
	if g.extAuthzs == nil {
		g.extAuthzs = map[string]extAuthzResult{}
	}
	g.extAuthzs[provider] = extAuthzResult{built, err}
	return built, err
}

type extAuthzResult struct {
	built *builtExtAuthz
	err   error
}

func (g *gen) buildExtAuthz(provider string) (*builtExtAuthz, error) {
	fail := func(format string, args ...any) (*builtExtAuthz, error) {
		err := fmt.Errorf(format, args...)
		g.problem("AuthorizationPolicy CUSTOM: provider %q: %v; the requests it would check are denied", provider, err)
		return nil, err
	}
	var ep *meshv1alpha1.MeshConfig_ExtensionProvider
	for _, p := range g.pc.Mesh.GetExtensionProviders() {
		if p.GetName() == provider {
			if ep != nil {
				return fail("more than one extension provider has this name")
			}
			ep = p
		}
	}
	if ep == nil {
		return fail("no extension provider of this name in the mesh configuration")
	}
	type common interface {
		GetService() string
		GetPort() uint32
		GetTimeout() *durationpb.Duration
		GetFailOpen() bool
		GetStatusOnError() string
	}
	var c common
	switch p := ep.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzHttp:
		c = p.EnvoyExtAuthzHttp
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzGrpc:
		c = p.EnvoyExtAuthzGrpc
	default:
		return fail("it is not an envoyExtAuthzHttp or envoyExtAuthzGrpc provider")
	}
	host, cluster, err := g.providerCluster(c.GetService(), c.GetPort())
	if err != nil {
		return fail("%v", err)
	}
	var status *typev3.HttpStatus
	if s := c.GetStatusOnError(); s != "" {
		code, err := strconv.ParseInt(s, 10, 32)
		if _, known := typev3.StatusCode_name[int32(code)]; err != nil || !known {
			return fail("statusOnError %q is not an HTTP status Envoy knows", s)
		}
		status = &typev3.HttpStatus{Code: typev3.StatusCode(code)}
	}
	timeout := c.GetTimeout()
	if timeout == nil {
		timeout = dur(600 * time.Second)
	}
	out := &builtExtAuthz{}
	switch p := ep.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzHttp:
		h := p.EnvoyExtAuthzHttp
		if pp := h.GetPathPrefix(); pp != "" && !strings.HasPrefix(pp, "/") {
			return fail("pathPrefix %q must start with /", pp)
		}
		svc := &extauthzhttpv3.HttpService{
			PathPrefix: h.GetPathPrefix(),
			ServerUri:  &corev3.HttpUri{Uri: "http://" + host, HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: cluster}, Timeout: timeout},
		}
		for _, k := range sortedKeys(h.GetIncludeAdditionalHeadersInCheck()) {
			if svc.AuthorizationRequest == nil {
				svc.AuthorizationRequest = &extauthzhttpv3.AuthorizationRequest{}
			}
			svc.AuthorizationRequest.HeadersToAdd = append(svc.AuthorizationRequest.HeadersToAdd, &corev3.HeaderValue{Key: k, Value: h.GetIncludeAdditionalHeadersInCheck()[k]})
		}
		if len(h.GetHeadersToUpstreamOnAllow())+len(h.GetHeadersToDownstreamOnDeny())+len(h.GetHeadersToDownstreamOnAllow()) > 0 {
			svc.AuthorizationResponse = &extauthzhttpv3.AuthorizationResponse{
				AllowedUpstreamHeaders:        headerList(h.GetHeadersToUpstreamOnAllow()),
				AllowedClientHeaders:          headerList(h.GetHeadersToDownstreamOnDeny()),
				AllowedClientHeadersOnSuccess: headerList(h.GetHeadersToDownstreamOnAllow()),
			}
		}
		allowed := h.GetIncludeRequestHeadersInCheck()
		if len(allowed) == 0 {
			allowed = h.GetIncludeHeadersInCheck() //nolint:staticcheck // Istio still reads the deprecated field when the new one is empty
		}
		for _, l := range [][]string{allowed, h.GetHeadersToUpstreamOnAllow(), h.GetHeadersToDownstreamOnDeny(), h.GetHeadersToDownstreamOnAllow()} {
			if slices.Contains(l, "*") {
				return fail("a header list cannot be \"*\" alone; use a prefix or suffix")
			}
		}
		out.http = &extauthzhttpv3.ExtAuthz{
			StatusOnError:       status,
			FailureModeAllow:    h.GetFailOpen(),
			TransportApiVersion: corev3.ApiVersion_V3,
			Services:            &extauthzhttpv3.ExtAuthz_HttpService{HttpService: svc},
			AllowedHeaders:      headerList(allowed),
			WithRequestBody:     bufferSettings(h.GetIncludeRequestBodyInCheck()),
		}
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzGrpc:
		gp := p.EnvoyExtAuthzGrpc
		grpcSvc := &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: host}},
			Timeout:         timeout,
		}
		out.http = &extauthzhttpv3.ExtAuthz{
			StatusOnError:       status,
			FailureModeAllow:    gp.GetFailOpen(),
			TransportApiVersion: corev3.ApiVersion_V3,
			Services:            &extauthzhttpv3.ExtAuthz_GrpcService{GrpcService: grpcSvc},
			WithRequestBody:     bufferSettings(gp.GetIncludeRequestBodyInCheck()),
		}
		out.tcp = &extauthztcpv3.ExtAuthz{
			StatPrefix:          "tcp.",
			FailureModeAllow:    gp.GetFailOpen(),
			TransportApiVersion: corev3.ApiVersion_V3,
			GrpcService:         proto.Clone(grpcSvc).(*corev3.GrpcService),
		}
	}
	return out, nil
}

// providerCluster finds an extension provider's service as Istio's
// LookupCluster: "namespace/host" that namespace's, a bare host the
// first namespace's (by name); the cluster is the service's outbound
// cluster of the port.
func (g *gen) providerCluster(service string, port uint32) (host, cluster string, err error) {
	if port == 0 || port > 65535 {
		return "", "", fmt.Errorf("port %d is not between 1 and 65535", port)
	}
	if service == "" {
		return "", "", fmt.Errorf("no service")
	}
	ns, name, qualified := strings.Cut(service, "/")
	if !qualified {
		name = service
	}
	for _, svc := range g.pc.ServicesByHost(name) {
		if !qualified || svc.GetNamespace() == ns {
			return svc.GetHostname(), ClusterName(outbound, port, "", svc.GetHostname()), nil
		}
	}
	return "", "", fmt.Errorf("service %q is not in the registry", service)
}

// extAuthzEnabled runs ext_authz only for requests the provider's shadow
// RBAC matched: their effective policy's name starts with the provider's
// prefix.
func extAuthzEnabled(rbacFilter, provider string) *matcherv3.MetadataMatcher {
	return &matcherv3.MetadataMatcher{
		Filter: rbacFilter,
		Path:   []*matcherv3.MetadataMatcher_PathSegment{{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: authz.ExtAuthzShadowPrefix + authz.ShadowEffectivePolicyID}}},
		Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: authz.ExtAuthzPrefix + "-" + provider + "-"},
		}}},
	}
}

// shadowPrefix is the stat prefix of dry-run rules, by their action.
func shadowPrefix(shadow *rbacv3.RBAC) string {
	switch {
	case shadow == nil:
		return ""
	case shadow.GetAction() == rbacv3.RBAC_ALLOW:
		return authz.DryRunAllowPrefix
	case shadow.GetAction() == rbacv3.RBAC_DENY:
		return authz.DryRunDenyPrefix
	}
	return ""
}

// headerList matches header names case-insensitively, with Istio's
// prefix ("x-*") and suffix ("*-id") forms.
func headerList(names []string) *matcherv3.ListStringMatcher {
	if len(names) == 0 {
		return nil
	}
	out := &matcherv3.ListStringMatcher{}
	for _, n := range names {
		m := &matcherv3.StringMatcher{IgnoreCase: true, MatchPattern: &matcherv3.StringMatcher_Exact{Exact: n}}
		if s, ok := strings.CutPrefix(n, "*"); ok {
			m.MatchPattern = &matcherv3.StringMatcher_Suffix{Suffix: s}
		} else if s, ok := strings.CutSuffix(n, "*"); ok {
			m.MatchPattern = &matcherv3.StringMatcher_Prefix{Prefix: s}
		}
		out.Patterns = append(out.Patterns, m)
	}
	return out
}

func bufferSettings(b *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationRequestBody) *extauthzhttpv3.BufferSettings {
	if b == nil {
		return nil
	}
	return &extauthzhttpv3.BufferSettings{MaxRequestBytes: b.GetMaxRequestBytes(), AllowPartialMessage: b.GetAllowPartialMessage(), PackAsBytes: b.GetPackAsBytes()}
}
