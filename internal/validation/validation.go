// Package validation checks Istio configuration objects the way users rely
// on: every problem of an object at once, each with its field path
// ("spec.http[0].route[1].weight"), errors (the object is rejected) apart
// from warnings (it is accepted, but probably not what was meant), each
// with a code (codes.go; docs/analyze.md is the table). Analyze adds the
// cross-object checks over a whole configuration, built on discovery's own
// push context so that it resolves hosts, subsets and policies as
// discovery does. It is pure: galley's admission webhook, galley's file
// mode and `flotilla analyze` all call it.
package validation

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// Issue is one problem at one field.
type Issue struct {
	// Code says what kind of problem it is: CodeInvalid for every error,
	// CodeSchemaWarning or a more specific code for a warning.
	Code Code
	// Path is the field, e.g. "spec.http[0].route[1].weight".
	Path    string
	Message string
}

func (i Issue) String() string {
	if i.Path == "" {
		return i.Message
	}
	return i.Path + ": " + i.Message
}

// Result holds every issue found in one object.
type Result struct {
	Errors   []Issue
	Warnings []Issue
}

// OK reports whether the object has no errors (warnings allowed).
func (r *Result) OK() bool { return len(r.Errors) == 0 }

// Err returns the errors as one error, or nil.
func (r *Result) Err() error {
	if r.OK() {
		return nil
	}
	return &Error{Issues: r.Errors}
}

// Error is a validation failure listing every error of an object.
type Error struct {
	Issues []Issue
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Issues))
	for i, is := range e.Issues {
		parts[i] = is.String()
	}
	return strings.Join(parts, "; ")
}

func (r *Result) errorf(path, format string, args ...any) {
	r.Errors = append(r.Errors, Issue{Code: CodeInvalid, Path: path, Message: fmt.Sprintf(format, args...)})
}

func (r *Result) warnf(path, format string, args ...any) {
	r.warnc(CodeSchemaWarning, path, format, args...)
}

// warnc is a warning of a specific code.
func (r *Result) warnc(code Code, path, format string, args ...any) {
	r.Warnings = append(r.Warnings, Issue{Code: code, Path: path, Message: fmt.Sprintf(format, args...)})
}

// Context answers the cross-object questions some checks ask. It may be
// nil: those checks are then skipped.
type Context interface {
	// Subsets returns the subset names that DestinationRules visible from
	// namespace define for host, and whether any such DestinationRule
	// exists.
	Subsets(namespace, host string) (names []string, found bool)
}

// Validate checks one object a user writes (galley's webhook, its
// Kubernetes and file sources, analyze's files).
func Validate(obj *istio.Object, ctx Context) Result {
	return validate(obj, ctx, false)
}

// validate is Validate; admitted is for an object galley already serves,
// whose internal annotations are galley's own (analyze --live).
func validate(obj *istio.Object, ctx Context, admitted bool) Result {
	var r Result
	validateMeta(&r, obj)
	if !admitted {
		refuseInternalAnnotations(&r, obj)
	}
	v := &validator{r: &r, ctx: ctx, obj: obj}
	if check := checkFor(obj.Kind.Kind); check != nil {
		check(v)
	} else {
		r.errorf("kind", "unsupported kind %s", obj.Kind.Kind)
	}
	sortIssues(r.Errors)
	sortIssues(r.Warnings)
	return r
}

// checkFor returns the check of a kind of istio.Kinds() by its name, nil
// for any other (a test keeps the two in step).
func checkFor(kind string) func(*validator) {
	switch kind {
	case istio.VirtualService:
		return (*validator).virtualService
	case istio.DestinationRule:
		return (*validator).destinationRule
	case istio.Gateway:
		return (*validator).gateway
	case istio.ServiceEntry:
		return (*validator).serviceEntry
	case istio.WorkloadEntry:
		return (*validator).workloadEntry
	case istio.WorkloadGroup:
		return (*validator).workloadGroup
	case istio.Sidecar:
		return (*validator).sidecar
	case istio.PeerAuthentication:
		return (*validator).peerAuthentication
	case istio.RequestAuthentication:
		return (*validator).requestAuthentication
	case istio.AuthorizationPolicy:
		return (*validator).authorizationPolicy
	case istio.Telemetry:
		return (*validator).telemetry
	case istio.EnvoyFilter:
		return (*validator).envoyFilter
	case istio.ProxyConfig:
		return (*validator).proxyConfig
	case istio.WasmPlugin:
		return (*validator).wasmPlugin
	case istio.TrafficExtension:
		return (*validator).trafficExtension
	}
	return nil
}

// sortIssues orders issues by path so that results are deterministic
// (several checks walk maps).
func sortIssues(is []Issue) {
	slices.SortStableFunc(is, func(a, b Issue) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
}

type validator struct {
	r   *Result
	ctx Context
	obj *istio.Object
	// regexBytes and regexInsts are the regex work done on this object so
	// far: bounded, so no object costs the webhook more than its budget.
	regexBytes, regexInsts int
	regexOver              bool
}

func validateMeta(r *Result, obj *istio.Object) {
	if msg := dns1123Subdomain(obj.Meta.Name); msg != "" {
		r.errorf("metadata.name", "%q %s", obj.Meta.Name, msg)
	}
	if msg := dns1123Label(obj.Meta.Namespace); msg != "" {
		r.errorf("metadata.namespace", "%q %s", obj.Meta.Namespace, msg)
	}
}

// refuseInternalAnnotations: galley's own annotations say what only
// galley knows (the ReferenceGrants behind
// model.AnnotationGrantedCredentials): an object written with one could
// claim another namespace's Secrets. model.AnnotationParentNamespace is
// Istio's name, refused as Istio refuses it: a Gateway written with it
// would configure another namespace's gateway.
func refuseInternalAnnotations(r *Result, obj *istio.Object) {
	for _, k := range slices.Sorted(maps.Keys(obj.Meta.Annotations)) {
		switch {
		case strings.HasPrefix(k, model.InternalAnnotationPrefix):
			r.errorf("metadata.annotations", "%s annotations are galley's own (%s): an object may not set them", model.InternalAnnotationPrefix, k)
		case k == model.AnnotationParentNamespace:
			r.errorf("metadata.annotations", "%s is set only on the Gateways galley converts from ListenerSets: an object may not set it", k)
		}
	}
}
