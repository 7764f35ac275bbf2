// Package debugapi is the debug surface the control plane serves and the
// flotilla CLI reads, chiefly discovery's: Istio's debug types over ADS
// on discovery's xDS ports, so that reading a replica's state needs no
// other port and is authenticated the way proxies are (the caller's
// certificate on the mTLS port).
//
// A debug client opens a state-of-the-world ADS stream and sends a
// DiscoveryRequest whose type URL is one of the types below; the replica
// answers each request once. The response's ControlPlane identifier names
// the replica (Replica), so a client that asks every replica can tell the
// answers apart. The encodings are Istio's where Istio has the type
// (istioctl reads them too) and Flotilla's own, documented here, where it
// does not:
//
//   - Syncz: one envoy.service.status.v3.ClientConfig per connected proxy,
//     as istiod's syncz: one GenericXdsConfig per xDS type the proxy
//     watches with its CSDS status (SYNCED, NOT_SENT, STALE, ERROR for a
//     NACK, whose message is the error state's details) and the version
//     it acknowledged; the node's metadata carries Istio's NAMESPACE,
//     ISTIO_VERSION and CLUSTER_ID and Flotilla's fields (Metadata*).
//     Resource names, when given, narrow it to those proxy IDs, and only
//     then is what translation dropped for each (MetadataProblems) sent.
//   - ConfigDump: for the one proxy ID named, the configuration the
//     replica would send it now, as istiod's config_dump: Envoy admin
//     ConfigDump sections (clusters, endpoints, listeners, routes,
//     secrets with their private keys redacted), and a Struct whose
//     MetadataDestinationRules holds cluster name → the DestinationRule
//     ("namespace/name") it follows and, when EnvoyFilters changed some
//     resources, whose MetadataEnvoyFilters holds "kind/name" → the
//     EnvoyFilters ("namespace/name") that did.
//   - AckedConfigDump (Flotilla's): the same sections for what the proxy
//     last acknowledged, as far as the replica can tell without keeping
//     copies: a type is included when regenerating it from the push
//     context the proxy was last served reproduces the version it
//     acknowledged (its content is then exactly what the proxy holds);
//     a type it cannot reproduce is listed in the dump's last section, a
//     Struct of type URL → acknowledged version (MetadataUnknownTypes).
//   - Distribution (Flotilla's, distribution.go): for one Istio object,
//     its versions by the push that first held them, and the push each
//     proxy holds all of (flotilla wait).
//
// galley answers Subscribers (subscribers.go) on its MCP port the same
// way, and names itself in every MCP response's ControlPlane; ca names
// itself in ReplicaHeader; the agent serves its proxy's bootstrap on its
// status port (agent.go). Together they are what flotilla version and
// proxy-config bootstrap read.
//
// Authorization, as istiod's: a caller whose certificate is of the system
// namespace sees every proxy; any other caller sees only the proxies of
// its own namespace, and a proxy of another namespace is "not found".
// The plain-text port serves debug types only when discovery runs
// locally (--config-dir, loopback).
package debugapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// The debug type URLs.
const (
	// IstioPrefix starts Istio's debug types; FlotillaPrefix Flotilla's.
	IstioPrefix    = "istio.io/debug/"
	FlotillaPrefix = "flotilla.io/debug/"

	Syncz           = IstioPrefix + "syncz"
	ConfigDump      = IstioPrefix + "config_dump"
	AckedConfigDump = FlotillaPrefix + "acked_config_dump"
)

// IsDebugType reports whether a type URL asks for debug information.
func IsDebugType(typeURL string) bool {
	return strings.HasPrefix(typeURL, IstioPrefix) || strings.HasPrefix(typeURL, FlotillaPrefix)
}

