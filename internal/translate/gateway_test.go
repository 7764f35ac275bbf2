package translate

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
)

// The gateway's HTTP connection managers are encoded from two parts
// (gatewayHCMFilter); each must be byte for byte the deterministic
// encoding of the whole message gatewayHCM builds, so that versions and
// hashes of the listener are what a plain marshal would give.
func TestGatewayHTTPConnectionManagersEncodeAsTheWholeMessage(t *testing.T) {
	input, err := os.ReadFile("testdata/gateway-servers/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, x := range generators(t, string(input)) {
		if _, ok := x.g.fl.(router); !ok {
			continue
		}
		for _, l := range x.Listeners(nil) {
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					if f.GetName() != hcmFilter {
						continue
					}
					got := &hcmv3.HttpConnectionManager{}
					if err := f.GetTypedConfig().UnmarshalTo(got); err != nil {
						t.Fatalf("%s %s: %v", l.GetName(), fc.GetName(), err)
					}
					want := x.g.gatewayHCM(got.GetStatPrefix(), got.GetRds().GetRouteConfigName(), l.GetAddress().GetSocketAddress().GetPortValue())
					if !proto.Equal(got, want) {
						t.Errorf("%s %s: the connection manager is not gatewayHCM's:\n got %v\nwant %v", l.GetName(), fc.GetName(), got, want)
					}
					raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(f.GetTypedConfig().GetValue(), raw) {
						t.Errorf("%s %s: the encoding differs from the whole message's deterministic encoding", l.GetName(), fc.GetName())
					}
					n++
				}
			}
		}
	}
	if n < 5 {
		t.Fatalf("checked %d gateway connection managers; the case has at least 5", n)
	}
}

// gatewaysForLabels has a Gateway for proxies labelled app=edge, x=y, a
// proxy whose one label reads the same when written out naively
// ("app=edge,x=y"), and a service that gives 10.92.0.2 a target port for
// the Gateway's port.
const gatewaysForLabels = `
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: edge, namespace: edge}
spec:
  selector: {app: edge, x: "y"}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: edge, namespace: edge}
spec:
  hosts: [edge.edge.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.92.0.2, ports: {http: 8080}}]
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec:
  id: router~10.92.0.9~hostile-1.edge~edge.svc.cluster.local
  labels: {app: 'edge,x=y'}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec:
  id: router~10.92.0.1~edge-1.edge~edge.svc.cluster.local
  labels: {app: edge, x: "y"}
---
apiVersion: test.flotilla.io/v1
kind: Proxy
spec:
  id: router~10.92.0.2~edge-2.edge~edge.svc.cluster.local
  labels: {app: edge, x: "y"}
`

// Gateway proxies alike share the merge of their Gateways within a push
// context; a proxy whose labels differ (even made to look alike when
// written out) or whose ports listen elsewhere gets its own.
func TestGatewayProxiesShareTheirGatewaysOnlyWhenAlike(t *testing.T) {
	gens := generators(t, gatewaysForLabels)
	var got []string
	for _, x := range gens { // in order: the look-alike proxy first
		var names []string
		for _, l := range x.Listeners(nil) {
			for _, fc := range l.GetFilterChains() {
				names = append(names, l.GetName()+" "+fc.GetName())
			}
		}
		got = append(got, strings.Join(names, ","))
	}
	want := []string{"", "0.0.0.0_80 http.80", "0.0.0.0_8080 http.8080"}
	if !slices.Equal(got, want) {
		t.Errorf("listeners per proxy: %q, want %q", got, want)
	}
}

// collapseRoutes groups hosts by their exact route lists and TLS
// requirement, whatever the order they come in; the most specific host
// (longer first, then alphabetical, wildcards last) names each group.
func TestCollapsedVirtualHostsHaveTheSameRoutesAndTLS(t *testing.T) {
	a, b, c := &routev3.Route{Name: "a"}, &routev3.Route{Name: "b"}, &routev3.Route{Name: "c"}
	vhosts := []gwVHost{
		{host: "one.example.com", port: 80, routes: []*routev3.Route{a, b}},
		{host: "two.example.com", port: 80, routes: []*routev3.Route{a, c}},   // same first route, differs after
		{host: "three.example.com", port: 80, routes: []*routev3.Route{a, b}}, // one's group
		{host: "four.example.com", port: 80, routes: []*routev3.Route{a, c}},  // two's group
		{host: "five.example.com", port: 80, routes: []*routev3.Route{a, b}, requireTLS: true},
		{host: "*.example.com", port: 80, routes: []*routev3.Route{a, b}},
		{host: "six.example.com", port: 80},
		{host: "seven.example.com", port: 80},
		{host: "redirect.example.com", port: 80, requireTLS: true},
	}
	var got []string
	for _, vh := range collapseRoutes(vhosts) {
		got = append(got, vh.GetName()+" "+strings.Join(vh.GetDomains(), ","))
	}
	want := []string{
		"redirect.example.com:80 redirect.example.com",
		"seven.example.com:80 seven.example.com,six.example.com",
		"three.example.com:80 three.example.com,one.example.com,*.example.com",
		"five.example.com:80 five.example.com",
		"four.example.com:80 four.example.com,two.example.com",
	}
	if !slices.Equal(got, want) {
		t.Errorf("virtual hosts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
