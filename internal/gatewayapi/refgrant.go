package gatewayapi

import (
	gw "sigs.k8s.io/gateway-api/apis/v1"
)

// grants are the ReferenceGrants, indexed as Istio's ReferenceGrants:
// from (kind, namespace) to (kind, namespace), each allowing one name or
// all.
type grants map[grantPair][]grantTo

type grantEnd struct{ kind, namespace string }

type grantPair struct{ from, to grantEnd }

type grantTo struct {
	all  bool
	name string
}

// The kinds a grant may allow references from and to (Istio's
// ReferenceGrantsCollection); others are ignored.
var (
	grantFromKinds = map[string]bool{KindGateway: true, KindHTTPRoute: true, KindGRPCRoute: true, KindTLSRoute: true, KindTCPRoute: true, KindListenerSet: true}
	grantToKinds   = map[string]bool{"Secret": true, "ConfigMap": true, "Service": true}
)

func newGrants(rgs []*gw.ReferenceGrant) grants {
	out := grants{}
	for _, rg := range rgs {
		for _, from := range rg.Spec.From {
			if !grantFromKinds[string(from.Kind)] || string(from.Group) != Group {
				continue
			}
			for _, to := range rg.Spec.To {
				if !grantToKinds[string(to.Kind)] || string(to.Group) != "" {
					continue
				}
				p := grantPair{from: grantEnd{string(from.Kind), string(from.Namespace)}, to: grantEnd{string(to.Kind), rg.Namespace}}
				g := grantTo{all: to.Name == nil}
				if to.Name != nil {
					g.name = string(*to.Name)
				}
				out[p] = append(out[p], g)
			}
		}
	}
	return out
}

// allowed reports whether an object of fromKind in fromNS may refer to
// the object toKind toNS/name (Istio's SecretAllowed and BackendAllowed).
func (g grants) allowed(fromKind, fromNS, toKind, toNS, name string) bool {
	for _, t := range g[grantPair{from: grantEnd{fromKind, fromNS}, to: grantEnd{toKind, toNS}}] {
		if t.all || t.name == name {
			return true
		}
	}
	return false
}
