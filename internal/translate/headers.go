package translate

import (
	"fmt"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
)

// headerClass is the kind of listener whose defaults the proxy headers
// take (Istio's ListenerClass).
type headerClass int

const (
	outboundClass headerClass = iota
	inboundClass
	gatewayClass
)

// proxyHeaders is what the proxy config's proxyHeaders say of the headers
// a connection manager of a class sets, over Istio's defaults (Istio's
// GetProxyHeadersFromProxyConfig): the server header ("istio-envoy"
// inbound and on gateways, Envoy's own outbound; removed: passed
// through), the client certificate details inbound (appended and
// forwarded), request IDs (Envoy's default, generated), Envoy's debug
// headers (added), X-Forwarded-Port (not added), the attempt count
// (sent upstream).
type proxyHeaders struct {
	serverName           string
	serverTransformation hcmv3.HttpConnectionManager_ServerHeaderTransformation
	forwardedClientCert  hcmv3.HttpConnectionManager_ForwardClientCertDetails
	setCurrent           *meshv1alpha1.ProxyConfig_ProxyHeaders_SetCurrentClientCertDetails
	requestID            *wrapperspb.BoolValue
	suppressDebug        bool
	xForwardedPort       bool
	// attemptCount: outbound and gateway virtual hosts send
	// x-envoy-attempt-count upstream (Istio's default).
	attemptCount bool
}

func (g *gen) proxyHeaders(class headerClass) proxyHeaders {
	out := proxyHeaders{
		serverName:           "istio-envoy",
		serverTransformation: hcmv3.HttpConnectionManager_OVERWRITE,
		forwardedClientCert:  hcmv3.HttpConnectionManager_APPEND_FORWARD,
		attemptCount:         true,
	}
	if class == outboundClass {
		out.serverName = ""
	}
	ph := g.p.EffectiveProxyConfig(g.pc.Mesh).GetProxyHeaders()
	if ph == nil {
		return out
	}
	if f := ph.GetForwardedClientCert(); f != meshv1alpha1.ForwardClientCertDetails_UNDEFINED {
		out.forwardedClientCert = hcmv3.HttpConnectionManager_ForwardClientCertDetails(f - 1) // the enums differ by one (UNDEFINED)
	}
	if s := ph.GetServer(); s != nil {
		if s.GetDisabled().GetValue() {
			out.serverName, out.serverTransformation = "", hcmv3.HttpConnectionManager_PASS_THROUGH
		} else if s.GetValue() != "" {
			out.serverName = s.GetValue()
		}
	}
	if ph.GetRequestId().GetDisabled().GetValue() {
		out.requestID = wrapperspb.Bool(false)
	}
	out.suppressDebug = ph.GetEnvoyDebugHeaders().GetDisabled().GetValue()
	out.attemptCount = !ph.GetAttemptCount().GetDisabled().GetValue()
	out.xForwardedPort = ph.GetXForwardedPort().GetEnabled().GetValue()
	out.setCurrent = ph.GetSetCurrentClientCertDetails()
	return out
}

// key names what proxy headers of a class make of a shared connection
// manager.
func (ph proxyHeaders) key() string {
	return fmt.Sprintf("%q|%d|%d|%t|%t|%t|%t|%t", ph.serverName, ph.serverTransformation, ph.forwardedClientCert,
		ph.requestID == nil, ph.requestID.GetValue(), ph.suppressDebug, ph.xForwardedPort, ph.attemptCount)
}
