// Package crdgen writes structural CustomResourceDefinitions for the Istio
// kinds Flotilla serves, derived from the istio.io/api protobuf descriptors:
// every spec field with its JSON name and type, so that the apiserver prunes
// unknown fields and rejects wrong types before galley's webhook sees an
// object. Semantic checks stay in internal/validation.
package crdgen

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// For returns the CRD of one kind.
func For(k istio.Kind) *apiextv1.CustomResourceDefinition {
	spec := schemaOf(k.NewSpec().ProtoReflect().Descriptor(), nil)
	preserve := true
	root := &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextv1.JSONSchemaProps{
			"spec": spec,
			// Status is written by galley's status writer (validation
			// messages) and by other controllers: keep it open.
			"status": {Type: "object", XPreserveUnknownFields: &preserve},
		},
	}}
	group := strings.ReplaceAll(k.Group, ".", "-")
	crd := &apiextv1.CustomResourceDefinition{
		TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   k.Plural + "." + k.Group,
			Labels: map[string]string{"app.kubernetes.io/part-of": "flotilla"},
		},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: k.Group,
			Names: apiextv1.CustomResourceDefinitionNames{
				Plural:     k.Plural,
				Singular:   strings.ToLower(k.Kind),
				Kind:       k.Kind,
				ListKind:   k.Kind + "List",
				ShortNames: k.ShortNames,
				Categories: []string{"istio-io", group},
			},
			Scope: apiextv1.NamespaceScoped,
		},
	}
	for i, v := range k.Versions {
		crd.Spec.Versions = append(crd.Spec.Versions, apiextv1.CustomResourceDefinitionVersion{
			Name:         v,
			Served:       true,
			Storage:      i == 0,
			Schema:       root.DeepCopy(),
			Subresources: &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
		})
	}
	return crd
}

// All returns the CRDs of every served kind.
func All() []*apiextv1.CustomResourceDefinition {
	var out []*apiextv1.CustomResourceDefinition
	for _, k := range istio.Kinds() {
		out = append(out, For(k))
	}
	return out
}

// schemaOf maps a message to an object schema. path holds the messages
// being expanded, to stop at recursion.
func schemaOf(md protoreflect.MessageDescriptor, path []protoreflect.FullName) apiextv1.JSONSchemaProps {
	if s, ok := wellKnown(md); ok {
		return s
	}
	for _, p := range path {
		if p == md.FullName() {
			preserve := true
			return apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}
		}
	}
	path = append(path, md.FullName())
	props := map[string]apiextv1.JSONSchemaProps{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		props[fd.JSONName()] = fieldSchema(fd, path)
	}
	return apiextv1.JSONSchemaProps{Type: "object", Properties: props}
}

func fieldSchema(fd protoreflect.FieldDescriptor, path []protoreflect.FullName) apiextv1.JSONSchemaProps {
	switch {
	case fd.IsMap():
		v := singular(fd.MapValue(), path)
		return apiextv1.JSONSchemaProps{Type: "object", AdditionalProperties: &apiextv1.JSONSchemaPropsOrBool{Allows: true, Schema: &v}}
	case fd.IsList():
		item := singular(fd, path)
		return apiextv1.JSONSchemaProps{Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &item}}
	default:
		return singular(fd, path)
	}
}

// singular is the schema of one value of fd's type.
func singular(fd protoreflect.FieldDescriptor, path []protoreflect.FullName) apiextv1.JSONSchemaProps {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return apiextv1.JSONSchemaProps{Type: "boolean"}
	case protoreflect.StringKind:
		return apiextv1.JSONSchemaProps{Type: "string"}
	case protoreflect.BytesKind:
		return apiextv1.JSONSchemaProps{Type: "string", Format: "byte"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return apiextv1.JSONSchemaProps{Type: "integer", Format: "int32"}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return apiextv1.JSONSchemaProps{Type: "integer", Minimum: ptr(0), Maximum: ptr(4294967295)}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return apiextv1.JSONSchemaProps{Type: "integer", Format: "int64"}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return apiextv1.JSONSchemaProps{Type: "number", Format: "double"}
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		var enum []apiextv1.JSON
		for i := range vals.Len() {
			enum = append(enum, apiextv1.JSON{Raw: []byte(fmt.Sprintf("%q", vals.Get(i).Name()))})
		}
		return apiextv1.JSONSchemaProps{Type: "string", Enum: enum}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return schemaOf(fd.Message(), path)
	default:
		preserve := true
		return apiextv1.JSONSchemaProps{XPreserveUnknownFields: &preserve}
	}
}

// wellKnown maps protobuf's well-known types to their JSON forms.
func wellKnown(md protoreflect.MessageDescriptor) (apiextv1.JSONSchemaProps, bool) {
	preserve := true
	switch md.FullName() {
	case "google.protobuf.Duration":
		// "1.5s" as protobuf writes it, or "1m30s" as users write it;
		// galley parses both.
		return apiextv1.JSONSchemaProps{Type: "string"}, true
	case "google.protobuf.Timestamp":
		return apiextv1.JSONSchemaProps{Type: "string", Format: "date-time"}, true
	case "google.protobuf.BoolValue":
		return apiextv1.JSONSchemaProps{Type: "boolean", Nullable: true}, true
	case "google.protobuf.StringValue":
		return apiextv1.JSONSchemaProps{Type: "string", Nullable: true}, true
	case "google.protobuf.BytesValue":
		return apiextv1.JSONSchemaProps{Type: "string", Format: "byte", Nullable: true}, true
	case "google.protobuf.Int32Value", "google.protobuf.UInt32Value", "google.protobuf.Int64Value", "google.protobuf.UInt64Value":
		return apiextv1.JSONSchemaProps{Type: "integer", Nullable: true}, true
	case "google.protobuf.FloatValue", "google.protobuf.DoubleValue":
		return apiextv1.JSONSchemaProps{Type: "number", Nullable: true}, true
	case "google.protobuf.Struct":
		return apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}, true
	case "google.protobuf.Value", "google.protobuf.ListValue", "google.protobuf.Any":
		return apiextv1.JSONSchemaProps{XPreserveUnknownFields: &preserve}, true
	case "google.protobuf.Empty":
		return apiextv1.JSONSchemaProps{Type: "object"}, true
	}
	return apiextv1.JSONSchemaProps{}, false
}

func ptr(f float64) *float64 { return &f }
