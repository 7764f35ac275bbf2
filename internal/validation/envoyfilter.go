package validation

import (
	"fmt"
	"regexp"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/envoytypes"
)

// maxProxyVersionLen bounds an EnvoyFilter's proxyVersion expression, as
// Istio's (longer ones match no proxy; Istio warns).
const maxProxyVersionLen = 1024

// httpConnectionManager is the network filter an HTTP_FILTER's subFilter
// match requires (Istio's wellknown.HTTPConnectionManager), and its name
// before Envoy's v3 API.
const (
	httpConnectionManager       = "envoy.filters.network.http_connection_manager"
	legacyHTTPConnectionManager = "envoy.http_connection_manager"
)

// envoyFilter checks an EnvoyFilter as Istio's ValidateEnvoyFilter does
// (pkg/config/validation/envoyfilter): the workload selector, each patch's
// applyTo, operation and value, the match's shape for its applyTo, the
// proxy version regex, and the value decoded as Envoy's message of that
// applyTo (xds.BuildXDSObjectFromStruct: an unknown type is an error, an
// unknown field a warning).
func (v *validator) envoyFilter() {
	ef := v.obj.Spec.(*networking.EnvoyFilter)
	v.r.warnc(CodeEnvoyFilter, "spec", "EnvoyFilter exposes internal implementation details that may change at any time. Prefer other APIs if possible, and exercise extreme caution, especially around upgrades.")
	if sel := ef.GetWorkloadSelector(); sel != nil {
		if len(sel.GetLabels()) == 0 {
			v.r.warnf("spec.workloadSelector", "Envoy filter: workload selector specified without labels, will be applied to all services in namespace")
		}
		v.labels("spec.workloadSelector.labels", sel.GetLabels())
		if len(ef.GetTargetRefs()) > 0 {
			v.r.errorf("spec.targetRefs", "only one of targetRefs or workloadSelector can be set")
		}
	}
	for i, ref := range ef.GetTargetRefs() {
		p := at("spec.targetRefs", i)
		if ref.GetName() == "" {
			v.r.errorf(field(p, "name"), "targetRef name must be set")
		}
		if ref.GetNamespace() != "" && v.obj.Meta.Namespace != "" && ref.GetNamespace() != v.obj.Meta.Namespace {
			v.r.errorf(field(p, "namespace"), "cross namespace referencing is not currently supported")
		}
	}
	for i, cp := range ef.GetConfigPatches() {
		v.envoyFilterPatch(at("spec.configPatches", i), cp)
		v.envoyFilterOperation(at("spec.configPatches", i), cp, ef.GetPriority())
		if cp.GetApplyTo() == networking.EnvoyFilter_BOOTSTRAP {
			// Istio accepts it and, since its bootstrap discovery went
			// (1.21), applies it nowhere; said here, not left silent.
			v.r.warnc(CodeNotImplemented, field(at("spec.configPatches", i), "applyTo"), "BOOTSTRAP patches are not applied (Istio 1.32 applies none either: the agent writes Envoy's bootstrap)")
		}
	}
}