// Node metadata keys of a Syncz ClientConfig. The first three are
// Istio's node metadata keys, the proxy's own (istioctl reads them); the
// others Flotilla's.
const (
	MetadataNamespace    = proxycontract.MetadataNamespace
	MetadataIstioVersion = proxycontract.MetadataIstioVersion
	MetadataClusterID    = proxycontract.MetadataClusterID
	// MetadataProxyType is proxycontract.Sidecar or Router.
	MetadataProxyType = "FLOTILLA_PROXY_TYPE"
	// MetadataIdentity is the SPIFFE ID of the proxy's verified client
	// certificate (absent on the plain-text port).
	MetadataIdentity = "FLOTILLA_IDENTITY"
	// MetadataGenerator is proxycontract.GeneratorGRPC for proxyless gRPC
	// clients.
	MetadataGenerator = "FLOTILLA_GENERATOR"
	// MetadataTelemetry is ProxySync.Telemetry.
	MetadataTelemetry = "FLOTILLA_TELEMETRY"
	// MetadataDelta is true for an incremental (delta) stream.
	MetadataDelta = "FLOTILLA_DELTA"
	// MetadataConnectedAt is when the stream opened (RFC 3339).
	MetadataConnectedAt = "FLOTILLA_CONNECTED_AT"
	// MetadataPushSeenAt is ProxySync.PushSeenAt (RFC 3339).
	MetadataPushSeenAt = "FLOTILLA_PUSH_SEEN_AT"
	// MetadataPushVersion is the version of the push context the proxy
	// was last served from.
	MetadataPushVersion = "FLOTILLA_PUSH_VERSION"
	// MetadataProblems lists what translation dropped or degraded for it.
	MetadataProblems = "FLOTILLA_PROBLEMS"
	// MetadataTypes maps each type URL to {sentVersion, resources,
	// ackedAt, nackRepeats}: the last response sent (which a STALE or
	// NACKED type has not taken), when the proxy last acknowledged one
	// (RFC 3339), and how often a NACKED response was rejected again.
	MetadataTypes = "FLOTILLA_TYPES"
	// MetadataUnknownTypes is the key of AckedConfigDump's last section.
	MetadataUnknownTypes = "FLOTILLA_UNKNOWN_TYPES"
	// MetadataEnvoyFilters is the key of ConfigDump's section of the
	// EnvoyFilters that changed resources.
	MetadataEnvoyFilters = "FLOTILLA_ENVOYFILTERS"
	// MetadataDestinationRules is the key of ConfigDump's section of the
	// DestinationRule ("namespace/name") each outbound cluster follows,
	// by cluster name.
	MetadataDestinationRules = "FLOTILLA_DESTINATIONRULES"
)

// Status is a type's sync state, as `flotilla proxy-status` prints it.
type Status string

// The states of a type.
const (
	Synced  Status = "SYNCED"   // the last response sent was acknowledged
	NotSent Status = "NOT SENT" // watched, nothing sent yet
	Stale   Status = "STALE"    // sent, not acknowledged yet
	Nacked  Status = "NACKED"   // the last response sent was rejected
)

// TypeSync is one xDS type of one proxy.
type TypeSync struct {
	TypeURL string `json:"typeUrl"`
	Status  Status `json:"status"`
	// AckedVersion is the version the proxy last acknowledged (empty:
	// none yet).
	AckedVersion string `json:"ackedVersion,omitempty"`
	// SentVersion and Resources describe the last response sent.
	SentVersion string    `json:"sentVersion,omitempty"`
	Resources   int       `json:"resources"`
	SentAt      time.Time `json:"sentAt,omitzero"`
	AckedAt     time.Time `json:"ackedAt,omitzero"`
	// Nack is the proxy's error for a NACKED type; NackRepeats counts the
	// same response rejected again since.
	Nack        string `json:"nack,omitempty"`
	NackRepeats int    `json:"nackRepeats,omitempty"`
}

// ProxySync is one connected proxy's sync state on one replica.
type ProxySync struct {
	ID           string `json:"id"`
	Namespace    string `json:"namespace"`
	ProxyType    string `json:"proxyType,omitempty"`
	IstioVersion string `json:"proxyVersion,omitempty"`
	ClusterID    string `json:"clusterId,omitempty"`
	Identity     string `json:"identity,omitempty"`
	Generator    string `json:"generator,omitempty"`
	// Telemetry says what mesh telemetry the proxy's configuration
	// carries (Istio's metrics only for Istio's build of Envoy).
	Telemetry   string    `json:"telemetry,omitempty"`
	Delta       bool      `json:"delta,omitempty"`
	ConnectedAt time.Time `json:"connectedAt,omitzero"`
	PushVersion string    `json:"pushVersion,omitempty"`
	// PushSeenAt is when the replica first saw (from galley) the change
	// behind the last push to the proxy: SentAt minus it is the
	// replica's own time for that change.
	PushSeenAt time.Time  `json:"pushSeenAt,omitzero"`
	Problems   []string   `json:"problems,omitempty"`
	Types      []TypeSync `json:"types"`
}

