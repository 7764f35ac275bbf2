package validation

import (
	"slices"

	networkingv1beta1 "istio.io/api/networking/v1beta1"
)

// proxyImageTypes are the image types Istio's proxy images come in.
var proxyImageTypes = []string{"default", "debug", "distroless"}

// proxyConfig checks a ProxyConfig as Istio's ValidateProxyConfig does
// (validateWorkloadSelector, validateConcurrency), and warns of an image
// type Istio's images do not come in.
func (v *validator) proxyConfig() {
	pc := v.obj.Spec.(*networkingv1beta1.ProxyConfig)
	if sel := pc.GetSelector(); sel != nil {
		v.optionalSelector("spec.selector.matchLabels", sel.GetMatchLabels())
	}
	if c := pc.GetConcurrency(); c != nil && c.GetValue() < 0 {
		v.r.errorf("spec.concurrency", "concurrency must be greater than or equal to 0")
	}
	if t := pc.GetImage().GetImageType(); t != "" && !slices.Contains(proxyImageTypes, t) {
		v.r.warnf("spec.image.imageType", "image type %q: Istio's proxy images come as %s", t, quoted(proxyImageTypes))
	}
}
