package translate

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// routesMesh: reviews has a VirtualService whose entries apply to some
// proxies and ports only; ratings has none. The first proxy is a v1
// sidecar in default, the second one in another namespace.
const routesMesh = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: services, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local, ratings.default.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}, {number: 8080, name: http-alt, protocol: HTTP}]
  endpoints: [{address: 10.0.0.1, labels: {version: v1}}, {address: 10.0.0.2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - name: alt-port-only
    match: [{port: 8080}]
    route: [{destination: {host: reviews, subset: v2}}]
  - name: from-v1
    match: [{sourceLabels: {version: v1}, uri: {prefix: /v1}}]
    route: [{destination: {host: reviews, subset: v1}}]
  - name: from-other-namespace
    match: [{sourceNamespace: other, headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{uri: {exact: /split}}, {uri: {prefix: /}}]
    route:
    - {destination: {host: reviews, subset: v1}, weight: 75}
    - {destination: {host: reviews, subset: v2}, weight: 25}
  - name: never-reached
    route: [{destination: {host: reviews, subset: v2}}]
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~10.1.0.1~productpage-1.default~default.svc.cluster.local, labels: {version: v1}}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec: {id: sidecar~10.1.0.2~client-1.other~other.svc.cluster.local}
`

// routeSummary is a route's name, match and where it sends: enough to
// read a table of cases.
func routeSummary(r *routev3.Route) string {
	m := r.GetMatch()
	match := m.GetPrefix()
	if p := m.GetPath(); p != "" {
		match = "=" + p
	}
	for _, h := range m.GetHeaders() {
		match += " " + h.GetName()
	}
	to := r.GetRoute().GetCluster()
	for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
		to += " " + wc.GetName() + "@" + wc.GetWeight().String()
	}
	return r.GetName() + " " + match + " → " + strings.TrimSpace(to)
}

func TestHTTPRoutesFollowTheVirtualServiceForThisProxyAndPort(t *testing.T) {
	gens := generators(t, routesMesh)
	const reviews, ratings = "reviews.default.svc.cluster.local", "ratings.default.svc.cluster.local"
	for _, tc := range []struct {
		name  string
		proxy int
		host  string
		port  uint32
		want  []string
	}{
		{
			name: "a v1 sidecar on port 80: its sourceLabels route, then the split; nothing after the catch-all", proxy: 0, host: reviews, port: 80,
			want: []string{
				"from-v1 /v1 → outbound|80|v1|" + reviews,
				"default/reviews#3 =/split → outbound|80|v1|" + reviews + "@value:75 outbound|80|v2|" + reviews + "@value:25",
				"default/reviews#3 / → outbound|80|v1|" + reviews + "@value:75 outbound|80|v2|" + reviews + "@value:25",
			},
		},
		{
			name: "the same sidecar on port 8080: the port's own route first, which catches all", proxy: 0, host: reviews, port: 8080,
			want: []string{"alt-port-only / → outbound|8080|v2|" + reviews},
		},
		{
			name: "a sidecar in another namespace: its sourceNamespace route, not the v1 one", proxy: 1, host: reviews, port: 80,
			want: []string{
				"from-other-namespace / end-user → outbound|80|v2|" + reviews,
				"default/reviews#3 =/split → outbound|80|v1|" + reviews + "@value:75 outbound|80|v2|" + reviews + "@value:25",
				"default/reviews#3 / → outbound|80|v1|" + reviews + "@value:75 outbound|80|v2|" + reviews + "@value:25",
			},
		},
		{
			name: "no VirtualService: the default route to the service", proxy: 0, host: ratings, port: 80,
			want: []string{"default / → outbound|80||" + ratings},
		},
		{name: "a port the service does not have", proxy: 0, host: ratings, port: 9999},
		{name: "a host the proxy does not see", proxy: 0, host: "nowhere.example.com", port: 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range gens[tc.proxy].HTTPRoutes(tc.host, tc.port) {
				got = append(got, routeSummary(r))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("routes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}
