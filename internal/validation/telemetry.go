package validation

import (
	"strings"

	"github.com/google/cel-go/cel"
	telemetry "istio.io/api/telemetry/v1alpha1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

// telemetryTargetKinds are the kinds a Telemetry may target, by group
// ("" is the core group): Istio's allowedTargetRefs.
var telemetryTargetKinds = map[string][]string{
	"":                          {"Service"},
	"networking.istio.io":       {"ServiceEntry"},
	"gateway.networking.k8s.io": {"Gateway", "GatewayClass"},
}

// telemetry checks a Telemetry as Istio's ValidateTelemetry does
// (pkg/config/validation: validateOneOfSelectorType,
// validateWorkloadSelector, validatePolicyTargetReference(s),
// validateTelemetryMetrics, validateTelemetryTracing,
// validateTelemetryAccessLogging).
func (v *validator) telemetry() {
	t := v.obj.Spec.(*telemetry.Telemetry)
	set := 0
	for _, given := range []bool{t.GetSelector() != nil, t.GetTargetRef() != nil, len(t.GetTargetRefs()) > 0} {
		if given {
			set++
		}
	}
	if set > 1 {
		v.r.errorf("spec.selector", "only one of selector, targetRef or targetRefs can be set")
	}
	if sel := t.GetSelector(); sel != nil {
		if len(sel.GetMatchLabels()) == 0 {
			v.r.warnf("spec.selector.matchLabels", "workload selector specified without labels")
		}
		for k, val := range sel.GetMatchLabels() {
			p := field("spec.selector.matchLabels", k)
			if k == "" {
				v.r.errorf(p, "empty key is not supported in selector")
			}
			if strings.Contains(k, "*") || strings.Contains(val, "*") {
				v.r.errorf(p, "wildcard is not supported in selector: %q", k+"="+val)
			}
		}
	}
	if ref := t.GetTargetRef(); ref != nil {
		v.telemetryTarget("spec.targetRef", ref)
	}
	for i, ref := range t.GetTargetRefs() {
		v.telemetryTarget(at("spec.targetRefs", i), ref)
	}
	for i, m := range t.GetMetrics() {
		v.telemetryMetrics(at("spec.metrics", i), m)
	}
	if len(t.GetTracing()) > 1 {
		v.r.warnf("spec.tracing", "multiple tracing is not currently supported")
	}
	for i, tr := range t.GetTracing() {
		v.telemetryTracing(at("spec.tracing", i), tr)
	}
	for i, l := range t.GetAccessLogging() {
		p := at("spec.accessLogging", i)
		if l == nil {
			continue
		}
		if f := l.GetFilter(); f != nil {
			// Istio parses the expression (its istiod build's
			// validateTelemetryFilter): a syntax error is refused, types are
			// not checked.
			env, err := cel.NewEnv()
			if err != nil {
				v.r.errorf(field(p, "filter.expression"), "CEL environment: %v", err)
			} else if _, iss := env.Parse(f.GetExpression()); iss.Err() != nil {
				v.r.errorf(field(p, "filter.expression"), "must be a valid CEL expression, %v", iss.Err())
			}
		}
		v.telemetryProviders(p, l.GetProviders())
	}
}

func (v *validator) telemetryTarget(path string, ref *typev1beta1.PolicyTargetReference) {
	if ref.GetName() == "" {
		v.r.errorf(field(path, "name"), "targetRef name must be set")
	}
	if ref.GetNamespace() != "" {
		v.r.errorf(field(path, "namespace"), "targetRef namespace must not be set; cross namespace referencing is not supported")
	}
	group := ref.GetGroup()
	if group == "core" {
		group = ""
	}
	for _, k := range telemetryTargetKinds[group] {
		if k == ref.GetKind() {
			return
		}
	}
	v.r.errorf(field(path, "kind"), "targetRef must be to a Service, a networking.istio.io ServiceEntry, or a gateway.networking.k8s.io Gateway or GatewayClass, but was %s/%s", ref.GetGroup(), ref.GetKind())
}

func (v *validator) telemetryProviders(path string, providers []*telemetry.ProviderRef) {
	for i, p := range providers {
		if p.GetName() == "" {
			v.r.errorf(field(at(field(path, "providers"), i), "name"), "providers.name may not be empty")
		}
	}
}

func (v *validator) telemetryTracing(path string, tr *telemetry.Tracing) {
	if tr == nil {
		return
	}
	if len(tr.GetProviders()) > 1 {
		v.r.warnf(field(path, "providers"), "multiple providers is not currently supported")
	}
	v.telemetryProviders(path, tr.GetProviders())
	if pct := tr.GetRandomSamplingPercentage(); pct != nil && (pct.GetValue() < 0 || pct.GetValue() > 100) {
		v.r.errorf(field(path, "randomSamplingPercentage"), "randomSamplingPercentage must be in range [0.0, 100.0], not %v", pct.GetValue())
	}
	for name, tag := range tr.GetCustomTags() {
		p := field(field(path, "customTags"), name)
		if name == "" {
			v.r.errorf(p, "tag name may not be empty")
		}
		if tag == nil {
			v.r.errorf(p, "tag %q may not have a nil value", name)
			continue
		}
		switch t := tag.GetType().(type) {
		case *telemetry.Tracing_CustomTag_Literal:
			if t.Literal.GetValue() == "" {
				v.r.errorf(field(p, "literal.value"), "literal tag value may not be empty")
			}
		case *telemetry.Tracing_CustomTag_Header:
			if t.Header.GetName() == "" {
				v.r.errorf(field(p, "header.name"), "header tag name may not be empty")
			}
		case *telemetry.Tracing_CustomTag_Environment:
			if t.Environment.GetName() == "" {
				v.r.errorf(field(p, "environment.name"), "environment tag name may not be empty")
			}
		}
	}
}

func (v *validator) telemetryMetrics(path string, m *telemetry.Metrics) {
	if m == nil {
		return
	}
	v.telemetryProviders(path, m.GetProviders())
	for i, o := range m.GetOverrides() {
		p := at(field(path, "overrides"), i)
		if o == nil {
			v.r.errorf(p, "overrides may not be null")
			continue
		}
		for name, to := range o.GetTagOverrides() {
			tp := field(field(p, "tagOverrides"), name)
			if name == "" {
				v.r.warnf(tp, "tagOverrides.name may not be empty")
			}
			if to == nil {
				v.r.errorf(tp, "tagOverrides may not be null")
				continue
			}
			switch to.GetOperation() {
			case telemetry.MetricsOverrides_TagOverride_UPSERT:
				if to.GetValue() == "" {
					v.r.errorf(field(tp, "value"), "tagOverrides.value must be set when operation is UPSERT")
				}
			case telemetry.MetricsOverrides_TagOverride_REMOVE:
				if to.GetValue() != "" {
					v.r.errorf(field(tp, "value"), "tagOverrides.value may only be set when operation is UPSERT")
				}
			}
		}
		if cm, ok := o.GetMatch().GetMetricMatch().(*telemetry.MetricSelector_CustomMetric); ok && cm.CustomMetric == "" {
			v.r.errorf(field(p, "match.customMetric"), "customMetric may not be empty")
		}
	}
}
