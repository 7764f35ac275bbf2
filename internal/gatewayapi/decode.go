package gatewayapi

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// AddYAML decodes one YAML document of a Gateway API kind Convert reads
// into in. It reports false, and no error, for a document of any other
// group or kind; a document of one that does not decode is an error.
func (in *Input) AddYAML(doc []byte) (bool, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return false, err
	}
	if tm.APIVersion != Group+"/v1" {
		return false, nil
	}
	into := func(v any) error {
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			return fmt.Errorf("%s: %w", tm.Kind, err)
		}
		return nil
	}
	var err error
	switch tm.Kind {
	case KindGatewayClass:
		o := &gw.GatewayClass{}
		err = into(o)
		in.GatewayClasses = append(in.GatewayClasses, o)
	case KindGateway:
		o := &gw.Gateway{}
		err = into(o)
		in.Gateways = append(in.Gateways, o)
	case KindHTTPRoute:
		o := &gw.HTTPRoute{}
		err = into(o)
		in.HTTPRoutes = append(in.HTTPRoutes, o)
	case KindGRPCRoute:
		o := &gw.GRPCRoute{}
		err = into(o)
		in.GRPCRoutes = append(in.GRPCRoutes, o)
	case KindTCPRoute:
		o := &gw.TCPRoute{}
		err = into(o)
		in.TCPRoutes = append(in.TCPRoutes, o)
	case KindTLSRoute:
		o := &gw.TLSRoute{}
		err = into(o)
		in.TLSRoutes = append(in.TLSRoutes, o)
	case KindReferenceGrant:
		o := &gw.ReferenceGrant{}
		err = into(o)
		in.ReferenceGrants = append(in.ReferenceGrants, o)
	case KindBackendTLSPolicy:
		o := &gw.BackendTLSPolicy{}
		err = into(o)
		in.BackendTLSPolicies = append(in.BackendTLSPolicies, o)
	case KindListenerSet:
		o := &gw.ListenerSet{}
		err = into(o)
		in.ListenerSets = append(in.ListenerSets, o)
	default:
		return false, nil
	}
	return err == nil, err
}
