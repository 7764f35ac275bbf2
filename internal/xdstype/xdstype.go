// Package xdstype is the All() of the xDS types Flotilla serves: each
// type's URL, the names it goes by (its discovery service's initials, its
// section of a config dump) and the orders it is listed in. Whatever
// lists the types (translation, the server, its metrics and debug
// answers, the CLI) takes them from here.
package xdstype

import (
	"cmp"
	"slices"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Type is one xDS type served.
type Type struct {
	// URL is its type URL (resourcev3.ClusterType, …).
	URL string
	// Short is its discovery service's initials, as istioctl
	// proxy-status, the metrics and the traces name it: "CDS".
	Short string
	// Section names its section of a config dump: "Clusters".
	Section string
	// Optional: a proxy asks for it only when something it got names
	// it (secrets, extension configurations); proxy-status shows its
	// column only when some proxy watches it.
	Optional bool
	// Wildcard: a proxy asks for all of its resources, never by name
	// (Envoy's clusters and listeners, the name table).
	Wildcard bool
	// AgentOnly: the proxy's agent reads it, Envoy never sees it (the
	// name table): no proxy-status column, no config dump section.
	AgentOnly bool

	// column is its place among istioctl proxy-status's columns.
	column int
}

// All returns every type served, in the order a push sends them, so that
// what a resource names exists before it (clusters before their
// endpoints, listeners before their routes, as Envoy's ADS ordering
// asks).
func All() []Type {
	return []Type{
		{URL: resourcev3.ClusterType, Short: "CDS", Section: "Clusters", Wildcard: true, column: 0},
		{URL: resourcev3.EndpointType, Short: "EDS", Section: "Endpoints", column: 2},
		{URL: resourcev3.ListenerType, Short: "LDS", Section: "Listeners", Wildcard: true, column: 1},
		{URL: resourcev3.RouteType, Short: "RDS", Section: "Routes", column: 3},
		{URL: resourcev3.SecretType, Short: "SDS", Section: "Secrets", Optional: true, column: 5},
		// Extension configurations (WasmPlugin, TrafficExtension, and
		// EnvoyFilter's EXTENSION_CONFIG): a listener names them, and
		// waits for them.
		{URL: resourcev3.ExtensionConfigType, Short: "ECDS", Section: "ExtensionConfigs", Optional: true, column: 4},
		// The name table (Istio's NDS): an agent that answers its
		// workload's DNS asks for it, as a whole.
		{URL: NameTableType, Short: "NDS", Section: "NameTable", Optional: true, Wildcard: true, AgentOnly: true},
	}
}

// NameTableType is the type URL of the name table (Istio's
// istio.networking.nds.v1.NameTable).
const NameTableType = "type.googleapis.com/istio.networking.nds.v1.NameTable"

// HealthInfoType is the type URL of the requests Istio's agent reports
// its workload's readiness probe in (Istio's model.HealthInfoType): not a
// type served, a report, healthy unless the request has an ErrorDetail.
const HealthInfoType = "type.googleapis.com/istio.v1.HealthInformation"

// URLs returns every type's URL, in the order a push sends them.
func URLs() []string {
	all := All()
	out := make([]string, len(all))
	for i, t := range all {
		out[i] = t.URL
	}
	return out
}

// InStatusOrder returns every type Envoy reads in the order of istioctl
// proxy-status's columns (CDS, LDS, EDS, RDS, ECDS), then SDS: the
// sections of a config dump too.
func InStatusOrder() []Type {
	envoy := slices.DeleteFunc(All(), func(t Type) bool { return t.AgentOnly })
	return slices.SortedFunc(slices.Values(envoy), func(a, b Type) int { return cmp.Compare(a.column, b.column) })
}

// Of returns the type of a URL, and whether it is served.
func Of(url string) (Type, bool) {
	for _, t := range All() {
		if t.URL == url {
			return t, true
		}
	}
	return Type{}, false
}

// Short is the initials of a URL's type ("CDS"); the URL itself for a
// type not served.
func Short(url string) string {
	if t, ok := Of(url); ok {
		return t.Short
	}
	return url
}

// Section is the config dump section of a URL's type ("Clusters"); the
// URL itself for a type not served.
func Section(url string) string {
	if t, ok := Of(url); ok {
		return t.Section
	}
	return url
}
