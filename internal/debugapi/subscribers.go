package debugapi

import (
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Subscribers (Flotilla's) is galley's: asked on its MCP port as the
// debug types above are asked of discovery, it answers one
// google.protobuf.Struct per open subscription stream, the Subscriber
// below as JSON: discovery replicas and injectors with the versions their
// node metadata carries (flotilla version). Anyone galley's port admits
// may ask: the system namespace's certificates, or plain text in a local
// run.
const Subscribers = FlotillaPrefix + "subscribers"

// Subscriber is one of galley's subscribers.
type Subscriber struct {
	// ID is its node ID ("discovery~<replica>", "injector~<host>").
	ID string `json:"id"`
	// Identity is its certificate's SPIFFE ID, or "plaintext".
	Identity    string    `json:"identity"`
	Version     string    `json:"version,omitempty"`
	ConnectedAt time.Time `json:"connectedAt"`
	// Unanswered names each collection whose latest response the
	// subscriber has neither acknowledged nor rejected yet, with when it
	// was sent: a subscriber current with galley has none (or only
	// responses sent a moment ago).
	Unanswered map[string]time.Time `json:"unanswered,omitempty"`
	// Rejected names each collection whose latest response the subscriber
	// rejected, with its reason (cut short).
	Rejected map[string]string `json:"rejected,omitempty"`
}

// Struct encodes s as Subscribers sends it.
func (s Subscriber) Struct() (*structpb.Struct, error) { return toStruct("subscriber", s) }

// SubscribersOf decodes a Subscribers response.
func SubscribersOf(resp *discoveryv3.DiscoveryResponse) ([]Subscriber, error) {
	return listOf[Subscriber]("subscriber", resp)
}
