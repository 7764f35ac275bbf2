package debugapi

import (
	"fmt"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Rejections (Flotilla's) is galley's, asked on its MCP port as
// Subscribers is: one google.protobuf.Struct per configuration document
// or object galley refuses to serve (invalid YAML, a failed validation,
// a duplicate), the Rejection below as JSON. What galley refuses it does
// not publish: the proxies keep the object's last valid state, or never
// get it. flotilla check fails on them, flotilla wait on an object galley
// refuses fails with the reason.
const Rejections = FlotillaPrefix + "rejections"

// Rejection is one document or object galley refuses.
type Rejection struct {
	// Object is "Kind namespace/name" when known (not for a document
	// that does not parse).
	Object string `json:"object,omitempty"`
	// Message says where and why: "file:line: Kind ns/name: reason" for a
	// file, the validation's errors for a cluster object.
	Message string `json:"message"`
	// Since is when galley first refused it (as it is now).
	Since time.Time `json:"since"`
}

// Struct encodes r as Rejections sends it.
func (r Rejection) Struct() (*structpb.Struct, error) { return toStruct("rejection", r) }

// RejectionsOf decodes a Rejections response.
func RejectionsOf(resp *discoveryv3.DiscoveryResponse) ([]Rejection, error) {
	return listOf[Rejection]("rejection", resp)
}

// listOf decodes a response of one Struct per item, each an item's JSON.
func listOf[T any](what string, resp *discoveryv3.DiscoveryResponse) ([]T, error) {
	out := make([]T, 0, len(resp.GetResources()))
	for _, a := range resp.GetResources() {
		var st structpb.Struct
		if err := a.UnmarshalTo(&st); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		var v T
		if err := fromStruct(what, &st, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Structs encodes items as a response of one Struct per item
// (Subscribers, Rejections) carries them.
func Structs[T interface {
	Struct() (*structpb.Struct, error)
}](items []T) ([]*structpb.Struct, error) {
	out := make([]*structpb.Struct, 0, len(items))
	for _, it := range items {
		st, err := it.Struct()
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}