// ClientConfig encodes p as Syncz sends it.
func (p ProxySync) ClientConfig() *statusv3.ClientConfig {
	md := map[string]any{MetadataNamespace: p.Namespace}
	set := func(k, v string) {
		if v != "" {
			md[k] = v
		}
	}
	set(MetadataIstioVersion, p.IstioVersion)
	set(MetadataClusterID, p.ClusterID)
	set(MetadataProxyType, p.ProxyType)
	set(MetadataIdentity, p.Identity)
	set(MetadataGenerator, p.Generator)
	set(MetadataTelemetry, p.Telemetry)
	set(MetadataPushVersion, p.PushVersion)
	if p.Delta {
		md[MetadataDelta] = true
	}
	if !p.ConnectedAt.IsZero() {
		md[MetadataConnectedAt] = p.ConnectedAt.UTC().Format(time.RFC3339Nano)
	}
	if !p.PushSeenAt.IsZero() {
		md[MetadataPushSeenAt] = p.PushSeenAt.UTC().Format(time.RFC3339Nano)
	}
	if len(p.Problems) > 0 {
		list := make([]any, len(p.Problems))
		for i, s := range p.Problems {
			list[i] = s
		}
		md[MetadataProblems] = list
	}
	sent := map[string]any{}
	cc := &statusv3.ClientConfig{}
	for _, t := range p.Types {
		g := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: t.TypeURL, VersionInfo: t.AckedVersion, ConfigStatus: t.Status.csds()}
		if !t.SentAt.IsZero() {
			g.LastUpdated = timestamppb.New(t.SentAt)
		}
		if t.Nack != "" {
			g.ErrorState = &adminv3.UpdateFailureState{Details: t.Nack, VersionInfo: t.SentVersion, LastUpdateAttempt: g.LastUpdated}
		}
		if t.SentVersion != "" {
			m := map[string]any{"sentVersion": t.SentVersion, "resources": float64(t.Resources)}
			if !t.AckedAt.IsZero() {
				m["ackedAt"] = t.AckedAt.UTC().Format(time.RFC3339Nano)
			}
			if t.NackRepeats > 0 {
				m["nackRepeats"] = float64(t.NackRepeats)
			}
			sent[t.TypeURL] = m
		}
		cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, g)
	}
	if len(sent) > 0 {
		md[MetadataTypes] = sent
	}
	st, err := structpb.NewStruct(md)
	if err != nil {
		// Only strings, bools, numbers, lists and maps are put in: a
		// value structpb refuses is a bug here.
		panic(fmt.Sprintf("debugapi: node metadata: %v", err))
	}
	cc.Node = &corev3.Node{Id: p.ID, Metadata: st}
	return cc
}

func (s Status) csds() statusv3.ConfigStatus {
	switch s {
	case Synced:
		return statusv3.ConfigStatus_SYNCED
	case Stale:
		return statusv3.ConfigStatus_STALE
	case Nacked:
		return statusv3.ConfigStatus_ERROR
	case NotSent:
		return statusv3.ConfigStatus_NOT_SENT
	}
	return statusv3.ConfigStatus_UNKNOWN
}

func statusOf(s statusv3.ConfigStatus) Status {
	switch s {
	case statusv3.ConfigStatus_SYNCED:
		return Synced
	case statusv3.ConfigStatus_STALE:
		return Stale
	case statusv3.ConfigStatus_ERROR:
		return Nacked
	case statusv3.ConfigStatus_NOT_SENT:
		return NotSent
	}
	return Status(s.String())
}

