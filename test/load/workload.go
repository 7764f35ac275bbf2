package load

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
)

// The sidecar mode's mesh: n services in namespace "load", each a
// ServiceEntry (MESH_INTERNAL, STATIC, two HTTP ports, three endpoints:
// v1, v1, v2) with a VirtualService splitting 90/10 between its subsets
// and a DestinationRule naming them. Sidecars run in ten namespaces; the
// first 3n run at the services' endpoint addresses (in "load", with the
// endpoint's labels), so they have inbound listeners and clusters; the
// others are clients only.

// ClientNamespaces is how many namespaces the other sidecars spread over.
const ClientNamespaces = 10

// sidecarServices is the ServiceEntries; endpointEpoch moves the third
// endpoint of svc-0 (the endpoint change).
func sidecarServices(n, endpointEpoch int) string {
	var b strings.Builder
	for i := range n {
		third := fmt.Sprintf("10.%d.%d.3", 1+i/256, i%256)
		if i == 0 && endpointEpoch%2 == 1 {
			third = "10.250.0.3"
		}
		fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-%[1]d, namespace: load}
spec:
  hosts: [svc-%[1]d.load.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 80, name: http, protocol: HTTP}
  - {number: 8080, name: http-admin, protocol: HTTP}
  endpoints:
  - {address: 10.%[2]d.%[3]d.1, labels: {app: svc-%[1]d, version: v1}}
  - {address: 10.%[2]d.%[3]d.2, labels: {app: svc-%[1]d, version: v1}}
  - {address: %[4]s, labels: {app: svc-%[1]d, version: v2}}
---
`, i, 1+i/256, i%256, third)
	}
	return b.String()
}

// sidecarRouting is each service's VirtualService and DestinationRule;
// svc-0's VirtualService sends v2Weight percent to v2 (the route change),
// the others 10. With scoped, every client namespace has a Sidecar that
// limits what it sees to its own namespace and ten of the services.
func sidecarRouting(n, v2Weight int, scoped bool) string {
	var b strings.Builder
	for i := range n {
		w := 10
		if i == 0 {
			w = v2Weight
		}
		b.WriteString(versionSplit(i, w))
		b.WriteString(versionSubsets(i))
	}
	if scoped {
		for ns := range ClientNamespaces {
			var hosts []string
			for _, svc := range scopedServices(ns, n) {
				hosts = append(hosts, fmt.Sprintf("load/svc-%d.load.svc.cluster.local", svc))
			}
			fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: ns-%d}
spec:
  egress:
  - hosts: ["./*", "%s"]
---
`, ns, strings.Join(hosts, `", "`))
		}
	}
	return b.String()
}

// scopedServices are the services the Sidecar of client namespace ns
// lets its proxies see.
func scopedServices(ns, n int) []int {
	var out []int
	for k := range 10 {
		out = append(out, (ns*10+k)%n)
	}
	return out
}

// sidecarSees reports whether sidecar client i sees service svc: every
// sidecar does, unless scoped and in a client namespace whose Sidecar
// leaves it out.
func sidecarSees(i, n, svc int, scoped bool) bool {
	if !scoped || i/3 < n {
		return true // in "load", which has no Sidecar
	}
	return slices.Contains(scopedServices(i%ClientNamespaces, n), svc)
}

// SidecarNode is who sidecar client i is, in a mesh of n services.
func SidecarNode(i, n int) bootstrap.Node {
	node := bootstrap.Node{
		Type: "sidecar", DomainSuffix: "cluster.local", ClusterID: "Kubernetes", IstioVersion: "1.28.0",
		PodName: fmt.Sprintf("load-%d", i),
	}
	if svc := i / 3; svc < n {
		node.IP = fmt.Sprintf("10.%d.%d.%d", 1+svc/256, svc%256, 1+i%3)
		version := "v1"
		if i%3 == 2 {
			version = "v2"
		}
		node.Namespace = "load"
		node.ServiceAccount = fmt.Sprintf("svc-%d", svc)
		node.Labels = map[string]string{"app": fmt.Sprintf("svc-%d", svc), "version": version}
		return node
	}
	node.IP = fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)
	node.Namespace = fmt.Sprintf("ns-%d", i%ClientNamespaces)
	node.ServiceAccount = "client"
	node.Labels = map[string]string{"app": "client"}
	return node
}
