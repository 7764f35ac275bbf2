package validation

import (
	"fmt"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func (v *validator) destinationRule() {
	dr := v.obj.Spec.(*networking.DestinationRule)
	v.host("spec.host", dr.GetHost(), true)
	v.trafficPolicy("spec.trafficPolicy", dr.GetTrafficPolicy(), true)
	seen := map[string]bool{}
	for i, s := range dr.GetSubsets() {
		p := at("spec.subsets", i)
		if msg := dns1123Label(s.GetName()); msg != "" {
			v.r.errorf(field(p, "name"), "subset name %q %s", s.GetName(), msg)
		}
		if seen[s.GetName()] {
			v.r.errorf(field(p, "name"), "subset %q is defined twice", s.GetName())
		}
		seen[s.GetName()] = true
		v.labels(field(p, "labels"), s.GetLabels())
		v.trafficPolicy(field(p, "trafficPolicy"), s.GetTrafficPolicy(), true)
	}
	v.exportTo("spec.exportTo", dr.GetExportTo())
	if ws := dr.GetWorkloadSelector(); ws != nil {
		v.selector("spec.workloadSelector.matchLabels", ws.GetMatchLabels())
	}
}

func (v *validator) trafficPolicy(path string, tp *networking.TrafficPolicy, portLevel bool) {
	if tp == nil {
		return
	}
	v.loadBalancer(field(path, "loadBalancer"), tp.GetLoadBalancer())
	v.connectionPool(field(path, "connectionPool"), tp.GetConnectionPool())
	v.outlierDetection(field(path, "outlierDetection"), tp.GetOutlierDetection())
	v.clientTLS(field(path, "tls"), tp.GetTls())
	if !portLevel && len(tp.GetPortLevelSettings()) > 0 {
		v.r.errorf(field(path, "portLevelSettings"), "port level settings cannot be nested")
	}
	ports := map[uint32]bool{}
	for i, pl := range tp.GetPortLevelSettings() {
		p := at(field(path, "portLevelSettings"), i)
		if pl.GetPort() == nil {
			v.r.errorf(field(p, "port"), "port is required")
		} else {
			n := pl.GetPort().GetNumber()
			v.port(field(p, "port.number"), n)
			if ports[n] {
				v.r.errorf(field(p, "port.number"), "port %d has settings twice", n)
			}
			ports[n] = true
		}
		v.loadBalancer(field(p, "loadBalancer"), pl.GetLoadBalancer())
		v.connectionPool(field(p, "connectionPool"), pl.GetConnectionPool())
		v.outlierDetection(field(p, "outlierDetection"), pl.GetOutlierDetection())
		v.clientTLS(field(p, "tls"), pl.GetTls())
	}
}

func (v *validator) loadBalancer(path string, lb *networking.LoadBalancerSettings) {
	if lb == nil {
		return
	}
	if ch := lb.GetConsistentHash(); ch != nil {
		cp := field(path, "consistentHash")
		switch k := ch.GetHashKey().(type) {
		case nil:
			v.r.errorf(cp, "one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
			v.headerName(field(cp, "httpHeaderName"), k.HttpHeaderName)
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
			if k.HttpCookie.GetName() == "" {
				v.r.errorf(field(cp, "httpCookie.name"), "cookie name is required")
			}
			if k.HttpCookie.GetTtl() != nil {
				v.duration(field(cp, "httpCookie.ttl"), k.HttpCookie.GetTtl(), 0)
			}
		case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
			if k.HttpQueryParameterName == "" {
				v.r.errorf(field(cp, "httpQueryParameterName"), "query parameter name must not be empty")
			}
		default:
		}
		if mg := ch.GetMaglev(); mg != nil && mg.GetTableSize() != 0 && !isPrime(mg.GetTableSize()) {
			v.r.errorf(field(cp, "maglev.tableSize"), "table size %d must be a prime number", mg.GetTableSize())
		}
	}
	if l := lb.GetLocalityLbSetting(); l != nil {
		lp := field(path, "localityLbSetting")
		if len(l.GetDistribute()) > 0 && (len(l.GetFailover()) > 0 || len(l.GetFailoverPriority()) > 0) {
			v.r.errorf(lp, "distribute cannot be combined with failover or failoverPriority")
		}
		for i, d := range l.GetDistribute() {
			dp := at(field(lp, "distribute"), i)
			if d.GetFrom() == "" {
				v.r.errorf(field(dp, "from"), "from is required")
			}
			total := uint32(0)
			for _, w := range d.GetTo() {
				total += w
			}
			if total != 100 {
				v.r.errorf(field(dp, "to"), "weights must add up to 100, not %d", total)
			}
		}
		for i, f := range l.GetFailover() {
			fp := at(field(lp, "failover"), i)
			if f.GetFrom() == "" || f.GetTo() == "" {
				v.r.errorf(fp, "from and to are both required")
			}
			if f.GetFrom() == f.GetTo() && f.GetFrom() != "" {
				v.r.errorf(fp, "from and to must be different regions (%q)", f.GetFrom())
			}
		}
	}
	if lb.GetWarmupDurationSecs() != nil {
		v.duration(field(path, "warmupDurationSecs"), lb.GetWarmupDurationSecs(), minTimeout)
	}
	if w := lb.GetWarmup(); w != nil {
		// Istio's API: duration is required, minimumPercent lies in
		// [0, 100] and aggression is not negative.
		wp := field(path, "warmup")
		if w.GetDuration() == nil {
			v.r.errorf(field(wp, "duration"), "duration is required")
		} else {
			v.duration(field(wp, "duration"), w.GetDuration(), minTimeout)
		}
		if mp := w.GetMinimumPercent(); mp != nil && (mp.GetValue() < 0 || mp.GetValue() > 100) {
			v.r.errorf(field(wp, "minimumPercent"), "%v must be between 0 and 100", mp.GetValue())
		}
		if a := w.GetAggression(); a != nil && a.GetValue() < 0 {
			v.r.errorf(field(wp, "aggression"), "%v must not be negative", a.GetValue())
		}
	}
}

func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for d := uint64(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

func (v *validator) connectionPool(path string, cp *networking.ConnectionPoolSettings) {
	if cp == nil {
		return
	}
	if tcp := cp.GetTcp(); tcp != nil {
		tp := field(path, "tcp")
		if tcp.GetMaxConnections() < 0 {
			v.r.errorf(field(tp, "maxConnections"), "must not be negative")
		}
		if tcp.GetConnectTimeout() != nil {
			v.duration(field(tp, "connectTimeout"), tcp.GetConnectTimeout(), minTimeout)
		}
		if tcp.GetIdleTimeout() != nil {
			v.duration(field(tp, "idleTimeout"), tcp.GetIdleTimeout(), minTimeout)
		}
		if tcp.GetMaxConnectionDuration() != nil {
			v.duration(field(tp, "maxConnectionDuration"), tcp.GetMaxConnectionDuration(), minTimeout)
		}
	}
	if h := cp.GetHttp(); h != nil {
		hp := field(path, "http")
		for name, n := range map[string]int32{
			"http1MaxPendingRequests":  h.GetHttp1MaxPendingRequests(),
			"http2MaxRequests":         h.GetHttp2MaxRequests(),
			"maxRequestsPerConnection": h.GetMaxRequestsPerConnection(),
			"maxRetries":               h.GetMaxRetries(),
			"maxConcurrentStreams":     h.GetMaxConcurrentStreams(),
		} {
			if n < 0 {
				v.r.errorf(field(hp, name), "%d must not be negative", n)
			}
		}
		if h.GetIdleTimeout() != nil {
			v.duration(field(hp, "idleTimeout"), h.GetIdleTimeout(), minTimeout)
		}
	}
}

func (v *validator) outlierDetection(path string, od *networking.OutlierDetection) {
	if od == nil {
		return
	}
	if od.GetMaxEjectionPercent() < 0 || od.GetMaxEjectionPercent() > 100 {
		v.r.errorf(field(path, "maxEjectionPercent"), "%d must be between 0 and 100", od.GetMaxEjectionPercent())
	}
	if od.GetMinHealthPercent() < 0 || od.GetMinHealthPercent() > 100 {
		v.r.errorf(field(path, "minHealthPercent"), "%d must be between 0 and 100", od.GetMinHealthPercent())
	}
	if od.GetInterval() != nil {
		v.duration(field(path, "interval"), od.GetInterval(), minTimeout)
	}
	if od.GetBaseEjectionTime() != nil {
		v.duration(field(path, "baseEjectionTime"), od.GetBaseEjectionTime(), minTimeout)
	}
	if od.GetConsecutiveErrors() != 0 { //nolint:staticcheck // deprecated, still accepted from users: warn about it
		v.r.warnc(CodeDeprecated, field(path, "consecutiveErrors"), "consecutiveErrors is deprecated; use consecutive5xxErrors or consecutiveGatewayErrors")
	}
}

func (v *validator) clientTLS(path string, t *networking.ClientTLSSettings) {
	if t == nil {
		return
	}
	hasFiles := t.GetClientCertificate() != "" || t.GetPrivateKey() != "" || t.GetCaCertificates() != ""
	switch t.GetMode() {
	case networking.ClientTLSSettings_ISTIO_MUTUAL:
		if hasFiles || t.GetCredentialName() != "" {
			v.r.errorf(path, "ISTIO_MUTUAL uses the mesh's certificates: clientCertificate, privateKey, caCertificates and credentialName must not be set")
		}
	case networking.ClientTLSSettings_MUTUAL:
		if t.GetCredentialName() == "" && (t.GetClientCertificate() == "" || t.GetPrivateKey() == "") {
			v.r.errorf(path, "MUTUAL needs credentialName, or both clientCertificate and privateKey")
		}
		if t.GetCredentialName() != "" && hasFiles {
			v.r.errorf(path, "credentialName cannot be combined with certificate files")
		}
	case networking.ClientTLSSettings_DISABLE:
		if hasFiles || t.GetCredentialName() != "" || t.GetSni() != "" {
			v.r.warnf(path, "TLS settings are ignored when mode is DISABLE")
		}
	default:
	}
	v.configMapCredential(field(path, "credentialName"), t.GetCredentialName())
	for i, san := range t.GetSubjectAltNames() {
		if san == "" {
			v.r.errorf(at(field(path, "subjectAltNames"), i), "must not be empty")
		}
	}
	if sni := t.GetSni(); sni != "" && len(sni) > maxHostBytes {
		v.r.errorf(field(path, "sni"), "%s", fmt.Sprintf("SNI is longer than %d characters", maxHostBytes))
	}
}

// configMapCredential checks a "configmap://<namespace>/<name>"
// credentialName as Istio's ValidateTLS does: both parts set, the
// namespace the rule's own. Flotilla serves such a CA only when a Gateway
// API object (a BackendTLSPolicy, a Gateway's frontend validation) names
// the same ConfigMap, which a warning says.
func (v *validator) configMapCredential(path, cn string) {
	rest, ok := strings.CutPrefix(cn, registry.ConfigMapCredentialPrefix)
	if !ok {
		return
	}
	ns, name, _ := strings.Cut(rest, "/")
	switch {
	case ns == "" || name == "":
		v.r.errorf(path, "invalid configmap:// credentialName %q: expected configmap://<namespace>/<name>", cn)
	case ns != v.obj.Meta.Namespace:
		v.r.errorf(path, "invalid configmap:// credentialName: namespace must match the configuration namespace %q", v.obj.Meta.Namespace)
	default:
		v.r.warnf(path, "the CA certificate of ConfigMap %s/%s is served only while a Gateway API object (a BackendTLSPolicy, a Gateway's frontend validation) names it", ns, name)
	}
}
