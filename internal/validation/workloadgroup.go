package validation

import (
	"regexp"

	networking "istio.io/api/networking/v1alpha3"
)

// probeHeaderName is the form of a probe header's name (Istio's
// validProbeHeaderNameRegex).
var probeHeaderName = regexp.MustCompile(`^[-A-Za-z0-9]+$`)

// workloadGroup checks a WorkloadGroup as Istio's ValidateWorkloadGroup: a
// template (not checked as a WorkloadEntry: its address, for one, comes
// from the workload that registers), valid metadata labels and readiness
// probe.
func (v *validator) workloadGroup() {
	wg := v.obj.Spec.(*networking.WorkloadGroup)
	if wg.GetTemplate() == nil {
		v.r.errorf("spec.template", "template is required")
		return
	}
	v.labels("spec.metadata.labels", wg.GetMetadata().GetLabels())
	v.readinessProbe("spec.probe", wg.GetProbe())
}

// readinessProbe checks a workload's readiness probe as Istio's
// validateReadinessProbe: non-negative periods and thresholds, and one
// method, complete.
func (v *validator) readinessProbe(path string, p *networking.ReadinessProbe) {
	if p == nil {
		return
	}
	for _, f := range []struct {
		name string
		n    int32
	}{
		{"periodSeconds", p.GetPeriodSeconds()},
		{"initialDelaySeconds", p.GetInitialDelaySeconds()},
		{"timeoutSeconds", p.GetTimeoutSeconds()},
		{"successThreshold", p.GetSuccessThreshold()},
		{"failureThreshold", p.GetFailureThreshold()},
	} {
		if f.n < 0 {
			v.r.errorf(field(path, f.name), "must be non-negative")
		}
	}
	switch m := p.GetHealthCheckMethod().(type) {
	case *networking.ReadinessProbe_HttpGet:
		h := m.HttpGet
		if h == nil {
			v.r.errorf(field(path, "httpGet"), "httpGet may not be nil")
			return
		}
		v.port(field(path, "httpGet.port"), h.GetPort())
		if s := h.GetScheme(); s != "" && s != "HTTP" && s != "HTTPS" {
			v.r.errorf(field(path, "httpGet.scheme"), "httpGet.scheme must be one of \"HTTPS\", \"HTTP\"")
		}
		for i, hd := range h.GetHttpHeaders() {
			hp := at(field(path, "httpGet.httpHeaders"), i)
			switch {
			case hd == nil:
				v.r.errorf(hp, "invalid nil header")
			case hd.GetName() == "":
				v.r.errorf(field(hp, "name"), "header name cannot be empty")
			case !probeHeaderName.MatchString(hd.GetName()):
				v.r.errorf(field(hp, "name"), "header name %s is not a valid header name", hd.GetName())
			}
		}
	case *networking.ReadinessProbe_TcpSocket:
		if m.TcpSocket == nil {
			v.r.errorf(field(path, "tcpSocket"), "tcpSocket may not be nil")
			return
		}
		v.port(field(path, "tcpSocket.port"), m.TcpSocket.GetPort())
	case *networking.ReadinessProbe_Exec:
		if m.Exec == nil {
			v.r.errorf(field(path, "exec"), "exec may not be nil")
			return
		}
		if len(m.Exec.GetCommand()) == 0 {
			v.r.errorf(field(path, "exec.command"), "exec.command is required")
		}
	default:
		v.r.errorf(path, "unknown health check method %T", m)
	}
}
