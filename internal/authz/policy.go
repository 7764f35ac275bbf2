package authz

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	security "istio.io/api/security/v1beta1"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Names Istio gives RBAC policies and filter metadata, which operators'
// dashboards and istioctl read.
const (
	// ExtAuthzPrefix starts the names of CUSTOM policies: the HTTP RBAC
	// filter records the matched name in its shadow metadata, and the
	// ext_authz filter runs only when that name starts with the prefix
	// and its provider's name.
	ExtAuthzPrefix = "istio-ext-authz"
	// ExtAuthzShadowPrefix is the shadow stat prefix of the RBAC filter in
	// front of ext_authz; the metadata key it sets is this prefix +
	// "shadow_effective_policy_id".
	ExtAuthzShadowPrefix = "istio_ext_authz_"
	// ShadowEffectivePolicyID is the suffix of that metadata key.
	ShadowEffectivePolicyID = "shadow_effective_policy_id"
	// ShadowEngineResult is the suffix of the metadata key of a shadow
	// engine's decision ("allowed" or "denied").
	ShadowEngineResult = "shadow_engine_result"
	// DryRunAllowPrefix and DryRunDenyPrefix are the shadow stat prefixes
	// of dry-run ALLOW and DENY policies.
	DryRunAllowPrefix = "istio_dry_run_allow_"
	DryRunDenyPrefix  = "istio_dry_run_deny_"
	badCustomSuffix   = "-deny-due-to-bad-CUSTOM-action"
)

// Rules are the RBAC of one action: enforced, and dry-run (shadow). Either
// may be nil.
type Rules struct {
	Enforce, Shadow *rbacv3.RBAC
}

// Custom are the rules of the CUSTOM policies naming one provider.
type Custom struct {
	Provider string
	Rules
}

// Set is the RBAC of one workload for one target, by action, in the order
// Istio's filters apply them: CUSTOM first, then AUDIT, DENY, ALLOW. An
// action without policies is left zero.
type Set struct {
	// Custom is by provider name.
	Custom             []Custom
	Audit, Deny, Allow Rules
	// Problems are the rules left out, and why.
	Problems []string
}

// Build translates the AuthorizationPolicies that apply to a workload, as
// Istio's authz builder: one RBAC policy per rule, named
// "ns[<namespace>]-policy[<name>]-rule[<index>]" (CUSTOM ones prefixed
// "istio-ext-authz-<provider>-"); a policy without rules is a policy that
// matches nothing (an ALLOW without rules allows nothing; as the filter
// then exists, everything else is denied); dry-run policies go into the
// shadow rules.
func Build(policies []*model.AuthorizationPolicy, o Options) Set {
	var s Set
	byProvider := map[string]*Custom{}
	for _, ap := range policies {
		var r *Rules
		var action rbacv3.RBAC_Action
		namePrefix := ""
		switch ap.Spec.GetAction() {
		case security.AuthorizationPolicy_ALLOW:
			r, action = &s.Allow, rbacv3.RBAC_ALLOW
		case security.AuthorizationPolicy_DENY:
			r, action = &s.Deny, rbacv3.RBAC_DENY
		case security.AuthorizationPolicy_AUDIT:
			r, action = &s.Audit, rbacv3.RBAC_LOG
		case security.AuthorizationPolicy_CUSTOM:
			p := ap.Spec.GetProvider().GetName()
			c := byProvider[p]
			if c == nil {
				c = &Custom{Provider: p}
				byProvider[p] = c
			}
			// The RBAC in front of ext_authz matches (in shadow mode)
			// the requests to send to the provider: a DENY.
			r, action, namePrefix = &c.Rules, rbacv3.RBAC_DENY, ExtAuthzPrefix+"-"+p+"-"
		default:
			s.Problems = append(s.Problems, fmt.Sprintf("AuthorizationPolicy %s/%s: action %s is not supported; policy ignored", ap.Namespace, ap.Name, ap.Spec.GetAction()))
			continue
		}
		rbac := &r.Enforce
		if ap.DryRun {
			rbac = &r.Shadow
		}
		if *rbac == nil {
			*rbac = &rbacv3.RBAC{Action: action, Policies: map[string]*rbacv3.Policy{}}
		}
		if len(ap.Spec.GetRules()) == 0 {
			(*rbac).Policies[namePrefix+PolicyName(ap.Namespace, ap.Name, 0)] = matchNever()
			continue
		}
		for i, rule := range ap.Spec.GetRules() {
			name := namePrefix + PolicyName(ap.Namespace, ap.Name, i)
			p, err := Rule(ap.Namespace, rule, action, o)
			if err != nil {
				// An ALLOW rule with request attributes is left out of TCP
				// chains by design, as in Istio; anything else is news.
				if !errors.Is(err, errHTTPOnly) {
					s.Problems = append(s.Problems, fmt.Sprintf("AuthorizationPolicy %s/%s: rule %d left out: %v", ap.Namespace, ap.Name, i, err))
				}
				continue
			}
			(*rbac).Policies[name] = p
		}
	}
	for _, c := range byProvider {
		s.Custom = append(s.Custom, *c)
	}
	slices.SortFunc(s.Custom, func(a, b Custom) int { return cmp.Compare(a.Provider, b.Provider) })
	return s
}

// PolicyName is the RBAC policy name Istio gives a rule.
func PolicyName(namespace, name string, rule int) string {
	return fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", namespace, name, rule)
}

// DenyInstead turns the rules of a CUSTOM provider that cannot be used
// (unknown, invalid, or unavailable on the target) into DENY rules, so
// the requests the policy would send to the provider are denied, never
// let through (Istio's getBadCustomDenyRules).
func DenyInstead(c Custom) *rbacv3.RBAC {
	out := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{}}
	if c.Enforce != nil {
		for name, p := range c.Enforce.GetPolicies() {
			out.Policies[name+badCustomSuffix] = p
		}
	}
	return out
}

// matchNever is the policy of a rule-less policy: no permission and no
// principal ever match.
func matchNever() *rbacv3.Policy {
	return &rbacv3.Policy{
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_NotRule{NotRule: &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}}}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_NotId{NotId: &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}}}}},
	}
}
