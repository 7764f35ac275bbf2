// Package gatewayapitest builds inputs for the Gateway API's conversion
// in tests and benchmarks: a cluster held in memory, and a large set of
// Gateways and HTTPRoutes.
package gatewayapitest

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
)

// Cluster is a cluster held in memory (gatewayapi.StaticCluster).
type Cluster = gatewayapi.StaticCluster

// NewCluster returns an empty cluster of domain.
func NewCluster(domain string) *Cluster { return gatewayapi.NewStaticCluster(domain) }

// Input returns an input served by Flotilla's and Istio's controllers,
// with the classes flotilla and istio, over c.
func Input(c *Cluster) gatewayapi.Input {
	return gatewayapi.Input{
		Controllers:    []gw.GatewayController{gatewayapi.DefaultController, gatewayapi.IstioController},
		DefaultClasses: map[string]gw.GatewayController{gatewayapi.DefaultClass: gatewayapi.DefaultController, gatewayapi.IstioClass: gatewayapi.IstioController},
		DomainSuffix:   c.Domain, Cluster: c,
	}
}

// Routes returns an input of n HTTPRoutes spread over gateways Gateways
// of namespace "edge" (class flotilla, one HTTP listener on port 80 open
// to every namespace; Service "gw-<i>-flotilla" ready on it), each route
// in one of 10 namespaces with its own host, a prefix and an exact path
// match, a header filter, and a 90/10 split between its two Services
// "svc-<i>-v1" and "svc-<i>-v2" (port 80), all in the cluster.
func Routes(n, gateways int) gatewayapi.Input {
	c := NewCluster("cluster.local")
	in := Input(c)
	all := gw.NamespacesFromAll
	for g := range gateways {
		name := fmt.Sprintf("gw-%d", g)
		in.Gateways = append(in.Gateways, &gw.Gateway{
			ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: name, Generation: 1},
			Spec: gw.GatewaySpec{GatewayClassName: gw.ObjectName(gatewayapi.DefaultClass), Listeners: []gw.Listener{{
				Name: "http", Port: 80, Protocol: gw.HTTPProtocolType,
				AllowedRoutes: &gw.AllowedRoutes{Namespaces: &gw.RouteNamespaces{From: &all}},
			}}},
		})
		c.Services["edge/"+name+"-flotilla"] = &gatewayapi.Service{Ports: []int32{80}, ReadyPorts: map[int32]bool{80: true}, ClusterIPs: []string{"10.0.0.1"}}
	}
	port := gw.PortNumber(80)
	w90, w10 := int32(90), int32(10)
	prefix, exact := gw.PathMatchPathPrefix, gw.PathMatchExact
	api, login := "/api", "/login"
	edge := gw.Namespace("edge")
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i%10)
		c.NamespaceSet[ns] = map[string]string{}
		for _, v := range []string{"v1", "v2"} {
			c.Services[fmt.Sprintf("%s/svc-%d-%s", ns, i, v)] = &gatewayapi.Service{Ports: []int32{80}}
		}
		backend := func(v string, w *int32) gw.HTTPBackendRef {
			return gw.HTTPBackendRef{BackendRef: gw.BackendRef{
				BackendObjectReference: gw.BackendObjectReference{Name: gw.ObjectName(fmt.Sprintf("svc-%d-%s", i, v)), Port: &port}, Weight: w,
			}}
		}
		in.HTTPRoutes = append(in.HTTPRoutes, &gw.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("route-%d", i), Generation: 1},
			Spec: gw.HTTPRouteSpec{
				CommonRouteSpec: gw.CommonRouteSpec{ParentRefs: []gw.ParentReference{{Name: gw.ObjectName(fmt.Sprintf("gw-%d", i%gateways)), Namespace: &edge}}},
				Hostnames:       []gw.Hostname{gw.Hostname(fmt.Sprintf("host-%d.example.com", i))},
				Rules: []gw.HTTPRouteRule{{
					Matches: []gw.HTTPRouteMatch{{Path: &gw.HTTPPathMatch{Type: &prefix, Value: &api}}, {Path: &gw.HTTPPathMatch{Type: &exact, Value: &login}}},
					Filters: []gw.HTTPRouteFilter{{Type: gw.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gw.HTTPHeaderFilter{
						Set: []gw.HTTPHeader{{Name: "x-route", Value: "r"}},
					}}},
					BackendRefs: []gw.HTTPBackendRef{backend("v1", &w90), backend("v2", &w10)},
				}},
			},
		})
	}
	return in
}
