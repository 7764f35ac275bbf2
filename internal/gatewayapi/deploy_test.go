package gatewayapi_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// TestDeployGolden renders each testdata/deploy/<case>.yaml — a Gateway,
// the ConfigMaps it names (its parametersRef, the class defaults
// labelled gateway.istio.io/defaults-for-class) and, optionally, the
// injection ConfigMap whose values the gateway runs with — and compares
// the objects with <case>.golden.yaml. Each case names, in its first
// comment, the Istio 1.32 behaviour it pins (gatewaycommon's
// DeploymentController and the kube-gateway template).
func TestDeployGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/deploy/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".golden.yaml") {
			continue
		}
		n++
		c := strings.TrimSuffix(f, ".yaml")
		t.Run(filepath.Base(c), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in := decodeDeploy(t, data)
			objs, err := gatewayapi.Deploy(in)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			for _, o := range objs {
				b, err := yaml.Marshal(o)
				if err != nil {
					t.Fatal(err)
				}
				out.WriteString("---\n")
				out.Write(b)
			}
			golden(t, c+".golden.yaml", out.Bytes())
		})
	}
	if n == 0 {
		t.Fatal("no cases in testdata/deploy")
	}
}

func decodeDeploy(t *testing.T, data []byte) gatewayapi.DeployInput {
	t.Helper()
	in := gatewayapi.DeployInput{Controller: gatewayapi.DefaultController, Values: inject.DefaultValues()}
	var cms []*corev1.ConfigMap
	var sets []*gw.ListenerSet
	namespaces := map[string]map[string]string{}
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case gatewayapi.KindGateway:
			in.Gateway = &gw.Gateway{}
			if err := yaml.UnmarshalStrict([]byte(doc), in.Gateway); err != nil {
				t.Fatal(err)
			}
		case "ConfigMap":
			cm := &corev1.ConfigMap{}
			if err := yaml.UnmarshalStrict([]byte(doc), cm); err != nil {
				t.Fatal(err)
			}
			cms = append(cms, cm)
		case gatewayapi.KindListenerSet:
			ls := &gw.ListenerSet{}
			if err := yaml.UnmarshalStrict([]byte(doc), ls); err != nil {
				t.Fatal(err)
			}
			sets = append(sets, ls)
		case "Namespace":
			ns := &corev1.Namespace{}
			if err := yaml.UnmarshalStrict([]byte(doc), ns); err != nil {
				t.Fatal(err)
			}
			namespaces[ns.Name] = ns.Labels
		case "":
		default:
			t.Fatalf("unexpected kind %q", tm.Kind)
		}
	}
	if in.Gateway == nil {
		t.Fatal("no Gateway")
	}
	// The ListenerSets the Gateway allows, as galley picks them.
	in.ListenerSets, _ = gatewayapi.AllowedListenerSets(in.Gateway, gatewayapi.ListenerSetsByParent(sets), func(ns string) (map[string]string, bool) {
		l, ok := namespaces[ns]
		return l, ok
	})
	for _, cm := range cms {
		switch {
		case cm.Name == inject.ConfigMapName:
			c, err := inject.ParseConfig("", cm.Data[inject.ConfigMapTemplateKey], cm.Data[inject.ConfigMapValuesKey])
			if err != nil {
				t.Fatal(err)
			}
			in.Values = c.Values
		case cm.Labels[gatewayapi.LabelClassDefaults] == string(in.Gateway.Spec.GatewayClassName):
			in.ClassDefaults = cm.Data
		case in.Gateway.Spec.Infrastructure != nil && in.Gateway.Spec.Infrastructure.ParametersRef != nil &&
			in.Gateway.Spec.Infrastructure.ParametersRef.Name == cm.Name:
			in.Parameters = cm.Data
		default:
			t.Fatalf("ConfigMap %s is neither the injection values, class defaults nor the parametersRef", cm.Name)
		}
	}
	return in
}

func TestDeployRefusesOverlaysThatChangeIdentityOrAreUnknown(t *testing.T) {
	g := &gw.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", Namespace: "apps", UID: "u1"},
		Spec:       gw.GatewaySpec{GatewayClassName: "flotilla", Listeners: []gw.Listener{{Name: "http", Port: 80, Protocol: gw.HTTPProtocolType}}},
	}
	for name, tc := range map[string]struct {
		params map[string]string
		want   string
	}{
		"an unknown key":            {map[string]string{"daemonSet": "spec: {}"}, `unsupported overlay "daemonSet"`},
		"a renamed Deployment":      {map[string]string{"deployment": "metadata: {name: other}"}, "illegal metadata change"},
		"a moved Service":           {map[string]string{"service": "metadata: {namespace: kube-system}"}, "illegal metadata change"},
		"another owner":             {map[string]string{"serviceAccount": "metadata: {ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: x, uid: u2}]}"}, "illegal metadata change"},
		"a finalizer":               {map[string]string{"deployment": "metadata: {finalizers: [x]}"}, "illegal metadata change"},
		"YAML that does not parse":  {map[string]string{"deployment": "spec: [:"}, `overlay "deployment"`},
		"a field of the wrong type": {map[string]string{"deployment": "spec: {replicas: many}"}, `overlay "deployment"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := gatewayapi.Deploy(gatewayapi.DeployInput{
				Gateway: g, Controller: gatewayapi.DefaultController, Values: inject.DefaultValues(), Parameters: tc.params,
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestDeployableLeavesUserDeployedAndNewerControllersGateways(t *testing.T) {
	hostname, ip := gw.HostnameAddressType, gw.IPAddressType
	for name, tc := range map[string]struct {
		addresses   []gw.GatewaySpecAddress
		annotations map[string]string
		want        bool
	}{
		"no address":                        {want: true},
		"one IP address":                    {addresses: []gw.GatewaySpecAddress{{Type: &ip, Value: "10.0.0.1"}}, want: true},
		"an untyped address":                {addresses: []gw.GatewaySpecAddress{{Value: "10.0.0.1"}}, want: true},
		"a hostname (a Service of its own)": {addresses: []gw.GatewaySpecAddress{{Type: &hostname, Value: "ingress"}}},
		"two addresses":                     {addresses: []gw.GatewaySpecAddress{{Value: "10.0.0.1"}, {Value: "10.0.0.2"}}},
		"Istio's controller version":        {annotations: map[string]string{gatewayapi.AnnotationControllerVersion: "5"}, want: true},
		"an older controller's version":     {annotations: map[string]string{gatewayapi.AnnotationControllerVersion: "1"}, want: true},
		"a newer controller's version":      {annotations: map[string]string{gatewayapi.AnnotationControllerVersion: "6"}},
		"a version that is not a number":    {annotations: map[string]string{gatewayapi.AnnotationControllerVersion: "v2"}},
	} {
		t.Run(name, func(t *testing.T) {
			g := &gw.Gateway{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations}, Spec: gw.GatewaySpec{Addresses: tc.addresses}}
			if got, why := gatewayapi.Deployable(g); got != tc.want || (got == (why != "")) {
				t.Fatalf("Deployable = %v (%q), want %v", got, why, tc.want)
			}
		})
	}
}