// FromClientConfig decodes what Syncz sent (an Istio replica's too: the
// fields Flotilla adds are then empty).
func FromClientConfig(cc *statusv3.ClientConfig) ProxySync {
	md := cc.GetNode().GetMetadata().GetFields()
	str := func(k string) string { return md[k].GetStringValue() }
	p := ProxySync{
		ID: cc.GetNode().GetId(), Namespace: str(MetadataNamespace), IstioVersion: str(MetadataIstioVersion),
		ClusterID: str(MetadataClusterID), ProxyType: str(MetadataProxyType), Identity: str(MetadataIdentity),
		Generator: str(MetadataGenerator), Telemetry: str(MetadataTelemetry), Delta: md[MetadataDelta].GetBoolValue(), PushVersion: str(MetadataPushVersion),
	}
	if t, err := time.Parse(time.RFC3339Nano, str(MetadataConnectedAt)); err == nil {
		p.ConnectedAt = t
	}
	if t, err := time.Parse(time.RFC3339Nano, str(MetadataPushSeenAt)); err == nil {
		p.PushSeenAt = t
	}
	for _, v := range md[MetadataProblems].GetListValue().GetValues() {
		p.Problems = append(p.Problems, v.GetStringValue())
	}
	sent := md[MetadataTypes].GetStructValue().GetFields()
	for _, g := range cc.GetGenericXdsConfigs() {
		t := TypeSync{TypeURL: g.GetTypeUrl(), Status: statusOf(g.GetConfigStatus()), AckedVersion: g.GetVersionInfo(), Nack: g.GetErrorState().GetDetails()}
		if g.GetLastUpdated() != nil {
			t.SentAt = g.GetLastUpdated().AsTime()
		}
		if s := sent[g.GetTypeUrl()].GetStructValue().GetFields(); s != nil {
			t.SentVersion = s["sentVersion"].GetStringValue()
			if at, err := time.Parse(time.RFC3339Nano, s["ackedAt"].GetStringValue()); err == nil {
				t.AckedAt = at
			}
			t.Resources = int(s["resources"].GetNumberValue())
			t.NackRepeats = int(s["nackRepeats"].GetNumberValue())
		}
		p.Types = append(p.Types, t)
	}
	return p
}

// Replica identifies the discovery replica that answered, in a
// response's ControlPlane identifier: the JSON istiod puts there
// ({"Component":…,"ID":…,"Info":{"version":…}}).
type Replica struct {
	Component string `json:"Component"`
	ID        string `json:"ID"`
	Info      struct {
		Version string `json:"version"`
	} `json:"Info"`
	// Revision is the control-plane revision of a discovery replica
	// (istio.io/rev); Flotilla's own field, which Istio's clients ignore.
	Revision string `json:"Revision,omitempty"`
}

// NewReplica describes a replica.
func NewReplica(component, id, version string) Replica {
	r := Replica{Component: component, ID: id}
	r.Info.Version = version
	return r
}

// ControlPlane is r as a response carries it.
func (r Replica) ControlPlane() *corev3.ControlPlane {
	b, _ := json.Marshal(r) // strings only: cannot fail
	return &corev3.ControlPlane{Identifier: string(b)}
}

// ReplicaHeader is the gRPC response header in which a service whose
// responses have no ControlPlane field (ca's IstioCertificateService)
// names itself: ControlPlane's identifier, Replica's JSON.
const ReplicaHeader = "x-flotilla-replica"

// ReplicaOf reads a response's ControlPlane identifier; one that is not
// Istio's JSON is taken as the ID alone.
func ReplicaOf(cp *corev3.ControlPlane) Replica {
	var r Replica
	if err := json.Unmarshal([]byte(cp.GetIdentifier()), &r); err != nil || r.ID == "" {
		return Replica{ID: cp.GetIdentifier()}
	}
	return r
}

// Fetch asks the replica behind cc for one debug type (names as the type
// wants them) and returns its answer; the stream is closed after it.
func Fetch(ctx context.Context, cc grpc.ClientConnInterface, typeURL string, names ...string) (*discoveryv3.DiscoveryResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Answers repeat type URLs and keys proxy after proxy: compressed,
	// a listing is a fraction of its size on the wire.
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx, grpc.UseCompressor(gzip.Name))
	if err != nil {
		return nil, fmt.Errorf("open a debug stream: %w", err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "flotilla-cli"}, TypeUrl: typeURL, ResourceNames: names}); err != nil {
		return nil, fmt.Errorf("send %s: %w", typeURL, err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", typeURL, err)
	}
	_ = stream.CloseSend()
	return resp, nil
}

// Syncs decodes a Syncz response.
func Syncs(resp *discoveryv3.DiscoveryResponse) ([]ProxySync, error) {
	out := make([]ProxySync, 0, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		var cc statusv3.ClientConfig
		if err := a.UnmarshalTo(&cc); err != nil {
			return nil, fmt.Errorf("syncz resource %s: %w", a.GetTypeUrl(), err)
		}
		out = append(out, FromClientConfig(&cc))
	}
	return out, nil
}
