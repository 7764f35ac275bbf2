// Package mcp speaks MCP-over-xDS, the protocol galley uses to stream
// configuration and registry resources to discovery and injector: the xDS
// aggregated discovery service (delta, and state-of-the-world for
// compatibility with Istio's sinks) where each resource is an
// istio.io/api/mcp/v1alpha1.Resource (metadata plus an Any body) and the
// type URL names the collection ("networking.istio.io/v1/VirtualService").
//
// Server publishes collections on go-control-plane's server and caches;
// Client subscribes, ACKs or NACKs, reconnects with backoff and resumes
// with the versions it holds so that it receives only differences.
package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcpv1alpha1 "istio.io/api/mcp/v1alpha1"
)

// Resource is one resource of a collection.
type Resource struct {
	// Name is unique in its collection: "namespace/name" for namespaced
	// objects.
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	// Created is the object's creation time (zero when unknown): it
	// decides which of conflicting objects wins, the oldest, as in Istio.
	Created time.Time
	// Generation is the object's metadata.generation in the apiserver (0
	// when it has none: objects read from files). It travels as the MCP
	// metadata's version, so that a subscriber can tell which change of
	// an object it holds (flotilla wait). Unlike the resourceVersion, it
	// changes only with the object's spec, not with its status, and is
	// the same in every galley replica.
	Generation int64
	// Body is the payload, e.g. an Istio spec or a registry message.
	Body *anypb.Any
	// Version is the content hash of the resource, set by the server and
	// seen by clients. Equal content has an equal version in every galley
	// replica and across restarts.
	Version string
	// Published is, on the client, when the server published this content
	// (by the server's clock; zero from a server that does not say). It
	// travels in the delta response's resource metadata (PublishedMetadata),
	// outside the resource and its version.
	Published time.Time
	// Trace is, on the client, the span of the change that published this
	// content (a remote span context; invalid when the server did not say),
	// carried beside Published as W3C trace context.
	Trace trace.SpanContext
}

// PublishedMetadata is the filter_metadata key of a delta response's
// resource under which the server says when it published the content,
// and in which change: {"published": RFC 3339 time, "traceparent": …,
// "tracestate": …} (W3C trace context, when the change was traced).
const PublishedMetadata = "flotilla.io/mcp"

// traceContext is the W3C propagation of a change's span.
var traceContext = propagation.TraceContext{}

// publishedMetadata says when content was published, and in which
// change's span (ctx's).
func publishedMetadata(ctx context.Context, at time.Time) *corev3.Metadata {
	fields := map[string]*structpb.Value{"published": structpb.NewStringValue(at.UTC().Format(time.RFC3339Nano))}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	for k, v := range carrier {
		fields[k] = structpb.NewStringValue(v)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{PublishedMetadata: {Fields: fields}}}
}

// publishedAt reads publishedMetadata: the time (zero when absent or not
// a time) and the change's span context (invalid when absent).
func publishedAt(md *corev3.Metadata) (time.Time, trace.SpanContext) {
	fields := md.GetFilterMetadata()[PublishedMetadata].GetFields()
	var sc trace.SpanContext
	if parent := fields["traceparent"].GetStringValue(); parent != "" { // only a traced change has one
		carrier := propagation.MapCarrier{"traceparent": parent}
		if state := fields["tracestate"].GetStringValue(); state != "" {
			carrier["tracestate"] = state
		}
		sc = trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
	}
	t, err := time.Parse(time.RFC3339Nano, fields["published"].GetStringValue())
	if err != nil {
		return time.Time{}, sc
	}
	return t, sc
}

// ObjectVersion tells one change of the object from another, as
// subscribers track its distribution: its generation when it has one,
// else its content version.
func (r *Resource) ObjectVersion() string {
	if r.Generation > 0 {
		return strconv.FormatInt(r.Generation, 10)
	}
	return r.Version
}

// NewResource wraps body under name.
func NewResource(name string, body proto.Message, labels, annotations map[string]string) (*Resource, error) {
	// Deterministic: maps in the body must encode the same way every time,
	// or equal content would get a new version (and a push) on every restart.
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, body, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, fmt.Errorf("resource %s: %w", name, err)
	}
	return &Resource{Name: name, Labels: labels, Annotations: annotations, Body: a}, nil
}

// toProto builds the wire message. Only content goes in: of the
// apiserver's versions only the generation, and of timestamps only the
// creation time, which are the same in every galley replica and across
// restarts, so that equal content encodes equally.
func (r *Resource) toProto() *mcpv1alpha1.Resource {
	m := &mcpv1alpha1.Resource{
		Metadata: &mcpv1alpha1.Metadata{
			Name:        r.Name,
			Labels:      r.Labels,
			Annotations: r.Annotations,
		},
		Body: r.Body,
	}
	if !r.Created.IsZero() {
		m.Metadata.CreateTime = timestamppb.New(r.Created)
	}
	if r.Generation > 0 {
		m.Metadata.Version = strconv.FormatInt(r.Generation, 10)
	}
	return m
}

func fromProto(m *mcpv1alpha1.Resource, version string) *Resource {
	r := &Resource{
		Name:        m.GetMetadata().GetName(),
		Labels:      maps.Clone(m.GetMetadata().GetLabels()),
		Annotations: maps.Clone(m.GetMetadata().GetAnnotations()),
		Body:        m.GetBody(),
		Version:     version,
	}
	if ct := m.GetMetadata().GetCreateTime(); ct != nil && ct.IsValid() {
		r.Created = ct.AsTime()
	}
	if v := m.GetMetadata().GetVersion(); v != "" { // registry resources have none: no parse error to make
		if g, err := strconv.ParseInt(v, 10, 64); err == nil && g > 0 {
			r.Generation = g // another version (an Istio sink's) is not a generation: ignored
		}
	}
	return r
}

// named gives go-control-plane's caches the resource name they look for
// (cache.GetResourceName): mcp Resources keep it in metadata.
type named struct {
	*mcpv1alpha1.Resource
}

func (n named) GetName() string { return n.GetMetadata().GetName() }

// contentHash is the version of an encoded resource.
func contentHash(encoded []byte) string {
	sum := sha256.Sum256(encoded)
	return hex.EncodeToString(sum[:12])
}

func marshal(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}