func (v *validator) envoyFilterPatch(path string, cp *networking.EnvoyFilter_EnvoyConfigObjectPatch) {
	if cp == nil {
		v.r.errorf(path, "Envoy filter: null config patch")
		return
	}
	match := cp.GetMatch()
	if match.GetContext() == networking.EnvoyFilter_WAYPOINT {
		// Istio does not check waypoint patches either; Flotilla has no
		// waypoints, so they apply to no proxy.
		return
	}
	switch {
	case cp.GetApplyTo() == networking.EnvoyFilter_INVALID:
		v.r.errorf(field(path, "applyTo"), "Envoy filter: missing applyTo")
		return
	case cp.GetPatch() == nil:
		v.r.errorf(field(path, "patch"), "Envoy filter: missing patch")
		return
	case cp.GetPatch().GetOperation() == networking.EnvoyFilter_Patch_INVALID:
		v.r.errorf(field(path, "patch.operation"), "Envoy filter: missing patch operation")
		return
	case cp.GetPatch().GetOperation() != networking.EnvoyFilter_Patch_REMOVE && cp.GetPatch().GetValue() == nil:
		v.r.errorf(field(path, "patch.value"), "Envoy filter: missing patch value for non-remove operation")
		return
	}
	if pv := match.GetProxy().GetProxyVersion(); pv != "" {
		if len(pv) > maxProxyVersionLen {
			v.r.warnf(field(path, "match.proxy.proxyVersion"), "Envoy filter: proxyVersion match exceeds %d characters and will be ignored", maxProxyVersionLen)
		} else if _, err := regexp.Compile(pv); err != nil {
			v.r.errorf(field(path, "match.proxy.proxyVersion"), "Envoy filter: invalid regex for proxy version, [%v]", err)
			return
		}
	}
	mp := field(path, "match")
	switch cp.GetApplyTo() {
	case networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_FILTER_CHAIN, networking.EnvoyFilter_NETWORK_FILTER, networking.EnvoyFilter_HTTP_FILTER:
		if match.GetObjectTypes() == nil {
			break
		}
		lm := match.GetListener()
		if lm == nil {
			v.r.errorf(mp, "Envoy filter: applyTo for listener class objects cannot have non listener match")
			return
		}
		f := lm.GetFilterChain().GetFilter()
		if f == nil {
			break
		}
		fp := field(mp, "listener.filterChain.filter")
		if cp.GetApplyTo() == networking.EnvoyFilter_LISTENER || cp.GetApplyTo() == networking.EnvoyFilter_FILTER_CHAIN {
			v.r.warnf(fp, "Envoy filter: filter match has no effect when used with %v", cp.GetApplyTo())
		}
		if f.GetName() == "" {
			v.r.errorf(field(fp, "name"), "Envoy filter: filter match has no name to match on")
			return
		}
		if sub := f.GetSubFilter(); sub != nil {
			switch {
			case cp.GetApplyTo() != networking.EnvoyFilter_HTTP_FILTER:
				v.r.errorf(field(fp, "subFilter"), "Envoy filter: subfilter match can be used with applyTo HTTP_FILTER only")
				return
			case f.GetName() != httpConnectionManager && f.GetName() != legacyHTTPConnectionManager:
				v.r.errorf(field(fp, "subFilter"), "Envoy filter: subfilter match requires filter match with %s", httpConnectionManager)
				return
			case sub.GetName() == "":
				v.r.errorf(field(fp, "subFilter.name"), "Envoy filter: subfilter match has no name to match on")
				return
			}
		}
		if f.GetName() == legacyHTTPConnectionManager {
			v.r.warnc(CodeDeprecated, field(fp, "name"), "using deprecated filter name %q; use %q instead", f.GetName(), httpConnectionManager)
		}
	case networking.EnvoyFilter_ROUTE_CONFIGURATION, networking.EnvoyFilter_VIRTUAL_HOST, networking.EnvoyFilter_HTTP_ROUTE:
		if match.GetObjectTypes() != nil && match.GetRouteConfiguration() == nil {
			v.r.errorf(mp, "Envoy filter: applyTo for http route class objects cannot have non route configuration match")
		}
	case networking.EnvoyFilter_CLUSTER:
		if match.GetObjectTypes() != nil && match.GetCluster() == nil {
			v.r.errorf(mp, "Envoy filter: applyTo for cluster class objects cannot have non cluster match")
		}
	}
	value := cp.GetPatch().GetValue()
	if value == nil {
		return // a REMOVE
	}
	vp := field(path, "patch.value")
	msg, ok := envoytypes.PatchTarget(cp.GetApplyTo())
	if !ok {
		v.r.errorf(field(path, "applyTo"), "Envoy filter: unknown object type for applyTo %s", cp.GetApplyTo())
		return
	}
	if err := envoytypes.Decode(value, msg, false); err != nil {
		v.r.errorf(vp, "Envoy filter: %v", hint(err))
		return
	}
	if err := envoytypes.Decode(value, envoytypes.Fresh(msg), true); err != nil {
		v.r.warnf(vp, "Envoy filter: %v", err)
	}
	if names := envoytypes.MissingTypedConfig(msg); len(names) > 0 {
		v.r.warnc(CodeDeprecated, vp, "using deprecated types by name without typed_config; %s", strings.Join(names, ", "))
	}
}

