package istio

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// jsonable turns what yaml.v3 decodes into values encoding/json accepts:
// mappings with non-string scalar keys (PeerAuthentication's
// "portLevelMtls: {8080: …}") get their keys as strings.
func jsonable(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			t[k] = c
		}
		return t, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			switch k.(type) {
			case string, int, int64, uint64, float64, bool:
			default:
				return nil, fmt.Errorf("map key %v is not a scalar", k)
			}
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			out[fmt.Sprint(k)] = c
		}
		return out, nil
	case []any:
		for i, e := range t {
			c, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			t[i] = c
		}
		return t, nil
	default:
		return v, nil
	}
}

// normalizeDurations rewrites Go-style durations ("24h", "1m30s", "500ms"),
// which Kubernetes users write and Istio's CRD schemas accept, into the
// seconds form protobuf JSON requires ("86400s"), following the message
// schema so that only google.protobuf.Duration fields are touched.
func normalizeDurations(v any, md protoreflect.MessageDescriptor) {
	obj, ok := v.(map[string]any)
	if !ok {
		return
	}
	fields := md.Fields()
	for k, val := range obj {
		fd := fields.ByJSONName(k)
		if fd == nil {
			fd = fields.ByName(protoreflect.Name(k))
		}
		if fd == nil {
			continue // unknown: protojson reports it
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				if m, ok := val.(map[string]any); ok {
					for mk, mv := range m {
						m[mk] = normalizeValue(mv, fd.MapValue().Message())
					}
				}
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				if list, ok := val.([]any); ok {
					for i, e := range list {
						list[i] = normalizeValue(e, fd.Message())
					}
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			obj[k] = normalizeValue(val, fd.Message())
		}
	}
}

func normalizeValue(v any, md protoreflect.MessageDescriptor) any {
	if md.FullName() == "google.protobuf.Duration" {
		if s, ok := v.(string); ok {
			return protoDuration(s)
		}
		return v
	}
	normalizeDurations(v, md)
	return v
}

// protoDuration converts a Go duration to protobuf JSON form; anything that
// is not a Go duration is returned as is, for protojson to judge.
func protoDuration(s string) string {
	if strings.HasSuffix(s, "s") && !strings.HasSuffix(s, "ms") && !strings.HasSuffix(s, "us") &&
		!strings.HasSuffix(s, "ns") && !strings.HasSuffix(s, "µs") {
		if _, err := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64); err == nil {
			return s // already "1.5s"
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return s
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// DecodeProtoYAML decodes YAML (or JSON) into a protobuf message the way
// object specs are decoded: strict about unknown fields, accepting integer
// map keys and Go-style durations. Used for mesh configuration.
func DecodeProtoYAML(data []byte, msg proto.Message) error {
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return fmt.Errorf("invalid YAML: %w", err)
	}
	if generic == nil {
		return nil // empty: the message keeps its zero value
	}
	generic, err := jsonable(generic)
	if err != nil {
		return err
	}
	normalizeDurations(generic, msg.ProtoReflect().Descriptor())
	raw, err := json.Marshal(generic)
	if err != nil {
		return fmt.Errorf("cannot convert to JSON: %w", err)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(raw, msg); err != nil {
		return errors.New(protoReason(err))
	}
	return nil
}
