// Package istio is Flotilla's view of the Istio configuration kinds it
// serves: which kinds exist (group, versions, plural, type URL, the
// istio.io/api message of their spec), the object model galley and discovery
// share (metadata plus spec), and decoding from YAML with file and line
// positions. It imports no Kubernetes client and no gRPC.
package istio

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	networkingv1beta1 "istio.io/api/networking/v1beta1"
	security "istio.io/api/security/v1beta1"
	telemetry "istio.io/api/telemetry/v1alpha1"
)

// The kinds' names, for code that treats one kind apart (the table in
// Kinds holds everything else about them).
const (
	DestinationRule       = "DestinationRule"
	EnvoyFilter           = "EnvoyFilter"
	Gateway               = "Gateway"
	ServiceEntry          = "ServiceEntry"
	Sidecar               = "Sidecar"
	VirtualService        = "VirtualService"
	WorkloadEntry         = "WorkloadEntry"
	WorkloadGroup         = "WorkloadGroup"
	AuthorizationPolicy   = "AuthorizationPolicy"
	PeerAuthentication    = "PeerAuthentication"
	ProxyConfig           = "ProxyConfig"
	RequestAuthentication = "RequestAuthentication"
	Telemetry             = "Telemetry"
	TrafficExtension      = "TrafficExtension"
	WasmPlugin            = "WasmPlugin"
)

// Kind is one Istio configuration kind.
type Kind struct {
	// Group is the API group, e.g. "networking.istio.io".
	Group string
	// Kind is the kind name, e.g. "VirtualService".
	Kind string
	// Plural is the resource name, e.g. "virtualservices".
	Plural string
	// Versions lists every served version, the storage (preferred) one first.
	// Istio serves the same schema under all of them.
	Versions []string
	// ShortNames are kubectl's short names.
	ShortNames []string

	newSpec func() proto.Message
}

// Version is the preferred version.
func (k Kind) Version() string { return k.Versions[0] }

// APIVersion is "group/version" for the preferred version.
func (k Kind) APIVersion() string { return k.Group + "/" + k.Version() }

// TypeURL names the kind's MCP collection, Istio's convention:
// "networking.istio.io/v1/VirtualService".
func (k Kind) TypeURL() string { return k.Group + "/" + k.Version() + "/" + k.Kind }

// NewSpec returns an empty spec message.
func (k Kind) NewSpec() proto.Message { return k.newSpec() }

// String returns the kind name.
func (k Kind) String() string { return k.Kind }

// Serves reports whether apiVersion ("group/version") is one of the kind's.
func (k Kind) Serves(apiVersion string) bool {
	for _, v := range k.Versions {
		if k.Group+"/"+v == apiVersion {
			return true
		}
	}
	return false
}