// envoyFilterOperation reports the operations Istio's EnvoyPatchAnalyzer
// (pkg/config/analysis/analyzers/envoyfilter) warns about: one applied
// where it is ignored (ADD or REMOVE on ROUTE_CONFIGURATION or
// HTTP_ROUTE, REPLACE outside HTTP_FILTER, NETWORK_FILTER and
// VIRTUAL_HOST), and a relative one (INSERT_BEFORE, INSERT_AFTER, REPLACE,
// REMOVE) in a filter without a priority, whose place depends on the
// order other filters are applied in. Istio says IST0155 rather than
// IST0151 when a filter with a proxyVersion match patches the same name;
// here the proxyVersion of the patch itself is named, which is what makes
// it fragile across an upgrade.
func (v *validator) envoyFilterOperation(path string, cp *networking.EnvoyFilter_EnvoyConfigObjectPatch, priority int32) {
	if cp.GetPatch() == nil || cp.GetMatch().GetContext() == networking.EnvoyFilter_WAYPOINT {
		return
	}
	op, applyTo := cp.GetPatch().GetOperation(), cp.GetApplyTo()
	opPath := field(path, "patch.operation")
	routeLevel := applyTo == networking.EnvoyFilter_ROUTE_CONFIGURATION || applyTo == networking.EnvoyFilter_HTTP_ROUTE
	relative := false
	switch op {
	case networking.EnvoyFilter_Patch_ADD:
		if routeLevel {
			v.r.warnc(CodeEnvoyFilterAddIgnored, opPath, "the ADD operation will be ignored when applyTo is set to ROUTE_CONFIGURATION, or HTTP_ROUTE (applyTo is %s)", applyTo)
		}
	case networking.EnvoyFilter_Patch_REMOVE:
		if routeLevel {
			v.r.warnc(CodeEnvoyFilterRemoveIgnored, opPath, "the REMOVE operation will be ignored when applyTo is set to ROUTE_CONFIGURATION, or HTTP_ROUTE (applyTo is %s)", applyTo)
			return
		}
		relative = true
	case networking.EnvoyFilter_Patch_REPLACE:
		if applyTo != networking.EnvoyFilter_HTTP_FILTER && applyTo != networking.EnvoyFilter_NETWORK_FILTER && applyTo != networking.EnvoyFilter_VIRTUAL_HOST {
			v.r.warnc(CodeEnvoyFilterReplaceIgnored, opPath, "the REPLACE operation is only valid for HTTP_FILTER, NETWORK_FILTER and VIRTUAL_HOST (applyTo is %s): it is ignored", applyTo)
			return
		}
		relative = true
	case networking.EnvoyFilter_Patch_INSERT_BEFORE, networking.EnvoyFilter_Patch_INSERT_AFTER:
		relative = true
	}
	if !relative || priority != 0 {
		return
	}
	also := ""
	if cp.GetMatch().GetProxy().GetProxyVersion() != "" {
		also = " and a proxyVersion match, so it may stop applying during an upgrade"
	}
	v.r.warnc(CodeEnvoyFilterRelativeOperation, opPath, "this EnvoyFilter has no priority and a relative patch operation (%s)%s, which can cause the EnvoyFilter not to be applied: use INSERT_FIRST or ADD, or set the priority", op, also)
}

// hint adds Istio's hint to an unknown type of Envoy's v2 API.
func hint(err error) error {
	if strings.Contains(err.Error(), "referenced type unknown") && strings.Contains(err.Error(), ".v2.") {
		return fmt.Errorf("%w (hint: try using the v3 XDS API)", err)
	}
	return err
}
