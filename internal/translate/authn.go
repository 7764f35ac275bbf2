package translate

import (
	"cmp"
	"fmt"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/emptypb"
	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/authz"
	"github.com/flotilla-mesh/flotilla/internal/jwks"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// jwtFilter is the jwt_authn filter of the RequestAuthentications that
// apply to a workload, as Istio's convertToEnvoyJwtConfig: one provider
// per JWT rule ("origins-<i>", rules sorted by issuer), its keys inline
// (the rule's jwks, else what discovery fetched from jwksUri or the
// issuer's OpenID configuration: proxies need no route to issuers), the
// verified payload in the "payload" metadata AuthorizationPolicy's
// requestPrincipals and request.auth.* read. A request with no token
// passes; one with a token no provider verifies is refused (401), so
// keys that could not be fetched fail closed for that issuer (reported).
// nil when no RequestAuthentication applies.
func (g *gen) jwtFilter(policies []*model.RequestAuthentication) *hcmv3.HttpFilter {
	type named struct {
		rule  *security.JWTRule
		owner *model.RequestAuthentication
	}
	var rules []named
	for _, ra := range policies {
		for _, r := range ra.Spec.GetJwtRules() {
			rules = append(rules, named{r, ra})
		}
	}
	if len(rules) == 0 {
		return nil
	}
	slices.SortStableFunc(rules, func(a, b named) int { return cmp.Compare(a.rule.GetIssuer(), b.rule.GetIssuer()) })
	cfg := &jwtv3.JwtAuthentication{Providers: map[string]*jwtv3.JwtProvider{}, BypassCorsPreflight: true}
	var each, anyOf []*jwtv3.JwtRequirement
	for i, n := range rules {
		r := n.rule
		name := fmt.Sprintf("origins-%d", i)
		p := &jwtv3.JwtProvider{
			Issuer:               r.GetIssuer(),
			Audiences:            r.GetAudiences(),
			Forward:              r.GetForwardOriginalToken(),
			ForwardPayloadHeader: r.GetOutputPayloadToHeader(),
			PayloadInMetadata:    authz.JWTPayload,
			FromParams:           r.GetFromParams(),
			FromCookies:          r.GetFromCookies(),
			NormalizePayloadInMetadata: &jwtv3.JwtProvider_NormalizePayload{
				SpaceDelimitedClaims: spaceDelimitedClaims(r.GetSpaceDelimitedClaims()),
			},
			ClearRouteCache: g.fl.jwtClearsRouteCache(),
		}
		for _, h := range r.GetFromHeaders() {
			p.FromHeaders = append(p.FromHeaders, &jwtv3.JwtHeader{Name: h.GetName(), ValuePrefix: h.GetPrefix()})
		}
		for _, c := range r.GetOutputClaimToHeaders() {
			p.ClaimToHeaders = append(p.ClaimToHeaders, &jwtv3.JwtClaimToHeader{HeaderName: c.GetHeader(), ClaimName: c.GetClaim()})
		}
		keys := r.GetJwks()
		if loc := model.JWKSLocation(r); loc != "" {
			k := g.pc.JWKS(loc)
			keys = k.Keys
			if k.Err != nil {
				g.problem("RequestAuthentication %s/%s: issuer %q: keys from %s: %v; tokens of this issuer are refused", n.owner.Namespace, n.owner.Name, r.GetIssuer(), loc, k.Err)
				keys = jwks.FailClosed
			}
		} else if parsed, err := jwks.Parse([]byte(keys)); err != nil {
			g.problem("RequestAuthentication %s/%s: issuer %q: inline jwks: %v; tokens of this issuer are refused", n.owner.Namespace, n.owner.Name, r.GetIssuer(), err)
			keys = jwks.FailClosed
		} else {
			keys = parsed
		}
		p.JwksSourceSpecifier = &jwtv3.JwtProvider_LocalJwks{LocalJwks: inlineString(keys)}
		cfg.Providers[name] = p
		byName := &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_ProviderName{ProviderName: name}}
		each = append(each, &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAny{RequiresAny: &jwtv3.JwtRequirementOrList{
			Requirements: []*jwtv3.JwtRequirement{byName, {RequiresType: &jwtv3.JwtRequirement_AllowMissing{AllowMissing: &emptypb.Empty{}}}},
		}}})
		anyOf = append(anyOf, byName)
	}
	// One provider: its token, or none. Several: any one provider's valid
	// token, or every provider's token valid or absent (Istio's
	// outer OR / inner AND).
	req := each[0]
	if len(each) > 1 {
		req = &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAny{RequiresAny: &jwtv3.JwtRequirementOrList{
			Requirements: append(anyOf, &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAll{RequiresAll: &jwtv3.JwtRequirementAndList{Requirements: each}}}),
		}}}
	}
	cfg.Rules = []*jwtv3.RequirementRule{{
		Match:           &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		RequirementType: &jwtv3.RequirementRule_Requires{Requires: req},
	}}
	return &hcmv3.HttpFilter{Name: authz.JWTFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: g.pack(cfg)}}
}

// spaceDelimitedClaims are the claims whose space-separated values are
// read as lists: "scope" and "permission" always, as Istio adds them.
func spaceDelimitedClaims(extra []string) []string {
	out := append([]string{"permission", "scope"}, extra...)
	slices.Sort(out)
	return slices.Compact(out)
}

func inlineString(s string) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: s}}
}
