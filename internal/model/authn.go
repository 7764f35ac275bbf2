package model

import (
	"errors"
	"slices"
	"strings"

	security "istio.io/api/security/v1beta1"
)

// RequestAuthentication is a RequestAuthentication resource.
type RequestAuthentication struct {
	Name, Namespace string
	Spec            *security.RequestAuthentication
}

// WorkloadRequestAuthentications returns the RequestAuthentications that
// apply to the workload with labels in namespace, selected as
// AuthorizationPolicies are (WorkloadAuthorizationPolicies): the root
// namespace's, then the namespace's, by selector or by targetRefs to a
// Gateway API gateway.
func (pc *PushContext) WorkloadRequestAuthentications(namespace string, labels map[string]string) []*RequestAuthentication {
	return workloadPolicies(pc, pc.cfg.authn, namespace, labels, func(ra *RequestAuthentication) policyTarget { return ra.Spec })
}

// JWKS is the key set fetched from a JWKS location, or why there is none.
type JWKS struct {
	// Keys is the JSON Web Key Set, as Envoy's local_jwks takes it.
	Keys string
	Err  error
}

// JWKSSource gives the key sets of remote JWKS locations (JWKSLocation)
// as last fetched; a location it has not fetched yet gets an error, and
// its fetch begins.
type JWKSSource interface {
	Lookup(locations []string) map[string]JWKS
}

// openIDConfiguration is where an issuer publishes its OpenID Provider
// metadata, whose jwks_uri names its keys.
const openIDConfiguration = "/.well-known/openid-configuration"

// JWKSLocation is where a JWT rule's keys are fetched: its jwksUri, else
// its issuer's OpenID configuration (which names the keys' URI), as
// Istio resolves rules that give neither jwksUri nor jwks. Empty for a
// rule with inline jwks.
func JWKSLocation(r *security.JWTRule) string {
	switch {
	case r.GetJwks() != "":
		return ""
	case r.GetJwksUri() != "":
		return r.GetJwksUri()
	}
	return strings.TrimSuffix(r.GetIssuer(), "/") + openIDConfiguration
}

// IsOpenIDConfiguration reports whether a JWKS location is an issuer's
// OpenID configuration rather than a key set.
func IsOpenIDConfiguration(location string) bool {
	return strings.HasSuffix(location, openIDConfiguration)
}

var errNoJWKSSource = errors.New("no JWKS fetcher in this process")

// JWKS returns the keys of a remote JWKS location as this push context
// was built with.
func (pc *PushContext) JWKS(location string) JWKS {
	if k, ok := pc.jwks[location]; ok {
		return k
	}
	return JWKS{Err: errNoJWKSSource}
}

// jwksLocations are the remote key locations every RequestAuthentication
// names, sorted.
func (ci *configIndex) jwksLocations() []string {
	var out []string
	for _, ras := range ci.authn {
		for _, ra := range ras {
			for _, r := range ra.Spec.GetJwtRules() {
				if l := JWKSLocation(r); l != "" {
					out = append(out, l)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