// Kinds returns every kind Flotilla serves, sorted by group and kind.
func Kinds() []Kind {
	netVersions := []string{"v1", "v1beta1", "v1alpha3"}
	secVersions := []string{"v1", "v1beta1"}
	ks := []Kind{
		{
			// Istio 1.32's extension API: Wasm and Lua filters. It
			// serves a WasmPlugin as a TrafficExtension.
			Group: "extensions.istio.io", Kind: TrafficExtension, Plural: "trafficextensions", Versions: []string{"v1alpha1"},
			newSpec: func() proto.Message { return &extensions.TrafficExtension{} },
		},
		{
			Group: "extensions.istio.io", Kind: WasmPlugin, Plural: "wasmplugins", Versions: []string{"v1alpha1"},
			newSpec: func() proto.Message { return &extensions.WasmPlugin{} },
		},
		{
			Group: "networking.istio.io", Kind: DestinationRule, Plural: "destinationrules", Versions: netVersions, ShortNames: []string{"dr"},
			newSpec: func() proto.Message { return &networking.DestinationRule{} },
		},
		{
			// Istio serves EnvoyFilter as v1alpha3 only.
			Group: "networking.istio.io", Kind: EnvoyFilter, Plural: "envoyfilters", Versions: []string{"v1alpha3"},
			newSpec: func() proto.Message { return &networking.EnvoyFilter{} },
		},
		{
			Group: "networking.istio.io", Kind: Gateway, Plural: "gateways", Versions: netVersions, ShortNames: []string{"gw"},
			newSpec: func() proto.Message { return &networking.Gateway{} },
		},
		{
			// Istio serves ProxyConfig as v1beta1 alone; the injector
			// reads it.
			Group: "networking.istio.io", Kind: ProxyConfig, Plural: "proxyconfigs", Versions: []string{"v1beta1"},
			newSpec: func() proto.Message { return &networkingv1beta1.ProxyConfig{} },
		},
		{
			Group: "networking.istio.io", Kind: ServiceEntry, Plural: "serviceentries", Versions: netVersions, ShortNames: []string{"se"},
			newSpec: func() proto.Message { return &networking.ServiceEntry{} },
		},
		{
			Group: "networking.istio.io", Kind: Sidecar, Plural: "sidecars", Versions: netVersions,
			newSpec: func() proto.Message { return &networking.Sidecar{} },
		},
		{
			Group: "networking.istio.io", Kind: VirtualService, Plural: "virtualservices", Versions: netVersions, ShortNames: []string{"vs"},
			newSpec: func() proto.Message { return &networking.VirtualService{} },
		},
		{
			Group: "networking.istio.io", Kind: WorkloadEntry, Plural: "workloadentries", Versions: netVersions, ShortNames: []string{"we"},
			newSpec: func() proto.Message { return &networking.WorkloadEntry{} },
		},
		{
			Group: "networking.istio.io", Kind: WorkloadGroup, Plural: "workloadgroups", Versions: netVersions, ShortNames: []string{"wg"},
			newSpec: func() proto.Message { return &networking.WorkloadGroup{} },
		},
		{
			Group: "security.istio.io", Kind: AuthorizationPolicy, Plural: "authorizationpolicies", Versions: secVersions, ShortNames: []string{"ap"},
			newSpec: func() proto.Message { return &security.AuthorizationPolicy{} },
		},
		{
			Group: "security.istio.io", Kind: PeerAuthentication, Plural: "peerauthentications", Versions: secVersions, ShortNames: []string{"pa"},
			newSpec: func() proto.Message { return &security.PeerAuthentication{} },
		},
		{
			Group: "security.istio.io", Kind: RequestAuthentication, Plural: "requestauthentications", Versions: secVersions, ShortNames: []string{"ra"},
			newSpec: func() proto.Message { return &security.RequestAuthentication{} },
		},
		{
			// v1 and v1alpha1 share the v1alpha1 message (istio.io/api's
			// telemetry/v1 aliases it).
			Group: "telemetry.istio.io", Kind: Telemetry, Plural: "telemetries", Versions: []string{"v1", "v1alpha1"}, ShortNames: []string{"telemetry"},
			newSpec: func() proto.Message { return &telemetry.Telemetry{} },
		},
	}
	return ks
}

// ByAPIVersion finds a kind by apiVersion ("group/version", any served
// version) and kind name.
func ByAPIVersion(apiVersion, kind string) (Kind, error) {
	for _, k := range Kinds() {
		if k.Kind == kind {
			if k.Serves(apiVersion) {
				return k, nil
			}
			return Kind{}, fmt.Errorf("%s is not served as %s (served: %s)", kind, apiVersion, servedList(k))
		}
	}
	return Kind{}, fmt.Errorf("unsupported kind %s %s", apiVersion, kind)
}

// ByName finds a kind by its name ("VirtualService").
func ByName(kind string) (Kind, bool) {
	i := slices.IndexFunc(Kinds(), func(k Kind) bool { return k.Kind == kind })
	if i < 0 {
		return Kind{}, false
	}
	return Kinds()[i], true
}

// ByKubectlName finds a kind by a name kubectl takes for it: the kind
// in any case, its plural or singular resource name, or a short name
// ("vs", "destinationrules", "virtual-service" as istioctl takes it).
func ByKubectlName(name string) (Kind, bool) {
	n := strings.ToLower(strings.ReplaceAll(name, "-", ""))
	i := slices.IndexFunc(Kinds(), func(k Kind) bool {
		return n == strings.ToLower(k.Kind) || n == k.Plural || slices.Contains(k.ShortNames, n)
	})
	if i < 0 {
		return Kind{}, false
	}
	return Kinds()[i], true
}

// ByTypeURL finds a kind by its MCP type URL.
func ByTypeURL(typeURL string) (Kind, bool) {
	i := slices.IndexFunc(Kinds(), func(k Kind) bool { return k.TypeURL() == typeURL })
	if i < 0 {
		return Kind{}, false
	}
	return Kinds()[i], true
}

func servedList(k Kind) string {
	s := ""
	for i, v := range k.Versions {
		if i > 0 {
			s += ", "
		}
		s += k.Group + "/" + v
	}
	return s
}
