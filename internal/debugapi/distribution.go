package debugapi

import (
	"encoding/json"
	"fmt"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// Distribution (Flotilla's; Istio removed its config_distribution) is,
// for the one Istio object named ("Kind/namespace/name"), which of its
// versions the replica's push contexts held, from which push on, and
// which push each connected proxy holds all of: a proxy holds push N when
// it acknowledged every response it was sent from push contexts up to N
// (a push that changed nothing for it counts once it was decided). One
// google.protobuf.Struct carries the Distribution below, as its JSON.
const Distribution = FlotillaPrefix + "distribution"

// ObjectVersion is one version of an object on a replica, and the first
// push that held it.
type ObjectVersion struct {
	// Version is the object's generation in the apiserver, or galley's
	// content version for an object that has none; empty for a deletion.
	Version string `json:"version,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
	Push    uint64 `json:"push"`
}

// ProxyPush is the push a proxy holds all of (0: none yet).
type ProxyPush struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Push      uint64 `json:"push"`
}

// ObjectDistribution is what Distribution answers.
type ObjectDistribution struct {
	Object string `json:"object"`
	// Push is the replica's latest push context.
	Push uint64 `json:"push"`
	// History holds the object's versions, oldest first: the last few
	// the replica saw (since it started), a deletion among them.
	History []ObjectVersion `json:"history,omitempty"`
	Proxies []ProxyPush     `json:"proxies,omitempty"`
}

// Struct encodes d as Distribution sends it.
func (d ObjectDistribution) Struct() (*structpb.Struct, error) {
	return toStruct("distribution", d)
}

// ParseDistribution decodes what Distribution sent.
func ParseDistribution(st *structpb.Struct) (ObjectDistribution, error) {
	var d ObjectDistribution
	return d, fromStruct("distribution", st, &d)
}

// toStruct is v's JSON as a Struct: the encoding of Flotilla's debug
// types that have no protobuf message of their own.
func toStruct(what string, v any) (*structpb.Struct, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	st := &structpb.Struct{}
	if err := protojson.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return st, nil
}

// fromStruct decodes what toStruct encoded into v.
func fromStruct(what string, st *structpb.Struct, v any) error {
	b, err := protojson.Marshal(st)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// DistributionOf decodes a Distribution response.
func DistributionOf(resp *discoveryv3.DiscoveryResponse) (ObjectDistribution, error) {
	if n := len(resp.GetResources()); n != 1 {
		return ObjectDistribution{}, fmt.Errorf("distribution: %d resources, want 1", n)
	}
	var st structpb.Struct
	if err := resp.GetResources()[0].UnmarshalTo(&st); err != nil {
		return ObjectDistribution{}, fmt.Errorf("distribution: %w", err)
	}
	return ParseDistribution(&st)
}

// Latest is the object's version on the replica; false when it has none
// (it never had the object, or it was deleted).
func (d ObjectDistribution) Latest() (string, bool) {
	if len(d.History) == 0 || d.History[len(d.History)-1].Deleted {
		return "", false
	}
	return d.History[len(d.History)-1].Version, true
}

// Want is the state of an object a wait is for: a version (or a later
// one), or its deletion.
type Want struct {
	// Version is a generation (then any later generation will do too),
	// or a content version, which must be matched exactly. Empty: the
	// replica's latest version.
	Version string
	Delete  bool
}

// Required is the first push that holds what w asks for: every proxy
// holding it (or a later push) has the object as wanted. ok is false
// when the replica has no such push yet, and why says what it holds
// instead ("has version 3, not 4": the replica's). An object the replica never had counts as deleted since its
// first push.
func (d ObjectDistribution) Required(w Want) (push uint64, ok bool, why string) {
	// Only what follows the last deletion is the object as it is now.
	current := d.History
	for i := len(d.History) - 1; i >= 0; i-- {
		if d.History[i].Deleted {
			if w.Delete {
				if i == len(d.History)-1 {
					return d.History[i].Push, true, ""
				}
				return 0, false, "was created again after its deletion (version " + d.History[len(d.History)-1].Version + ")"
			}
			current = d.History[i+1:]
			break
		}
	}
	switch {
	case w.Delete && len(d.History) == 0:
		return 0, true, ""
	case w.Delete:
		return 0, false, "still has version " + current[len(current)-1].Version
	case len(current) == 0:
		return 0, false, "does not have the object"
	case w.Version == "":
		return current[len(current)-1].Push, true, ""
	}
	want, wantGen := ParseGeneration(w.Version)
	for _, v := range current {
		if v.Version == w.Version {
			return v.Push, true, ""
		}
		if g, isGen := ParseGeneration(v.Version); wantGen && isGen && g >= want {
			return v.Push, true, "" // that generation came later, in the same push
		}
	}
	return 0, false, "has version " + current[len(current)-1].Version + ", not " + w.Version
}

// ParseGeneration reads a version that is a generation (a positive
// integer); false for a content version.
func ParseGeneration(v string) (int64, bool) {
	g, err := strconv.ParseInt(v, 10, 64)
	return g, err == nil && g > 0
}
