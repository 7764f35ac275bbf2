// Package envoytypes is the registry of Envoy's API types: importing it
// links every message of go-control-plane and cncf/xds (the generated
// envoytypes.gen.go, `make generate`), so that an Any a user writes in
// YAML ("@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua)
// resolves as Envoy resolves it. Decode turns such user-written values,
// held as protobuf Structs in Istio's API (EnvoyFilter patch values), into
// Envoy's messages.
package envoytypes

import (
	"errors"
	"fmt"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
)

// Decode fills out from a Struct written in Envoy's JSON form, as
// Istio's StructToMessage does: strict refuses fields out does not have
// (Istio warns on those), lenient ignores them (what Istio applies, so a
// value written for a newer Envoy still applies). An Any of a type Envoy
// does not have is an error either way.
func Decode(value *structpb.Struct, out proto.Message, strict bool) error {
	if value == nil {
		return errors.New("no value")
	}
	buf, err := protojson.Marshal(value)
	if err != nil {
		return err
	}
	opts := protojson.UnmarshalOptions{DiscardUnknown: !strict, Resolver: protoregistry.GlobalTypes}
	if err := opts.Unmarshal(buf, out); err != nil {
		if strings.Contains(err.Error(), "unable to resolve") {
			return fmt.Errorf("referenced type unknown: %w", err)
		}
		return err
	}
	return nil
}

// PatchTarget is a new, empty message of what an EnvoyFilter patch of
// applyTo holds (Istio's BuildXDSObjectFromStruct); false for INVALID or
// an applyTo this API version does not have.
func PatchTarget(applyTo networking.EnvoyFilter_ApplyTo) (proto.Message, bool) {
	switch applyTo {
	case networking.EnvoyFilter_CLUSTER:
		return &clusterv3.Cluster{}, true
	case networking.EnvoyFilter_LISTENER:
		return &listenerv3.Listener{}, true
	case networking.EnvoyFilter_ROUTE_CONFIGURATION:
		return &routev3.RouteConfiguration{}, true
	case networking.EnvoyFilter_FILTER_CHAIN:
		return &listenerv3.FilterChain{}, true
	case networking.EnvoyFilter_HTTP_FILTER:
		return &hcmv3.HttpFilter{}, true
	case networking.EnvoyFilter_NETWORK_FILTER:
		return &listenerv3.Filter{}, true
	case networking.EnvoyFilter_VIRTUAL_HOST:
		return &routev3.VirtualHost{}, true
	case networking.EnvoyFilter_HTTP_ROUTE:
		return &routev3.Route{}, true
	case networking.EnvoyFilter_EXTENSION_CONFIG:
		return &corev3.TypedExtensionConfig{}, true
	case networking.EnvoyFilter_BOOTSTRAP:
		return &bootstrapv3.Bootstrap{}, true
	case networking.EnvoyFilter_LISTENER_FILTER:
		return &listenerv3.ListenerFilter{}, true
	}
	return nil, false
}

// Fresh is a new, empty message of m's type.
func Fresh(m proto.Message) proto.Message { return m.ProtoReflect().New().Interface() }

// MissingTypedConfig names the configured parts of m (filters, sockets,
// extensions) that have a typed_config field but set neither it nor
// config_discovery: Envoy finds those by name only while a deprecated
// runtime flag allows (Istio's recurseMissingTypedConfig).
func MissingTypedConfig(m proto.Message) []string {
	return missingTypedConfig(m.ProtoReflect())
}

func missingTypedConfig(m protoreflect.Message) []string {
	var out []string
	fields := m.Descriptor().Fields()
	name := ""
	if f := fields.ByJSONName("name"); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
		name = m.Get(f).String()
	}
	requires, has := false, false
	for i := range fields.Len() {
		f := fields.Get(i)
		set := m.Has(f)
		switch f.JSONName() {
		case "typedConfig":
			requires = true
			has = has || set
		case "configDiscovery":
			has = has || set
		}
		if !set || f.Message() == nil || f.IsMap() {
			continue
		}
		if f.IsList() {
			l := m.Get(f).List()
			for j := range l.Len() {
				out = append(out, missingTypedConfig(l.Get(j).Message())...)
			}
			continue
		}
		out = append(out, missingTypedConfig(m.Get(f).Message())...)
	}
	if requires && !has {
		out = append(out, name)
	}
	return out
}
